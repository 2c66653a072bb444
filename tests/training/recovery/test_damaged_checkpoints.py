"""A damaged checkpoint under the self-healing launcher: with an intact one before it, it is no failure
(the run goes on from there and the closing line says where); under DDP and FSDP every rank resumes
from the checkpoint rank 0 chose, and only rank 0 moves files."""

import json

import pytest
import torch

from tests.support.heal_run import CPU, scripted, tiny_config
from training.checkpointing import CheckpointManager
from training.recovery import policy
from training.recovery.failures import read_records
from training.rundir import RunLayout
from training.trainer import train

torch.set_num_threads(1)

pytestmark = pytest.mark.slow


class Crash(RuntimeError):
    pass


def crash() -> None:
    raise Crash("simulated worker crash")


def garble(path) -> None:
    """16 bytes in the middle of the file overwritten in place (its hard links see them too)."""
    with open(path, "r+b") as handle:
        handle.seek(path.stat().st_size // 2)
        handle.write(b"\xff" * 16)


def test_a_restart_past_a_damaged_checkpoint_resumes_from_the_one_before_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    for name in ("SLURM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    config = tiny_config(tmp_path, **{"optim.epochs": 3, "train.checkpoint_every_minutes": 0})
    layout = RunLayout.from_config(config)
    with pytest.raises(Crash):
        train(config, CPU, loader_factory=scripted(2, {(2, 1): crash}))
    garble(layout.latest_checkpoint)  # epoch 2's, and checkpoint_0002.pth with it
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert train(config, CPU, loader_factory=scripted(2)).global_step == 6

    failure, resume = read_records(layout.failure_log)  # the damage added no failure
    assert (failure["class"], resume["checkpoint"], resume["epoch"]) == ("transient", str(layout.epoch_checkpoint(1)), 1)
    assert not layout.failure_marker.exists()
    [line] = policy.summary(read_records(layout.failure_log), "4242", 1)
    assert line.endswith(f"-> resumed from {layout.epoch_checkpoint(1)} at epoch 2, step 0 of the epoch "
                         "(torchrun restart 1, job attempt 0)")
    assert policy.decide(0, False, 0, 1) == "done"
    assert sorted(p.name for p in layout.checkpoints.glob("*.damaged")) == ["checkpoint.pth.damaged",
                                                                           "checkpoint_0002.pth.damaged"]


def _two_rank_worker(rank, port, out_dir, parallel):
    """Two ranks train two epochs; rank 0 damages checkpoint.pth (epoch 2's, and checkpoint_0002.pth
    with it); the same two ranks train again. Each notes which checkpoint its manager resumed from
    and the sums of its weights after each run."""
    import torch.distributed as dist

    from tests.support.heal_run import ScriptedCrops
    from training.distributed.groups import DistEnv, cleanup, init_distributed
    from training.distributed.parallel import model_state

    torch.set_num_threads(1)
    resumed = []
    original = CheckpointManager.resume

    def resume(self, state, ctx):
        original(self, state, ctx)
        resumed.append(str(self.resumed_from))

    CheckpointManager.resume = resume
    ctx = init_distributed(DistEnv(rank=rank, world_size=2, master_addr="127.0.0.1", master_port=port,
                                   launcher="slurm"), timeout_min=1)
    config = tiny_config(out_dir, **{"optim.batch_size_per_gpu": 2, "train.parallel": parallel})

    def loaders(config, ctx):
        loader = ScriptedCrops(config, batches=2, actions={})
        return loader, loader

    def weights(result):
        return [float(sum(v.double().sum() for v in model_state(result.state.models, which).values()))
                for which in ("student", "teacher")]

    try:
        first = weights(train(config, ctx, loader_factory=loaders))
        dist.barrier()
        if rank == 0:
            garble(RunLayout.from_config(config).latest_checkpoint)
        dist.barrier()
        again = train(config, ctx, loader_factory=loaders)
        with open(f"{out_dir}/rank_{rank}.json", "w") as handle:
            json.dump({"resumed_from": resumed, "global_step": again.global_step, "first": first,
                       "again": weights(again)}, handle)
    finally:
        cleanup(ctx)


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_every_rank_resumes_from_the_checkpoint_rank_zero_chose(tmp_path, parallel):
    """Both ranks resume from checkpoint_0001.pth, train epoch 2 again and end where the first run
    ended, bit for bit (under FSDP too, where epoch 1's checkpoint lacks the frozen last layer's
    optimizer state)."""
    import torch.multiprocessing as mp

    from tests.training.distributed.test_distributed import free_port

    mp.spawn(_two_rank_worker, args=(free_port(), str(tmp_path), parallel), nprocs=2, join=True)
    layout = RunLayout(tmp_path)
    ranks = [json.loads((tmp_path / f"rank_{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["resumed_from"] for r in ranks] == [["None", str(layout.epoch_checkpoint(1))]] * 2
    assert [r["global_step"] for r in ranks] == [4, 4]
    assert [r["again"] for r in ranks] == [r["first"] for r in ranks]
    if parallel == "ddp":
        assert ranks[0]["again"] == ranks[1]["again"]  # replicas that started from the same state
    assert sorted(p.name for p in layout.checkpoints.glob("*.damaged")) == ["checkpoint.pth.damaged",
                                                                           "checkpoint_0002.pth.damaged"]
