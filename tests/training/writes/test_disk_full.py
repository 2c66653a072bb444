"""A full disk is named, on a real small file system (tmpfs): before pretraining starts when the
checkpoints cannot fit, and at a save that runs out of room mid-run (torch's own write error, as
seen on the local cluster), as a deterministic failure that keeps the last checkpoint.

Mounting needs root, as the Slurm tests' network namespaces do; CI runs as root."""

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.tiny import run_cli
from training.distributed.groups import DistContext, DistEnv
from training.recovery.failures import read_records
from training.rundir import RunLayout
from training.trainer import default_loader_factory, train
from training.writes.diskspace import DiskFullError, is_no_space, no_space_error

CPU = DistContext(env=DistEnv(), device=__import__("torch").device("cpu"), backend=None)


@pytest.fixture
def small_disk(tmp_path):
    """Mount a tmpfs of the size asked for at tmp_path/disk-<size>; unmounted at the end."""
    mounted = []

    def mount(size_mb: int) -> Path:
        point = tmp_path / f"disk-{size_mb}"
        point.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(point)],
                              capture_output=True, text=True)
        assert done.returncode == 0, f"mounting a tmpfs needs root: {done.stderr}"
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=False)


def prepared_on(make_config, disk: Path, **overrides):
    config = make_config({"run.output_dir": str(disk / "run"), **overrides})
    assert run_cli(config, "prepare") == 0 and run_cli(config, "mean-std") == 0
    return config


def test_pretraining_that_cannot_fit_its_checkpoints_stops_before_its_first_step(make_config, small_disk, capsys):
    disk = small_disk(8)  # the packed data (2.4 MB) fits, a checkpoint (~130 MB) does not
    config = prepared_on(make_config, disk)
    assert run_cli(config, "pretrain") == 2
    err = capsys.readouterr().err
    line = next(line for line in err.splitlines() if line.startswith("error: "))
    assert re.fullmatch(rf"error: no space left on {re.escape(str(disk))} \(tmpfs\) for the checkpoints "
                        r"\(.+/checkpoints\): it needs about \d+\.\d\d (MB|GB) and \d+\.\d\d MB are free; free space "
                        r"there, or point the run at a file system with room \(run.output_dir, data.packed_dir\)", line)
    layout = RunLayout.from_config(config)
    [record] = read_records(layout.failure_log)
    assert record["class"] == "deterministic" and record["step"] is None
    assert not layout.latest_checkpoint.exists()


def test_a_save_that_runs_out_of_room_is_named_and_keeps_the_last_checkpoint(make_config, small_disk):
    disk = small_disk(700)
    config = prepared_on(make_config, disk, **{"optim.epochs": 3})
    layout = RunLayout.from_config(config)

    def filling_loader(config, ctx):
        loader, sampler = default_loader_factory(config, ctx)

        class FillsTheDiskInEpochTwo:
            def __len__(self):
                return len(loader)

            def __iter__(self):
                for index, batch in enumerate(loader):
                    if sampler.epoch == 1 and index == 0:  # after the first save: leave 5 MB
                        free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
                        with open(disk / "filler", "wb") as handle:
                            handle.truncate(0)
                            handle.write(b"\0" * (free - 5 * 2**20))
                    yield batch

        return FillsTheDiskInEpochTwo(), sampler

    with pytest.raises(DiskFullError) as error:
        train(config, CPU, loader_factory=filling_loader)
    message = str(error.value)
    assert message.startswith(f"no space left on {disk} (tmpfs) for the checkpoint ({layout.latest_checkpoint})")
    assert "the write failed with: RuntimeError: [enforce fail at inline_container.cc" in message
    assert f"nothing is lost: {layout.previous_checkpoint} is the last one saved" in message
    saved = __import__("torch").load(layout.latest_checkpoint, weights_only=False)
    assert saved["epoch"] == 1  # the first epoch's save, intact
    assert re.search(r"and 5\.\d\d MB are free", message)  # once the failed write's space is released
    assert not [p for p in layout.checkpoints.iterdir() if p.name.endswith(".tmp")]
    records = [r for r in read_records(layout.failure_log) if r["kind"] == "failure"]
    assert [r["class"] for r in records] == ["deterministic"] and layout.failure_marker.exists()  # not retried
    (disk / "filler").unlink()  # room again: the next attempt resumes from the intact checkpoint
    assert train(config, CPU).epochs_completed == 3


def test_only_a_lack_of_room_is_called_one(tmp_path):
    other = RuntimeError("CUDA error: an illegal memory access was encountered")
    assert not is_no_space(other) and no_space_error(tmp_path / "x.pth", 10, other, "the checkpoint") is None
    assert is_no_space(OSError(28, "No space left on device"))
    assert is_no_space(RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"))
    huge = no_space_error(tmp_path / "x.pth", 10**18, other, "the checkpoint")  # more than any disk has
    assert isinstance(huge, DiskFullError) and "it needs about 1000000000.00 GB" in str(huge)
