"""Suite-wide settings: small thread pools on the 2-core CI machine, and the GPU marker."""

import os
import shutil
import tempfile

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")


def pytest_report_header(config):
    """The free space where the temporary directories go: a full disk shows up as errors in setup."""
    where = tempfile.gettempdir()
    free = shutil.disk_usage(where).free / 2**30
    return f"free disk in {where}: {free:.1f} GiB (the suite took at most 9.2 GiB at its peak, measured 2026-11-25)"


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` run only where CUDA is present; elsewhere they say why they did not."""
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none on this machine)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)
