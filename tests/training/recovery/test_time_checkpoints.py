"""Checkpoints by time: train.checkpoint_every_minutes saves mid-epoch (by rank 0's clock, here a
fake one), a crash after it resumes at the exact step to bit-identical weights, and epoch
checkpoints (numbered, what evaluation reads) are never replaced or pruned by it."""

import json

import pytest
import torch

from tests.support.heal_run import CPU, assert_same_weights, final_checkpoint, scripted, tiny_config
from training import checkpointing
from training.config import ConfigError
from training.rundir import RunLayout
from training.trainer import train

torch.set_num_threads(1)


class FakeClock:
    """Monotonic seconds that pass only when a test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, minutes: float):
        def act() -> None:
            self.now += minutes * 60
        return act


class Crash(RuntimeError):
    pass


def crash() -> None:
    raise Crash("simulated worker crash")


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(checkpointing, "clock", fake)
    return fake


@pytest.mark.slow
def test_crash_after_a_timed_checkpoint_resumes_to_identical_weights(tmp_path, clock):
    train(tiny_config(tmp_path / "ref", **{"train.checkpoint_every_minutes": 0}), CPU,
          loader_factory=scripted(4))

    config = tiny_config(tmp_path / "run", **{"train.checkpoint_every_minutes": 30})
    # 31 minutes pass while batch 1 of epoch 2 is loaded: rank 0 asks for a save after that step.
    with pytest.raises(Crash):
        train(config, CPU, loader_factory=scripted(4, {(1, 1): clock.advance(31), (1, 3): crash}))
    saved = final_checkpoint(tmp_path / "run")
    assert (saved["epoch"], saved["step_in_epoch"], saved["global_step"]) == (1, 2, 6)

    resumed = train(config, CPU, loader_factory=scripted(4))
    assert resumed.global_step == 8 and not resumed.preempted
    assert_same_weights(tmp_path / "run", tmp_path / "ref")
    # step 7 ran twice; the metrics show each step and each epoch once, as uninterrupted (the loss of
    # an epoch resumed part-way averages only the steps after the resume, as after a pre-emption)
    assert metric_lines(tmp_path / "run") == metric_lines(tmp_path / "ref")


def metric_lines(run_dir):
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(line["kind"], line["epoch"], line["step"], line["loss"] if line["kind"] == "step" else None)
            for line in lines]


def test_no_timed_save_before_the_interval_or_when_off(tmp_path, clock):
    for minutes, expected in ((30, (1, 0)), (0, (1, 0))):
        config = tiny_config(tmp_path / f"m{minutes}", **{"train.checkpoint_every_minutes": minutes})
        with pytest.raises(Crash):
            train(config, CPU, loader_factory=scripted(4, {(1, 1): clock.advance(29 if minutes else 600),
                                                           (1, 3): crash}))
        saved = final_checkpoint(tmp_path / f"m{minutes}")
        assert (saved["epoch"], saved["step_in_epoch"]) == expected


def test_timed_saves_replace_only_the_latest_and_keep_every_epoch(tmp_path, clock):
    config = tiny_config(tmp_path, **{"optim.epochs": 3, "train.checkpoint_every_minutes": 1})
    every_batch = {(epoch, index): clock.advance(2) for epoch in range(3) for index in range(3)}
    train(config, CPU, loader_factory=scripted(3, every_batch))
    layout = RunLayout.from_config(config)
    numbered = layout.numbered_checkpoints()
    assert [epoch for epoch, _ in numbered] == [1, 2, 3]  # train.keep_last=0 by default: none pruned
    for epoch, path in numbered:
        saved = torch.load(path, weights_only=False)
        assert (saved["epoch"], saved["step_in_epoch"], saved["global_step"]) == (epoch, 0, 3 * epoch)


def test_mid_epoch_saves_are_logged_once_per_interval(tmp_path, clock, caplog):
    caplog.set_level("INFO", logger="training.trainer")
    config = tiny_config(tmp_path, **{"optim.epochs": 1, "train.checkpoint_every_minutes": 5})
    train(config, CPU, loader_factory=scripted(6, {(0, 1): clock.advance(6), (0, 3): clock.advance(6)}))
    saves = [r.getMessage() for r in caplog.records if "mid-epoch checkpoint" in r.getMessage()]
    assert saves == [
        "saved mid-epoch checkpoint at epoch 1, step 2 of the epoch (train.checkpoint_every_minutes=5)",
        "saved mid-epoch checkpoint at epoch 1, step 4 of the epoch (train.checkpoint_every_minutes=5)",
    ]


@pytest.mark.parametrize("key", ["checkpoint_every_minutes", "hang_timeout_minutes", "keep_last"])
def test_negative_intervals_are_refused_naming_the_setting(tmp_path, key):
    with pytest.raises(ConfigError, match=rf"train.{key} must be >= 0"):
        tiny_config(tmp_path, **{f"train.{key}": -1})


def _two_rank_worker(rank, port, out_dir):
    """Rank 0's clock jumps 31 minutes during the first batch of epoch 2; rank 1's never moves."""
    from tests.support.heal_run import ScriptedCrops
    from training.checkpointing import CheckpointManager
    from training.distributed.groups import DistEnv, cleanup, init_distributed

    torch.set_num_threads(1)
    fake = FakeClock()
    checkpointing.clock = fake
    saves = []
    original_save = CheckpointManager.save

    def save(self, state, ctx, **kwargs):
        saves.append([state.epoch, state.step_in_epoch])
        return original_save(self, state, ctx, **kwargs)

    CheckpointManager.save = save
    ctx = init_distributed(DistEnv(rank=rank, world_size=2, master_addr="127.0.0.1", master_port=port,
                                   launcher="slurm"), timeout_min=1)
    actions = {(1, 0): fake.advance(31)} if rank == 0 else {}

    def loaders(config, ctx):
        loader = ScriptedCrops(config, batches=3, actions=actions)
        return loader, loader

    try:
        train(tiny_config(out_dir, **{"optim.batch_size_per_gpu": 2}), ctx, loader_factory=loaders)
        with open(f"{out_dir}/saves_{rank}.json", "w") as handle:
            json.dump(saves, handle)
    finally:
        cleanup(ctx)


@pytest.mark.slow
def test_all_ranks_save_at_the_step_rank_zeros_clock_chooses(tmp_path):
    import torch.multiprocessing as mp

    from tests.training.distributed.test_distributed import free_port

    mp.spawn(_two_rank_worker, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    rank0, rank1 = (json.loads((tmp_path / f"saves_{rank}.json").read_text()) for rank in (0, 1))
    assert rank0 == rank1 == [[1, 0], [1, 1], [2, 0]]  # epoch 1's end, mid-epoch 2 after its first step, the end
