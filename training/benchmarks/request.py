"""What a benchmark is asked to do: typed, validated requests, built from `bench`'s flags
(`bench_request`); training/benchmarks/__init__.py runs the benchmark that answers each.

The benchmark modules take these instead of the command line's namespace, so that library code
reads only fields that exist, with their defaults in one place. Standard library only: the CLI
builds and checks a request before it imports torch. A bad value raises UserError naming the flag it came from (the
field names are the flags without their dashes, except `steps`: `--batches`); a flag given to a
benchmark that does not take it is an error rather than silently ignored.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from training.errors import UserError

LOADER_ONLY = ("workers", "images", "size")
"""Flags that mean something to `bench loader` only; given to `bench step`, they are an error."""


def _at_least(flag: str, value: int | None, low: int, meaning: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
        raise UserError(f"{flag} {value!r}: {meaning}")


@dataclass(frozen=True)
class LoaderBenchRequest:
    """`bench loader`: the same images through the scDINO-style, packed and device-side loaders."""

    batches: int = 10
    """Timed batches per loader: enough that a slow first batch of a worker does not dominate."""
    warmup: int = 2
    """Untimed batches first, so worker start-up and first-touch page faults are not timed."""
    workers: int | None = None
    """Loader workers (processes for the baseline, threads for ours); None: data.num_workers."""
    images: int = 2000
    """Synthetic images to write when data.source is absent: more than the benchmark draws."""
    crop_sizes: tuple[int, int] | None = None
    """(global, local) crop sides instead of the config's, e.g. (48, 24) for native resolution."""

    def __post_init__(self) -> None:
        _at_least("--batches", self.batches, 1, "time at least one batch")
        _at_least("--warmup", self.warmup, 0, "give 0 or more untimed batches")
        _at_least("--workers", self.workers, 0, "give 0 (load in the main process) or more workers")
        _at_least("--images", self.images, 1, "give at least one synthetic image")
        if self.crop_sizes is not None:
            if len(self.crop_sizes) != 2:
                raise UserError(f"--size {self.crop_sizes!r}: give the global and local crop sides")
            for side in self.crop_sizes:
                _at_least("--size", side, 1, "crop sides must be positive")

    def config_overrides(self) -> dict[str, int]:
        """The `--set`-style overrides that apply crop_sizes to a config (none without them)."""
        if self.crop_sizes is None:
            return {}
        global_side, local_side = self.crop_sizes
        return {"dino.global_crop_size": global_side, "dino.local_crop_size": local_side}


@dataclass(frozen=True)
class StepBenchRequest:
    """`bench step`: timed DINO training steps on synthetic crops."""

    steps: int = 20
    """Timed steps (the `--batches` flag), in each of the split and the free-running pass."""
    warmup: int = 3
    """Untimed steps first: cuDNN autotuning, allocator growth and, compiled, the compilation."""
    reference: bool = False
    """Run the step as facebookresearch/dino's main_dino.py does (`--dino-reference`), the baseline."""

    def __post_init__(self) -> None:
        _at_least("--batches", self.steps, 1, "time at least one step")
        _at_least("--warmup", self.warmup, 0, "give 0 or more untimed steps")


@dataclass(frozen=True)
class PretrainBenchRequest:
    """`bench pretrain`: `pretrain`'s loop for warmup + steps steps, then the same model's free-running step."""

    steps: int = 20
    """Timed steps (the `--batches` flag) of the loop, and of the free-running pass after it."""
    warmup: int = 3
    """Untimed steps of the loop first: cuDNN autotuning, allocator growth and, compiled, the
    compilation. At least 1: the timing starts when a step's figures have been read."""
    loader: str = "staged"
    """"staged": crops already on the device, cycled (the loop's own cost); "packed": the real
    pretraining loader over synthetic images packed for the benchmark."""
    images: int | None = None
    """Synthetic images to pack under `--loader packed`; None: one batch more than the loop trains on."""

    def __post_init__(self) -> None:
        _at_least("--batches", self.steps, 1, "time at least one step")
        _at_least("--warmup", self.warmup, 1, "the loop's timing starts at the end of an untimed step: give 1 or more")
        if self.loader not in ("staged", "packed"):
            raise UserError(f"--loader {self.loader!r}: give staged (crops on the device) or packed (the real loader)")
        _at_least("--images", self.images, 1, "give at least one synthetic image")
        if self.images is not None and self.loader != "packed":
            raise UserError(f"--images {self.images}: only `--loader packed` packs images")


def parse_crop_sizes(text: str | None) -> tuple[int, int] | None:
    """`--size 48/24` -> (48, 24); None or empty -> None (the config's crop sides).

    Only the form is checked here; LoaderBenchRequest checks that the sides are positive.
    """
    if not text:
        return None
    try:
        global_side, local_side = (int(v) for v in text.split("/"))
    except ValueError:
        raise UserError(f"--size {text!r}: give the global and local crop sides as G/L, e.g. --size 48/24") from None
    return global_side, local_side


@dataclass(frozen=True)
class ScaleBenchRequest:
    """`bench scale`: what opening a dataset of these many cells costs."""

    sizes: tuple[int, ...] = (100_000, 1_000_000, 10_000_000)


@dataclass(frozen=True)
class ProfileScaleBenchRequest:
    """`bench profile-scale`: the steps after `features` on a screen of these many cells."""

    sizes: tuple[int, ...] = (100_000, 1_000_000, 10_000_000)
    plates: int = 40
    """Plates of 384 wells: the per-well steps (normalisation, mAP) grow with them, not with the cells."""
    steps: tuple[str, ...] | None = None
    """The steps to measure (--steps), in the benchmark's order; None: every one."""

    def __post_init__(self) -> None:
        _at_least("--plates", self.plates, 1, "give a number of plates of 384 wells, e.g. --plates 40")


def profile_scale_steps(text: str | None) -> tuple[str, ...] | None:
    """--steps as names of `bench profile-scale`'s steps, in its order; None when not given."""
    if text is None:
        return None
    from training.benchmarks.data.profile_scale import STEPS

    asked = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in asked if name not in STEPS]
    if not asked or unknown:
        raise UserError(f"--steps {text!r}: {'no step named' if not unknown else 'unknown step ' + ', '.join(unknown)}; "
                        f"give some of {','.join(STEPS)}")
    return tuple(step for step in STEPS if step in asked)


@dataclass(frozen=True)
class IngestBenchRequest:
    """`bench ingest`: crops cut per CPU-second at these numbers of fields of view."""

    fields: tuple[int, ...] = (16, 64)
    cells: int = 200
    """Cells per field of view."""
    crop: int = 64
    """Crop side in pixels."""


@dataclass(frozen=True)
class ScreenBenchRequest:
    """`bench screen`: the screen chain up to `knn`, beside an oracle."""

    config_path: Path | None
    """The run YAML and its --set overrides, handed on to the steps the benchmark launches."""
    overrides: tuple[str, ...] = ()
    ranks: int = 2
    """Pretraining ranks through torchrun (the local Slurm cluster's two nodes)."""
    reuse: bool = False
    """Keep the steps whose files exist."""
    truth: Path | None = None
    """The screen's truth.csv (None: beside ingest.table)."""
    seeds: tuple[int, ...] | None = None
    """run.seed of each run (training/benchmarks/quality/screen_seeds.py); None: one run at the config's."""

    def __post_init__(self) -> None:
        _at_least("--ranks", self.ranks, 1, "pretrain on at least one rank")
        if self.seeds is not None and len(set(self.seeds)) != len(self.seeds):
            raise UserError(f"--seeds {','.join(map(str, self.seeds))}: each seed once (a repeat is the same run)")


BenchRequest = (LoaderBenchRequest | StepBenchRequest | PretrainBenchRequest | ScaleBenchRequest
                | ProfileScaleBenchRequest | IngestBenchRequest | ScreenBenchRequest)


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


def _ints(text: str) -> tuple[int, ...]:
    """Comma-separated integers; () where one is not an integer, for the caller's message."""
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        return ()


def ingest_fields(text: str | None) -> list[int]:
    """--fields as numbers of fields of view (16 and 64 by default)."""
    counts = list(_ints(text or "16,64"))
    if not counts or min(counts) < 1:
        raise UserError(f"--fields {text!r}: give numbers of fields of view, e.g. 16,64")
    return counts


def screen_seeds(text: str | None) -> tuple[int, ...] | None:
    """--seeds as run.seed values, e.g. 0,1,2 (None: one run at the config's run.seed)."""
    if text is None:
        return None
    seeds = _ints(text)
    if not seeds or min(seeds) < 0:
        raise UserError(f"--seeds {text!r}: give run.seed values of 0 or more, comma-separated, e.g. 0,1,2")
    return seeds


def check_flags(args: argparse.Namespace) -> None:
    """A UserError for a flag that only another benchmark takes."""
    if getattr(args, "dino_reference", False) and args.what != "step":
        raise UserError(f"--dino-reference: only `bench step` takes it, not `bench {args.what}`")
    screen_only = [f"--{n}" for n in ("ranks", "truth", "seeds") if getattr(args, n, None) is not None]
    screen_only += ["--reuse"] if getattr(args, "reuse", False) else []
    for flag in ("plates", "steps"):
        if getattr(args, flag, None) is not None and args.what != "profile-scale":
            raise UserError(f"--{flag}: only `bench profile-scale` takes it, not `bench {args.what}`")
    if getattr(args, "loader", None) is not None and args.what != "pretrain":
        raise UserError(f"--loader: only `bench pretrain` takes it, not `bench {args.what}`")
    if screen_only and args.what != "screen":
        raise UserError(f"{', '.join(screen_only)}: only `bench screen` takes {'it' if len(screen_only) == 1 else 'them'}")


def bench_request(args: argparse.Namespace) -> BenchRequest:
    """`bench WHAT`'s flags as the typed request of benchmark WHAT, checked."""
    check_flags(args)
    if args.what == "screen":
        return ScreenBenchRequest(args.config, tuple(args.overrides), ranks=2 if args.ranks is None else args.ranks,
                                  reuse=args.reuse, truth=args.truth, seeds=screen_seeds(args.seeds))
    if args.what == "ingest":
        return IngestBenchRequest(tuple(ingest_fields(args.fields)), cells=args.cells or 200, crop=args.crop or 64)
    if args.what == "scale":
        return ScaleBenchRequest(tuple(scale_sizes(args.sizes)))
    if args.what == "profile-scale":
        return ProfileScaleBenchRequest(tuple(scale_sizes(args.sizes)), **_given(args, "plates"),
                                        steps=profile_scale_steps(getattr(args, "steps", None)))
    if args.what == "loader":
        return loader_request(args)
    if args.what == "pretrain":
        return pretrain_request(args)
    return step_request(args)
