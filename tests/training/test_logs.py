"""Readable logs: rank 0 logs INFO; other ranks only WARNING and up, each line naming the rank and
host; a bad LOGLEVEL is one line naming the setting; the training progress bar is drawn on rank 0 only."""

import logging
import socket

import pytest

from training.cli import main
from training.distributed.groups import ranks_log
from training.errors import UserError
from training.logs import configure_logging
from training.metrics import progress


@pytest.fixture
def configure():
    """configure_logging on an unconfigured root logger (pytest's capture handlers, which it adds
    around each test call, are taken off first and put back afterwards)."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level

    def run(env):
        for handler in root.handlers[:]:
            if handler not in saved[0]:
                handler.close()
        root.handlers.clear()
        configure_logging(env)
        return root

    yield run
    root.handlers[:], root.level = saved


def emit_all(name="training.trainer"):
    log = logging.getLogger(name)
    log.info("epoch 1/2: loss 1.0")
    log.warning("received SIGUSR1")


@pytest.mark.parametrize("env", [{"RANK": "0"}, {"SLURM_PROCID": "0"}, {}])
def test_rank_zero_logs_info_without_a_rank_tag(configure, capsys, env):
    configure(env)
    emit_all()
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" ", 1)[1] for line in lines] == [
        "INFO training.trainer: epoch 1/2: loss 1.0", "WARNING training.trainer: received SIGUSR1"]


@pytest.mark.parametrize("env", [{"RANK": "3", "SLURM_PROCID": "0"}, {"SLURM_PROCID": "2"}])
def test_other_ranks_log_warnings_only_with_rank_and_host(configure, capsys, env):
    configure({**env, "LOGLEVEL": "INFO"})
    emit_all()
    rank = env.get("RANK", env.get("SLURM_PROCID"))
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" ", 1)[1] for line in lines] == [
        f"WARNING [rank {rank} {socket.gethostname()}] training.trainer: received SIGUSR1"]


def test_debug_on_rank_zero_and_a_bad_level_is_one_line(configure):
    assert configure({"LOGLEVEL": "debug"}).level == logging.DEBUG
    assert configure({"LOGLEVEL": "DEBUG", "RANK": "1"}).level == logging.WARNING
    with pytest.raises(UserError, match="LOGLEVEL must be one of DEBUG, INFO, WARNING, ERROR, got 'LOUD'"):
        configure({"LOGLEVEL": "LOUD"})


def test_the_cli_refuses_a_bad_level(capsys, monkeypatch):
    monkeypatch.setenv("LOGLEVEL", "LOUD")
    assert main(["paths", "root"]) == 2
    assert capsys.readouterr().err.strip() == "error: LOGLEVEL must be one of DEBUG, INFO, WARNING, ERROR, got 'LOUD'"


def test_progress_bar_only_on_rank_zero(capsys):
    for enabled in (True, False):
        bar = progress(3, f"epoch enabled={enabled}", enabled=enabled)
        bar.update(3)
        bar.close()
    err = capsys.readouterr().err
    assert "epoch enabled=True" in err and "epoch enabled=False" not in err


def test_every_rank_logs_that_it_joined(configure, capsys):
    configure({"RANK": "1"})
    ranks_log.info("rank 1/2 joined (gloo, cpu, launcher torchrun)")  # the logger init_distributed uses
    logging.getLogger("training.trainer").info("epoch 1/2: loss 1.0")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "rank 1/2 joined (gloo" in lines[0] and f"[rank 1 {socket.gethostname()}]" in lines[0]
