"""train.precision on CPU: the native-bf16 probe against the kernel's own CPU flags; auto is bf16
only where the CPU has it natively, and bf16 asked for on a CPU without it runs with a warning that
fp32 is faster there (torch's probes stand in for the other kind of CPU: this machine's hardware
cannot be swapped)."""

import logging
from pathlib import Path

import pytest
import torch

from training.config import ConfigError
from training.precision import cpu_has_native_bf16, resolve_precision

CPUINFO = Path("/proc/cpuinfo")


@pytest.mark.skipif(not CPUINFO.is_file(), reason="needs Linux's /proc/cpuinfo to read the CPU's flags")
def test_the_probe_agrees_with_the_kernels_cpu_flags():
    flags = set()
    for line in CPUINFO.read_text().splitlines():
        if line.startswith("flags"):
            flags |= set(line.split(":", 1)[1].split())
    assert cpu_has_native_bf16() == bool({"avx512_bf16", "amx_tile"} & flags)


def test_bf16_without_native_support_warns_and_still_runs(monkeypatch, caplog):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    with caplog.at_level(logging.WARNING, logger="training.precision"):
        assert resolve_precision("bf16", torch.device("cpu")).name == "bf16"
    assert "train.precision=fp32" in caplog.text
    caplog.clear()
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    with caplog.at_level(logging.WARNING, logger="training.precision"):
        assert resolve_precision("bf16", torch.device("cpu")).name == "bf16"
    assert caplog.text == ""


@pytest.mark.parametrize("native", [False, True])
def test_auto_on_cpu_is_bf16_only_where_it_is_native(monkeypatch, caplog, native):
    # The probes stand in for the other CPU: on one without AVX512-BF16 or AMX, emulated bf16 took
    # 19.1 s a step of the screen's model against fp32's 1.56 s (docs/performance.md).
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    with caplog.at_level(logging.WARNING, logger="training.precision"):
        assert resolve_precision("auto", torch.device("cpu")).name == ("bf16" if native else "fp32")
    assert caplog.text == ""


def test_fp16_is_refused_on_cpu():
    with pytest.raises(ConfigError, match="fp16 needs a CUDA GPU"):
        resolve_precision("fp16", torch.device("cpu"))
