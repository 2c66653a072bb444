"""Numeric precision of a training step: fp32, bf16 autocast, or fp16 autocast with a gradient scaler.

Shared by DINO pretraining, fine-tuning and the step benchmark; `train.precision` chooses it.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import torch

from training.config import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Precision:
    name: str
    """fp32, bf16 or fp16 (fp16 uses a gradient scaler)."""
    device_type: str

    @property
    def dtype(self) -> torch.dtype:
        return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[self.name]

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.name == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX512-BF16 or AMX), where bf16 autocast is
    faster than fp32; elsewhere oneDNN converts to fp32 and bf16 only costs time."""
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in probes)


def resolve_precision(requested: str, device: torch.device) -> Precision:
    """auto: bf16 on GPUs that have it, fp16 on those that do not (T4); on CPU bf16 where it is native
    (AVX512-BF16 or AMX), else fp32, so that one config is fast on either CPU. bf16 asked for on a CPU
    without native bf16 runs, with a warning that fp32 is faster there."""
    if device.type != "cuda":
        if requested == "fp16":
            raise ConfigError("train.precision=fp16 needs a CUDA GPU; use auto, fp32 or bf16 on CPU")
        native = device.type == "cpu" and cpu_has_native_bf16()
        if requested == "auto":
            return Precision("bf16" if native else "fp32", device.type)
        if requested == "bf16" and device.type == "cpu" and not native:
            log.warning("train.precision=bf16: this CPU has no native bf16 (AVX512-BF16 or AMX), so bf16 is "
                        "emulated and slower than fp32 here; set train.precision=fp32 (or auto) for speed")
        return Precision("bf16" if requested == "bf16" else "fp32", device.type)
    has_bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
    if requested == "auto":
        return Precision("bf16" if has_bf16 else "fp16", "cuda")
    if requested == "bf16" and not has_bf16:
        name = torch.cuda.get_device_name(device)
        raise ConfigError(f"train.precision=bf16: {name} has no bf16; use auto or fp16")
    return Precision(requested, "cuda")
