"""What a benchmark is asked to do: typed, validated requests, built by `training/steps/bench.py`.

The benchmark modules take these instead of the command line's namespace, so that library code
reads only fields that exist, with their defaults in one place. Standard library only: the CLI
builds and checks a request before it imports torch. A bad value raises UserError naming the flag
it came from (the field names are the flags without their dashes, except `steps`: `--batches`).
"""

from __future__ import annotations

from dataclasses import dataclass

from training.errors import UserError


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
