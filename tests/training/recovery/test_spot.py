"""Spot interruption: a fake IMDSv2 metadata server on loopback answers 404, then a notice; a short
CPU training run stops after the step in flight, saves a checkpoint and leaves the PREEMPTED marker,
as for Slurm's SIGUSR1. The watcher asks for a token first and sends it on every request."""

import json
import time

import pytest
import torch

from tests.support.fake_imds import TOKEN, FakeMetadata
from tests.support.heal_run import CPU, final_checkpoint, scripted, tiny_config
from training.errors import UserError
from training.recovery import spot
from training.rundir import RunLayout
from training.trainer import train

torch.set_num_threads(1)


@pytest.fixture
def metadata(monkeypatch):
    with FakeMetadata() as server:
        monkeypatch.setenv("SCDINO_IMDS_ENDPOINT", server.endpoint)
        monkeypatch.setenv("SCDINO_SPOT_POLL_SECONDS", "0.05")
        yield server


def test_a_spot_notice_saves_and_leaves_the_preempted_marker(tmp_path, metadata):
    def interruption_notice():
        """While batch 1 of epoch 2 loads, EC2 posts the notice; the watcher picks it up."""
        metadata.notice = {"action": "terminate", "time": "2026-11-23T16:00:00Z"}
        assert metadata.served_notice.wait(10)
        time.sleep(0.3)  # the SIGUSR1 reaches the main thread's handler

    config = tiny_config(tmp_path, **{"train.spot_watch": "auto"})
    result = train(config, CPU, loader_factory=scripted(4, {(1, 0): interruption_notice}))

    assert result.preempted and result.global_step == 5  # stopped after the step in flight
    layout = RunLayout.from_config(config)
    marker = json.loads(layout.preempted_marker.read_text())
    assert (marker["signal"], marker["step"]) == ("SIGUSR1", 5)
    saved = final_checkpoint(tmp_path)
    assert (saved["epoch"], saved["step_in_epoch"], saved["global_step"]) == (1, 1, 5)
    gets = [r for r in metadata.requests if r[0] == "GET"]
    assert metadata.requests[0] == ("PUT", spot.TOKEN_PATH, str(spot.TOKEN_TTL_S))
    assert len(gets) >= 2 and all(token == TOKEN for _, _, token in gets)  # 404s first, then the notice


def test_off_never_asks_and_other_ranks_of_a_node_do_not_watch(tmp_path, metadata):
    for mode, local_rank_zero in (("off", True), ("on", False)):
        with spot.SpotWatcher(mode, enabled=local_rank_zero):
            time.sleep(0.3)
    assert metadata.requests == []


def test_an_expired_token_is_renewed(metadata):
    client = spot.MetadataClient(metadata.endpoint)
    client._token = "expired"
    assert client.notice() is None
    assert [r[0] for r in metadata.requests] == ["GET", "PUT", "GET"]


def test_auto_watches_only_on_ec2_or_a_configured_endpoint():
    assert spot.resolve("auto", {}, on_ec2=lambda: False) is None
    assert spot.resolve("auto", {}, on_ec2=lambda: True) == spot.DEFAULT_ENDPOINT
    assert spot.resolve("auto", {"SCDINO_IMDS_ENDPOINT": "http://127.0.0.1:9"}, on_ec2=lambda: False) == (
        "http://127.0.0.1:9")
    assert spot.resolve("on", {}, on_ec2=lambda: False) == spot.DEFAULT_ENDPOINT
    assert spot.resolve("off", {"SCDINO_IMDS_ENDPOINT": "http://127.0.0.1:1"}) is None


def test_a_bad_poll_period_is_refused_naming_the_setting():
    with pytest.raises(UserError, match="SCDINO_SPOT_POLL_SECONDS must be a number of seconds > 0, got 'soon'"):
        spot.SpotWatcher("on", enabled=True, environ={"SCDINO_SPOT_POLL_SECONDS": "soon"})
