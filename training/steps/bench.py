"""bench: print benchmark figures as JSON.

    python -m training bench loader --config run.yaml [--batches 10 --warmup 2 --workers 2 --images 2000 --size 48/24]
    python -m training bench step --config run.yaml [--batches 20 --warmup 3] [--out step.json]
    python -m training bench pretrain --config run.yaml [--batches 20 --warmup 3 --loader staged|packed --images N]
    python -m training bench scale [--sizes 100000,1000000,10000000] [--out scale.json]
    python -m training bench ingest [--fields 16,64 --cells 200 --crop 64] [--out ingest.json]
    python -m training bench screen --config configs/screen.yaml [--ranks 2 --reuse --truth truth.csv] [--out screen.json]

`loader`: images/s of a straightforward scDINO-style loader (tifffile per image, float64, per-sample
torchvision transforms) against the packed loader with batched multi-crop, same images, same worker
count (training/benchmarks/loader.py). `step`: training-step throughput
(training/benchmarks/step.py). `pretrain`: `pretrain`'s own loop beside the same model's step, so
its overhead is a measured figure (training/benchmarks/pretrain.py). `scale`: what opening a dataset
of 10^5..10^7 cells costs, per process and per loader worker, against the JSON index of before
(training/benchmarks/scale.py). `ingest`: crops per CPU-second cut out of 1080 x 1080 x 5 uint16
fields of view, and peak memory at two numbers of fields (training/benchmarks/ingest.py). `screen`:
the screen chain up to `knn` and its figures beside an oracle that knows each cell's phenotype
(training/benchmarks/screen.py). This module is the one place where the flags become a typed request
(training/benchmarks/request.py); it imports the benchmark, and with it torch, only to run it.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from training.benchmarks.request import (
    LoaderBenchRequest,
    PretrainBenchRequest,
    StepBenchRequest,
    parse_crop_sizes,
)
from training.errors import UserError

log = logging.getLogger(__name__)

# Flags that mean something to `bench loader` only; given to `bench step`, they are an error
# rather than silently ignored.
LOADER_ONLY = ("workers", "images", "size")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every flag defaults to None: the request dataclasses hold the defaults, per benchmark."""
    parser.add_argument("what", choices=["loader", "step", "pretrain", "scale", "ingest", "screen"],
                        help="which benchmark to run")
    parser.add_argument("--batches", type=int,
                        help="timed batches (loader, default 10) or steps (step, default 20)")
    parser.add_argument("--warmup", type=int, help="untimed batches or steps first (loader 2, step 3)")
    parser.add_argument("--workers", type=int, help="loader: DataLoader workers (default: data.num_workers)")
    parser.add_argument("--images", type=int,
                        help="loader: synthetic images to generate when data.source is absent (default 2000); "
                             "pretrain --loader packed: images to pack (default: one batch more than it trains on)")
    parser.add_argument("--loader", help="pretrain: staged (crops already on the device, the default) or packed "
                                         "(the real loader over synthetic images)")
    parser.add_argument("--size", help="loader: global/local crop sides, e.g. 48/24 (native resolution)")
    parser.add_argument("--sizes", help="scale: dataset sizes in cells, e.g. 100000,1000000,10000000 (the default)")
    parser.add_argument("--fields", help="ingest: numbers of fields of view, e.g. 16,64 (the default)")
    parser.add_argument("--cells", type=int, help="ingest: cells per field of view (default 200)")
    parser.add_argument("--crop", type=int, help="ingest: crop side in pixels (default 64)")
    parser.add_argument("--dino-reference", action="store_true",
                        help="step: run the model as facebookresearch/dino's main_dino.py does (eager, fp16, "
                             "unfused attention and optimizer), the baseline for speed-ups")
    parser.add_argument("--ranks", type=int, help="screen: pretraining ranks through torchrun (default 2, as the "
                                                   "local Slurm cluster's two nodes)")
    parser.add_argument("--reuse", action="store_true", help="screen: keep the steps whose files exist")
    parser.add_argument("--truth", type=Path, help="screen: the screen's truth.csv (default: beside ingest.table)")
    parser.add_argument("--out", type=Path, help="also write the JSON to this file")


def _given(args: argparse.Namespace, *names: str) -> dict:
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def loader_request(args: argparse.Namespace) -> LoaderBenchRequest:
    return LoaderBenchRequest(**_given(args, "batches", "warmup", "workers", "images"),
                              crop_sizes=parse_crop_sizes(args.size))


def step_request(args: argparse.Namespace) -> StepBenchRequest:
    for name in LOADER_ONLY:
        if getattr(args, name) is not None:
            raise UserError(f"--{name} {getattr(args, name)}: only `bench loader` takes it; "
                            "`bench step` runs on synthetic crops")
    given = _given(args, "batches", "warmup")
    if "batches" in given:
        given["steps"] = given.pop("batches")
    return StepBenchRequest(**given, reference=bool(getattr(args, "dino_reference", False)))


def pretrain_request(args: argparse.Namespace) -> PretrainBenchRequest:
    for name in ("workers", "size"):
        if getattr(args, name) is not None:
            raise UserError(f"--{name} {getattr(args, name)}: only `bench loader` takes it; `bench pretrain` "
                            "takes the loader's settings from the config (--set data.num_workers=8)")
    given = _given(args, "batches", "warmup", "loader", "images")
    if "batches" in given:
        given["steps"] = given.pop("batches")
    return PretrainBenchRequest(**given)


def run(config, layout, args: argparse.Namespace) -> int:
    if getattr(args, "dino_reference", False) and args.what != "step":
        raise UserError(f"--dino-reference: only `bench step` takes it, not `bench {args.what}`")
    screen_only = [f"--{n}" for n in ("ranks", "truth") if getattr(args, n, None) is not None]
    screen_only += ["--reuse"] if getattr(args, "reuse", False) else []
    if getattr(args, "loader", None) is not None and args.what != "pretrain":
        raise UserError(f"--loader: only `bench pretrain` takes it, not `bench {args.what}`")
    if screen_only and args.what != "screen":
        raise UserError(f"{', '.join(screen_only)}: only `bench screen` takes {'it' if len(screen_only) == 1 else 'them'}")
    if args.what == "screen":
        from training.benchmarks.screen import markdown, run_screen_benchmark

        result = run_screen_benchmark(config, args.config, list(args.overrides), ranks=args.ranks or 2,
                                      reuse=args.reuse, truth=args.truth)
        log.info("bench screen:\n%s", markdown(result))
    elif args.what == "ingest":
        from training.benchmarks.ingest import run_ingest_benchmark

        result = run_ingest_benchmark(ingest_fields(args.fields), cells=args.cells or 200, crop=args.crop or 64)
    elif args.what == "scale":
        from training.benchmarks.scale import run_scale_benchmark

        result = run_scale_benchmark(scale_sizes(args.sizes))
    elif args.what == "loader":
        request = loader_request(args)
        from training.benchmarks.loader import run_loader_benchmark

        result = run_loader_benchmark(config, request)
    elif args.what == "pretrain":
        request = pretrain_request(args)
        from training.benchmarks.pretrain import run_pretrain_benchmark

        result = run_pretrain_benchmark(config, request)
    else:
        request = step_request(args)
        start = time.perf_counter()
        import training.trainer  # noqa: F401  (what `pretrain` imports: torch, timm, models, loaders)
        from training.benchmarks.step import run_step_benchmark

        import_s = time.perf_counter() - start
        result = run_step_benchmark(config, request)
        result["import_s"] = round(import_s, 3)
        result["startup_s"] = round(import_s + result["build_s"], 3)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        _write_text(args.out, text + "\n")
    return 0


def scale_sizes(text: str | None) -> list[int]:
    """--sizes as cell counts (10^5, 10^6 and 10^7 by default)."""
    if not text:
        return [100_000, 1_000_000, 10_000_000]
    try:
        sizes = [int(float(part)) for part in text.split(",") if part.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1000:
        raise UserError(f"--sizes {text!r}: give cell counts of at least 1000, e.g. 100000,1000000")
    return sizes


def ingest_fields(text: str | None) -> list[int]:
    """--fields as numbers of fields of view (16 and 64 by default)."""
    try:
        counts = [int(part) for part in (text or "16,64").split(",") if part.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise UserError(f"--fields {text!r}: give numbers of fields of view, e.g. 16,64")
    return counts


def _write_text(out: Path, text: str) -> None:
    """Whole or not at all: a reader (scripts/gpu-bench.sh's summary) never sees half a file."""
    from training.atomic import write_text_atomic

    write_text_atomic(out, text)
    log.info("wrote %s", out)
