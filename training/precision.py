"""Numeric precision of a training step: fp32, bf16 autocast, or fp16 autocast with a gradient scaler.

Shared by DINO pretraining, fine-tuning and the step benchmark; `train.precision` chooses it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from training.config import ConfigError


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


def resolve_precision(requested: str, device: torch.device) -> Precision:
    """auto: bf16 on GPUs that have it, fp16 on those that do not (T4), fp32 on CPU."""
    if device.type != "cuda":
        if requested == "fp16":
            raise ConfigError("train.precision=fp16 needs a CUDA GPU; use auto, fp32 or bf16 on CPU")
        return Precision("bf16" if requested == "bf16" else "fp32", device.type)
    has_bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
    if requested == "auto":
        return Precision("bf16" if has_bf16 else "fp16", "cuda")
    if requested == "bf16" and not has_bf16:
        name = torch.cuda.get_device_name(device)
        raise ConfigError(f"train.precision=bf16: {name} has no bf16; use auto or fp16")
    return Precision(requested, "cuda")
