"""bench: print benchmark figures as JSON.

    python -m training bench loader --config run.yaml [--batches 10 --warmup 2 --workers 2 --images 2000 --size 48/24]
    python -m training bench step --config run.yaml [--batches 20 --warmup 3] [--out step.json]
    python -m training bench pretrain --config run.yaml [--batches 20 --warmup 3 --loader staged|packed --images N]
    python -m training bench scale [--sizes 100000,1000000,10000000] [--out scale.json]
    python -m training bench profile-scale [--sizes 100000,1000000,10000000 --plates 40] [--out profile_scale.json]
    python -m training bench ingest [--fields 16,64 --cells 200 --crop 64] [--out ingest.json]
    python -m training bench screen --config configs/screen.yaml [--ranks 2 --reuse --truth truth.csv]
                                    [--seeds 0,1,2] [--out screen.json]

`loader`: images/s of a straightforward scDINO-style loader (tifffile per image, float64, per-sample
torchvision transforms) against the packed loader with batched multi-crop, same images, same worker
count (training/benchmarks/data/loader.py). `step`: training-step throughput
(training/benchmarks/speed/step.py). `pretrain`: `pretrain`'s own loop beside the same model's step, so
its overhead is a measured figure (training/benchmarks/speed/pretrain.py). `scale`: what opening a dataset
of 10^5..10^7 cells costs, per process and per loader worker, against the JSON index of before
(training/benchmarks/data/scale.py). `profile-scale`: the steps after `features` on a synthetic screen of
10^5..10^7 cells, each in its own process: time, private memory and bytes written of the feature set,
export's AnnData and Parquet, the per-well medians and their normalisation, and the mAP
(training/benchmarks/data/profile_scale.py). `ingest`: crops per CPU-second cut out of 1080 x 1080 x 5 uint16
fields of view, and peak memory at two numbers of fields (training/benchmarks/data/ingest_rate.py). `screen`:
the screen chain up to `knn` and its figures beside an oracle that knows each cell's phenotype
(training/benchmarks/quality/screen.py); with `--seeds`, once per run.seed and summarised
(training/benchmarks/quality/screen_seeds.py). The flags become a typed request in training/benchmarks/request.py;
training/benchmarks/__init__.py imports the benchmark, and with it torch, only to run it.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from training.benchmarks import run_benchmark
from training.benchmarks.request import bench_request

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every flag defaults to None: the request dataclasses hold the defaults, per benchmark."""
    parser.add_argument("what", choices=["loader", "step", "pretrain", "scale", "profile-scale", "ingest", "screen"],
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
    parser.add_argument("--sizes", help="scale, profile-scale: dataset sizes in cells, e.g. 100000,1000000,10000000 "
                                        "(the default)")
    parser.add_argument("--plates", type=int, help="profile-scale: plates of 384 wells in the screen (default 40)")
    parser.add_argument("--steps", help="profile-scale: only these steps, e.g. features,subpopulations (default: all; "
                                        "the steps after `features` read its feature set, so it runs before them)")
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
    parser.add_argument("--seeds", help="screen: run once per run.seed, e.g. 0,1,2, each into run.output_dir-seed<s>, "
                                        "and summarise the runs (mean, worst, the bars on each)")
    parser.add_argument("--out", type=Path, help="also write the JSON to this file")


def run(config, layout, args: argparse.Namespace) -> int:
    """Run the benchmark the flags ask for; print its JSON (and write it to --out)."""
    result = run_benchmark(config, bench_request(args))
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        _write_text(args.out, text + "\n")
    return 0


def _write_text(out: Path, text: str) -> None:
    """Whole or not at all: a reader (scripts/gpu-bench.sh's summary) never sees half a file."""
    from training.writes.atomic import write_text_atomic

    write_text_atomic(out, text)
    log.info("wrote %s", out)
