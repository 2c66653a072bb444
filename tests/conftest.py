"""Suite-wide settings: small thread pools on the 2-core CI machine, which of make test's two workers runs
what, the GPU marker, moto's server, and ParallelCluster's own limits (tests/infra and tests/bootstrap both
hold our settings to them)."""

import os
import shutil
import tempfile

import pytest

from tests.support.cdk_synth import run_pcluster

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")


def pytest_report_header(config):
    """The free space where the temporary directories go: a full disk shows up as errors in setup."""
    where = tempfile.gettempdir()
    free = shutil.disk_usage(where).free / 2**30
    return f"free disk in {where}: {free:.1f} GiB (the suite took at most 9.2 GiB at its peak, measured 2026-11-25)"


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the xdist_group marks set here
def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput"):
        group_for_workers(items)
    skip_gpu_tests_without_cuda(items)


def group_for_workers(items):
    """Under pytest-xdist (make test: `-n 2 --dist loadgroup --no-loadscope-reorder`), which worker runs what.

    Every test that uses the local Slurm cluster runs in one group, on one worker, in file order: they share
    its two nodes and the session's pipeline chain, and some stop a node, reconfigure the controller or
    restart the cluster in another shape. That group goes first, being the longest (22 min alone on the loaded
    2-core machine, its own process mostly waiting on jobs); the other worker meanwhile takes the other tests
    a file at a time, so that a module's fixtures are built once. Most tests keep torch to one thread, so
    one after another they left the second core idle."""
    slurm, others = [], []
    for item in items:
        uses_slurm = item.get_closest_marker("slurm") is not None or "cluster" in item.fixturenames
        item.add_marker(pytest.mark.xdist_group("slurm" if uses_slurm else item.nodeid.split("::")[0]))
        (slurm if uses_slurm else others).append(item)
    items[:] = slurm + others


def skip_gpu_tests_without_cuda(items):
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


@pytest.fixture(scope="module")
def moto_endpoint():
    """moto's server on loopback, one a test module: a real HTTP endpoint that boto3, the code under test and
    its subprocesses reach by URL (AWS_ENDPOINT_URL or --endpoint-url), as they would reach AWS; each module
    starts with an empty account."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture(scope="session")
def pcluster_constants() -> dict:
    """Limits ParallelCluster 3.16 itself enforces, read from its installed code (not copied here)."""
    names = ["NODE_BOOTSTRAP_TIMEOUT", "PCLUSTER_NAME_MAX_LENGTH", "PCLUSTER_NAME_MAX_LENGTH_SLURM_ACCOUNTING",
             "SUPPORTED_OSES", "PRIVATE_OSES"]
    found = run_pcluster({"constants": names, "version": True})
    return {**found["constants"], "installed_version": found["version"]}
