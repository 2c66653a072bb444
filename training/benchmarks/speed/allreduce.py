"""All-reduce bus bandwidth of this allocation, compared with what the instance type should reach.

    sbatch --nodes=2 slurm/nccl_tests.slurm                                  (the usual way)
    torchrun --nnodes 2 ... -m training.benchmarks.speed.allreduce --out busbw.json
    python -m training.benchmarks.speed.allreduce --nccl-tests all_reduce_perf.log  (parse nccl-tests)

Times `torch.distributed.all_reduce` (NCCL on GPUs, gloo on CPU) over a range of message sizes and
reports, like nccl-tests, the bus bandwidth busbw = algbw * 2 (n - 1) / n, where algbw = bytes /
time and n the number of ranks: the figure that is comparable across world sizes. Rank 0 prints
one JSON object (and writes it to --out): per-size results, the peak `busbw_gbs`, the expected
figure for --instance-type, and `init_s`, the seconds rank 0 took to join the process group (the
planner counts it in a distributed step's start-up). `--nccl-tests` turns an all_reduce_perf log into the same JSON.

Expected figures (large messages, GB/s) come from training.costs.scaling.PRESETS: published
nccl-tests results for p4d (78.3 across 2 nodes) and p5 (443.7; 487 at 16 GiB), and for g4dn,
which has no published figure, 80% of the 50 Gbit/s network line rate across nodes (no GPUDirect
RDMA: every byte crosses host memory and the one EFA interface) and of PCIe 3.0 x16 inside a node.
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from training.writes.atomic import write_text_atomic

log = logging.getLogger(__name__)

GB = 1e9
GPU_SIZES = "1M,16M,64M,256M,1G"
CPU_SIZES = "64K,1M,4M"
SUFFIXES = {"K": 2**10, "M": 2**20, "G": 2**30}
GOOD_FRACTION = 0.8


@dataclass(frozen=True)
class SizeResult:
    bytes: int
    time_s: float
    algbw_gbs: float
    busbw_gbs: float


def parse_size(text: str) -> int:
    """'64M' -> 67108864; plain integers are bytes."""
    text = text.strip().upper()
    try:
        if text and text[-1] in SUFFIXES:
            return int(float(text[:-1]) * SUFFIXES[text[-1]])
        return int(text)
    except ValueError:
        raise SystemExit(f"error: bad message size {text!r}: use bytes or a K/M/G suffix, e.g. 64M") from None


def bus_bandwidth(nbytes: int, seconds: float, ranks: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for one all-reduce of nbytes taking seconds across ranks."""
    algbw = nbytes / seconds / GB
    return algbw, algbw * 2 * (ranks - 1) / ranks


def expected_busbw(instance_type: str, nodes: int) -> tuple[float | None, str]:
    """The figure this instance type should reach at large sizes, and where it comes from."""
    from training.costs.scaling import PRESETS

    preset = PRESETS.get(instance_type)
    if preset is None:
        return None, f"no reference figure for {instance_type!r} (known: {', '.join(sorted(PRESETS))})"
    if nodes > 1:
        return preset.inter_busbw_gbs, f"{preset.source}; across nodes"
    return preset.intra_busbw_gbs, f"{preset.source}; inside one node"


def verdict(measured: float, expected: float | None, device: str) -> str:
    if device == "cpu":
        return "informational: CPU/gloo over TCP, not comparable with the GPU figure"
    if expected is None:
        return "informational: no reference figure"
    ratio = measured / expected
    if ratio >= GOOD_FRACTION:
        return f"ok: {ratio:.0%} of expected"
    return f"low: {ratio:.0%} of expected; check EFA (NCCL_DEBUG=INFO shows 'NET/OFI'), placement group, versions"


def summarise(results: list[SizeResult], *, ranks: int, nodes: int, device: str, backend: str,
              instance_type: str, source: str) -> dict:
    peak = max((r.busbw_gbs for r in results), default=0.0)
    expected, basis = expected_busbw(instance_type, nodes)
    return {
        "source": source,
        "ranks": ranks,
        "nodes": nodes,
        "device": device,
        "backend": backend,
        "instance_type": instance_type,
        "results": [asdict(r) for r in results],
        "busbw_gbs": round(peak, 4),
        "expected_busbw_gbs": expected,
        "expected_basis": basis,
        "verdict": verdict(peak, expected, device),
    }


def parse_nccl_tests(text: str) -> tuple[list[SizeResult], int | None]:
    """Rows of an all_reduce_perf log: size count type redop root time algbw busbw #wrong (x2).

    Returns the out-of-place results (time in us in the log) and the rank count from its header
    lines ("#  Rank  3 Group ..."), when present.
    """
    results, ranks = [], set()
    for line in text.splitlines():
        fields = line.split()
        if line.lstrip().startswith("#"):
            if len(fields) > 2 and fields[1] == "Rank" and fields[2].isdigit():
                ranks.add(int(fields[2]))
            continue
        if len(fields) < 9 or not fields[0].isdigit():
            continue
        try:
            time_us, algbw, busbw = float(fields[5]), float(fields[6]), float(fields[7])
        except ValueError:
            continue
        results.append(SizeResult(int(fields[0]), time_us / 1e6, algbw, busbw))
    return results, (len(ranks) or None)


def time_allreduce(ctx, nbytes: int, iters: int, warmup: int) -> float:
    """Mean seconds per all_reduce of nbytes (float32), the slowest rank's view."""
    import torch
    import torch.distributed as dist

    tensor = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=ctx.device)
    sync = torch.cuda.synchronize if ctx.device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        dist.all_reduce(tensor)
    sync()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor)
    sync()
    elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64)
    elapsed = elapsed.to(ctx.device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item())


def count_nodes() -> int:
    import torch.distributed as dist

    hosts: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    return len(set(hosts))


def run_benchmark(args: argparse.Namespace) -> dict | None:
    """Measure on every rank; rank 0 returns the summary, other ranks None."""
    from training.distributed.groups import process_group

    start = time.perf_counter()
    with process_group() as ctx:
        init_s = time.perf_counter() - start  # joining the process group: what every distributed step pays
        if not ctx.distributed:
            raise SystemExit("error: one process has nothing to all-reduce with: launch with torchrun "
                             "(or slurm/nccl_tests.slurm) and at least 2 ranks")
        default_sizes = GPU_SIZES if ctx.device.type == "cuda" else CPU_SIZES
        sizes = [parse_size(s) for s in (args.sizes or default_sizes).split(",")]
        results = []
        for nbytes in sizes:
            seconds = time_allreduce(ctx, nbytes, args.iters, args.warmup)
            algbw, busbw = bus_bandwidth(nbytes, seconds, ctx.world_size)
            results.append(SizeResult(nbytes, seconds, round(algbw, 4), round(busbw, 4)))
            if ctx.is_main:
                log.info("%12d B  %9.3f ms  algbw %8.3f GB/s  busbw %8.3f GB/s",
                         nbytes, seconds * 1e3, algbw, busbw)
        summary = summarise(results, ranks=ctx.world_size, nodes=count_nodes(), device=ctx.device.type,
                            backend=ctx.backend, instance_type=args.instance_type, source="torch.distributed")
        return {**summary, "init_s": round(init_s, 3)} if ctx.is_main else None


def write_json(summary: dict, out: Path | None) -> None:
    text = json.dumps(summary, indent=2)
    print("ALLREDUCE_RESULT " + json.dumps(summary), flush=True)
    if out:
        write_text_atomic(out, text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m training.benchmarks.speed.allreduce",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--sizes",
                        help=f"comma-separated message sizes (default GPU {GPU_SIZES}, CPU {CPU_SIZES})")
    parser.add_argument("--iters", type=int, default=20, help="timed all-reduces per size")
    parser.add_argument("--warmup", type=int, default=5, help="untimed all-reduces per size first")
    parser.add_argument("--instance-type", default="g4dn.12xlarge", help="for the expected figure")
    parser.add_argument("--nccl-tests", type=Path, metavar="LOG", help="parse an all_reduce_perf log instead")
    parser.add_argument("--nodes", type=int, default=1, help="with --nccl-tests: nodes the log came from")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    args = build_parser().parse_args(argv)
    if args.nccl_tests:
        if not args.nccl_tests.is_file():
            raise SystemExit(f"error: nccl-tests log not found: {args.nccl_tests}")
        results, ranks = parse_nccl_tests(args.nccl_tests.read_text(errors="replace"))
        if not results:
            raise SystemExit(f"error: no all_reduce_perf result rows in {args.nccl_tests}")
        summary = summarise(results, ranks=ranks or 0, nodes=args.nodes, device="cuda", backend="nccl",
                            instance_type=args.instance_type, source="nccl-tests all_reduce_perf")
    else:
        summary = run_benchmark(args)
    if summary is not None:
        write_json(summary, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
