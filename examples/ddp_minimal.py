"""The smallest useful DDP program: proves a multi-node launch gives one consistent world.

    sbatch --nodes=2 slurm/torchrun.slurm examples/ddp_minimal.py --steps 20

Each rank trains a tiny linear model on its own random data under DistributedDataParallel (NCCL
on GPUs, gloo on CPU), then checks that an all-reduce adds up and that every rank ends with the
same weights. Rank 0 prints one JSON line starting with "DDP_RESULT" (and writes it to --out).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401  before the group exists: training/distributed/groups.py says why
from torch.nn.parallel import DistributedDataParallel

log = logging.getLogger(__name__)


def setup() -> torch.device:
    """Join the process group torchrun describes in the environment (RANK, WORLD_SIZE, ...)."""
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return device


def train(device: torch.device, steps: int) -> torch.nn.Module:
    torch.manual_seed(0)  # same initial weights everywhere; DDP also broadcasts them
    model = DistributedDataParallel(
        torch.nn.Linear(16, 1).to(device), device_ids=[device.index] if device.type == "cuda" else None
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(dist.get_rank())  # different data per rank
    for _ in range(steps):
        x = torch.randn(32, 16, generator=generator).to(device)
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.module


def check(model: torch.nn.Module, device: torch.device) -> dict:
    """Compare weights and an all-reduce across ranks; every rank returns the same verdict."""
    world = dist.get_world_size()
    ones = torch.ones(1, device=device)
    dist.all_reduce(ones)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    hosts = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    identical = all(torch.equal(gathered[0], other) for other in gathered[1:])
    return {
        "world_size": world,
        "allreduce_sum": ones.item(),
        "params_identical": identical,
        "hosts": sorted(set(hosts)),
        "backend": dist.get_backend(),
        "ok": identical and ones.item() == world,
    }


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per rank")
    parser.add_argument("--out", type=Path, help="also write rank 0's JSON result here")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    device = setup()
    result = check(train(device, args.steps), device)
    result["seconds"] = round(time.perf_counter() - start, 3)
    if dist.get_rank() == 0:
        print("DDP_RESULT " + json.dumps(result), flush=True)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            tmp = args.out.with_suffix(".tmp")
            tmp.write_text(json.dumps(result, indent=2))
            tmp.replace(args.out)
    # Without a barrier, a rank may tear down while another still talks to it (gloo aborts).
    dist.barrier()
    dist.destroy_process_group()
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
