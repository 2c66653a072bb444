"""Launch environments, and two gloo ranks that stay in sync and match one rank on the same global batch."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.support.tiny import tiny_config
from training.config import Config
from training.distributed.groups import DistContext, DistEnv, cleanup, detect_env, init_distributed
from training.distributed.parallel import model_state
from training.trainer import train

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.slow

torch.set_num_threads(1)

GLOBAL_BATCH, STEPS = 4, 3


def test_torchrun_environment():
    env = detect_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "node1",
                      "MASTER_PORT": "29501", "SLURM_PROCID": "0"})
    assert env == DistEnv(rank=3, world_size=4, local_rank=1, master_addr="node1", master_port=29501,
                          launcher="torchrun")


def test_slurm_ranks_without_torchrun_take_the_first_node_as_master():
    seen = []

    def hostnames(nodelist):
        seen.append(nodelist)
        return ["node1", "node2"]

    env = detect_env({"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_LOCALID": "0",
                      "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_ID": "1234"}, hostnames)
    assert seen == ["node[1-2]"]
    assert (env.rank, env.world_size, env.master_addr, env.master_port, env.launcher) == (
        1, 2, "node1", 21234, "slurm")


def test_batch_shell_and_plain_runs_are_single_process():
    assert detect_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "node[1-2]"}) == DistEnv()
    assert detect_env({}) == DistEnv()
    ctx = init_distributed(DistEnv())
    assert not ctx.distributed and ctx.world_size == 1


class FixedGlobalBatches:
    """The same global batches for any world size; each rank takes its contiguous slice."""

    def __init__(self, config, rank, world_size):
        generator = torch.Generator().manual_seed(7)
        dino, chans = config.dino, config.data.in_chans
        sizes = [dino.global_crop_size] * 2 + [dino.local_crop_size] * dino.local_crops_number
        self.batches = [[torch.randn(GLOBAL_BATCH, chans, s, s, generator=generator) for s in sizes]
                        for _ in range(STEPS)]
        per_rank = GLOBAL_BATCH // world_size
        self.slice = slice(rank * per_rank, (rank + 1) * per_rank)

    def set_epoch(self, epoch):
        pass

    def __len__(self):
        return STEPS

    def __iter__(self):
        for crops in self.batches:
            local = [c[self.slice] for c in crops]
            yield local, torch.zeros(len(local[0]))


def run_config(out_dir, world_size, parallel="ddp") -> Config:
    return tiny_config({
        "run.output_dir": str(out_dir), "data.channels": "01",
        "model.out_dim": 128, "model.drop_path_rate": 0.0, "dino.global_crop_size": 24,
        "optim.batch_size_per_gpu": GLOBAL_BATCH // world_size, "optim.epochs": 1, "optim.warmup_epochs": 0,
        "optim.lr": 0.05, "optim.freeze_last_layer": 0, "train.log_every": 1, "train.tensorboard": False,
        "train.parallel": parallel,
    })


def fixed_loader(config, ctx):
    loader = FixedGlobalBatches(config, ctx.rank, ctx.world_size)
    return loader, loader


def _worker(rank, world_size, port, out_dir, parallel):
    env = DistEnv(rank=rank, world_size=world_size, master_addr="127.0.0.1", master_port=port, launcher="slurm")
    ctx = init_distributed(env, timeout_min=2)
    try:
        fingerprint = _train_fingerprint(out_dir, world_size, parallel, ctx)
        gathered = [None] * world_size
        dist.all_gather_object(gathered, fingerprint)
        if rank == 0:
            with open(f"{out_dir}/fingerprints.json", "w") as handle:
                json.dump(gathered, handle)
    finally:
        cleanup(ctx)
    with open(f"{out_dir}/gloo_threads_{rank}.json", "w") as handle:
        json.dump(gloo_threads(), handle)


def _train_fingerprint(out_dir, world_size, parallel, ctx):
    """Train as the pretrain step does, keeping only sums of the weights: the models are gone after."""
    result = train(run_config(out_dir, world_size, parallel), ctx, loader_factory=fixed_loader)
    return [float(sum(v.double().sum() for v in model_state(result.state.models, which).values()))
            for which in ("student", "teacher")]


def gloo_threads() -> int:
    """Live gloo worker threads of this process (named pt_gloo_runloop by torch)."""
    tasks = Path("/proc/self/task")
    return sum((task / "comm").read_text().startswith("pt_gloo") for task in tasks.iterdir())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def losses(run_dir):
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [line["loss"] for line in lines if line["kind"] == "step"]


def step_sizes(run_dir) -> tuple[float, float]:
    """The largest learning rate of the run and the teacher's EMA weight on the student, 1 - momentum."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if line["kind"] == "step"]
    return max(line["lr"] for line in steps), 1.0 - min(line["momentum"] for line in steps)


STRAY_FRACTION = 1e-3
"""At most this fraction of a model's elements may end more than STRAY_STEP of one step apart."""
STRAY_STEP = 0.05


def trained_alike(one: dict, two: dict, step: float, bound: float) -> list[str]:
    """What is wrong when two trainings on the same global batches are compared: none when they
    agree up to float rounding.

    The tolerance follows from AdamW, not from one CPU's rounding: each step moves an element by at
    most ~1.004 x lr over its first three steps (the bias-corrected m / sqrt(v) is a weighted mean of
    gradients over their weighted root-mean-square), so rounding noise that flips the sign of a
    near-zero gradient moves that element by up to two steps: no element may stray beyond `bound`.
    Such gradients are rare: at most STRAY_FRACTION of the elements may end more than STRAY_STEP x
    `step` apart. A rank that skips the averaging trains on half the batch, and most elements stray.
    """
    diffs = torch.cat([(two[key].double() - value.double()).abs().flatten() for key, value in one.items()])
    stray = float((diffs > STRAY_STEP * step).double().mean())
    problems = []
    if stray > STRAY_FRACTION:
        problems.append(f"{stray:.2%} of the elements differ by more than {STRAY_STEP:.0%} of a step ({step:.3g})")
    if float(diffs.max()) > bound:
        problems.append(f"an element differs by {float(diffs.max()):.3g}, beyond the bound {bound:.3g}")
    return problems


def assert_two_ranks_match_one(one_dir, two_dir) -> None:
    """Two ranks trained as one rank did: losses, student and teacher weights, and the loss centre."""
    assert losses(two_dir) == pytest.approx(losses(one_dir), rel=1e-3)
    lr, ema = step_sizes(one_dir)
    one = torch.load(one_dir / "checkpoints/checkpoint.pth", weights_only=False)
    two = torch.load(two_dir / "checkpoints/checkpoint.pth", weights_only=False)
    bound = 2 * STEPS * lr * 1.05  # a sign flip at every step, AdamW's 1.004 and weight decay with margin
    assert trained_alike(one["student"], two["student"], lr, bound) == []
    # the teacher moves by (1 - momentum) x the student's distance from it, at most STEPS steps
    assert trained_alike(one["teacher"], two["teacher"], ema * lr, ema * STEPS * bound) == []
    center = one["dino_loss"]["center"]
    assert torch.allclose(two["dino_loss"]["center"], center, atol=1e-4 * float(center.abs().max()))


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_gloo_ranks_match_one_rank_on_the_same_global_batch(tmp_path, parallel):
    single = DistContext(env=DistEnv(), device=torch.device("cpu"), backend=None)
    train(run_config(tmp_path / "one", 1), single, loader_factory=fixed_loader)
    mp.spawn(_worker, args=(2, free_port(), str(tmp_path / "two"), parallel), nprocs=2, join=True)

    rank0, rank1 = json.loads((tmp_path / "two/fingerprints.json").read_text())
    if parallel == "ddp":
        assert rank0 == rank1  # bit-identical replicas of the student and the teacher
    else:
        assert rank0 != [0.0, 0.0] and rank1 == [0.0, 0.0]  # FSDP gathers the full state on rank 0 only
    assert_two_ranks_match_one(tmp_path / "one", tmp_path / "two")
    two = torch.load(tmp_path / "two/checkpoints/checkpoint.pth", weights_only=False)
    assert len(two["rng"]) == 2
    if parallel == "ddp":
        # The group was freed at cleanup and its threads joined: none is left to abort the exit.
        # (Under FSDP2, DTensor's caches keep the group: only the clean exit of both ranks is checked.)
        threads = [json.loads((tmp_path / f"two/gloo_threads_{rank}.json").read_text()) for rank in (0, 1)]
        assert threads == [0, 0]


def _keep_local_gradients(state, bucket):
    """A DDP communication hook that returns the rank's own gradients: no all-reduce."""
    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def _worker_without_allreduce(rank, world_size, port, out_dir, parallel):
    import training.distributed.parallel

    wrap = training.distributed.parallel.DistributedDataParallel

    def ddp_that_does_not_average(*args, **kwargs):
        model = wrap(*args, **kwargs)
        model.register_comm_hook(None, _keep_local_gradients)
        return model

    training.distributed.parallel.DistributedDataParallel = ddp_that_does_not_average
    _worker(rank, world_size, port, out_dir, parallel)


def test_the_comparison_fails_when_the_ranks_do_not_average_their_gradients(tmp_path):
    # The mutation: each rank steps on its own half of the batch. The check above must catch it.
    single = DistContext(env=DistEnv(), device=torch.device("cpu"), backend=None)
    train(run_config(tmp_path / "one", 1), single, loader_factory=fixed_loader)
    mp.spawn(_worker_without_allreduce, args=(2, free_port(), str(tmp_path / "two"), "ddp"), nprocs=2, join=True)
    lr, _ = step_sizes(tmp_path / "one")
    one = torch.load(tmp_path / "one/checkpoints/checkpoint.pth", weights_only=False)
    two = torch.load(tmp_path / "two/checkpoints/checkpoint.pth", weights_only=False)
    problems = trained_alike(one["student"], two["student"], lr, 2 * STEPS * lr * 1.05)
    assert problems and "of the elements differ" in problems[0]
    with pytest.raises(AssertionError):
        assert_two_ranks_match_one(tmp_path / "one", tmp_path / "two")


EXAMPLE_EXIT = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("ddp_minimal", sys.argv[1])
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)
code = example.main(["--steps", "2"])
from pathlib import Path
threads = sum((t / "comm").read_text().startswith("pt_gloo") for t in Path("/proc/self/task").iterdir())
print(json.dumps({"code": code, "gloo_threads": threads}))
"""


def test_ddp_example_frees_its_group_before_the_interpreter_exits(tmp_path):
    # A group that outlives destroy_process_group keeps gloo's threads, and one of them releasing its
    # last work during interpreter shutdown aborts a finished run (seen on the two-node Slurm test).
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    run = subprocess.run([sys.executable, "-c", EXAMPLE_EXIT, str(REPO / "examples" / "ddp_minimal.py")],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.splitlines()[-1]) == {"code": 0, "gloo_threads": 0}
