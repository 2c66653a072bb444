"""A packed dataset written in parts, one per task of a Slurm array, then merged: what `prepare`
and `ingest` share.

    <packed>.parts/part-00003-of-00008/    part 3 of 8 (training/data/store/write.py PartWriter), where
                                           the run's layout puts it (RunLayout.part)

Task K of N works on slice K of its inputs (`part_rows`). A finished part records the inputs it was
made from (its identity); a task that finds a finished part of the same identity keeps it, which
makes an interrupted array resumable; training/data/store/merge.py joins the parts.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from training.data.store.format import PART_FILE
from training.errors import DamagedFileError, UserError
from training.rundir.integrity import check_crc32, check_present, check_size, parse_json, require_keys, rerun
from training.rundir.layout import part_number

log = logging.getLogger(__name__)


def check_part_arguments(part: int | None, parts: int) -> None:
    if parts < 1 or (part is not None and not 0 <= part < parts):
        raise UserError(f"--part must be in 0..{parts - 1} and --parts >= 1 (got --part {part} --parts {parts})")


def part_rows(total: int, part: int, parts: int) -> range:
    """Slice `part` of `parts` of `total` inputs: contiguous, sizes differing by one at most."""
    return range(total * part // parts, total * (part + 1) // parts)


def part_remedy(step: str, folder: Path) -> str:
    """What makes a damaged part again: its task (`step --part K --parts N`, which cuts or packs a
    damaged part again rather than keeping it), then the merge; for a one-part run the step itself."""
    numbered = part_number(folder)
    if numbered is None or numbered[1] == 1:
        return f"rerun `python -m training {step}`"
    part, parts = numbered
    return (f"rerun `python -m training {step} --part {part} --parts {parts}` (it makes this part again), then "
            f"`python -m training {step} --merge --parts {parts}`")


def finished_part(folder: Path, identity: dict[str, Any], step: str = "prepare") -> dict[str, Any] | None:
    """The part.json of a finished, intact part made from the same inputs, else None: a damaged part
    (part.json, a pixel file or a table) is made again, with a warning naming what is wrong."""
    try:
        done = read_part(folder, part_remedy(step, folder))
        if done is not None and done.get("identity") == identity:
            check_part(folder, done, part_remedy(step, folder))
            return done
    except DamagedFileError as exc:
        log.warning("%s %s: making the part again", exc.path, exc.problem)
    return None


def read_part(folder: Path, fix: str = rerun("prepare")) -> dict[str, Any] | None:
    """A finished part's part.json; None while the part is unfinished (or never started). `fix`: what
    a DamagedFileError says makes the part again (part_remedy)."""
    path = Path(folder) / PART_FILE
    if not path.exists():
        return None
    return require_keys(parse_json(path, fix), ("format", "channels", "shards", "shape"), path, fix)


def check_part(folder: Path, info: dict[str, Any], fix: str) -> None:
    """A finished part's files as its part.json records them: each pixel file there and of its size,
    each table there and of its size and CRC-32 (a merge reads the tables whole anyway)."""
    folder = Path(folder)
    for shard in info["shards"]:
        check_present(folder / shard["file"], fix, PART_FILE)
        check_size(folder / shard["file"], int(shard["bytes"]), PART_FILE, fix)
        check_present(folder / shard["table"], fix, PART_FILE)
        if "table_bytes" in shard:  # parts written before the tables' checksums were recorded: none
            check_size(folder / shard["table"], int(shard["table_bytes"]), PART_FILE, fix)
            check_crc32(folder / shard["table"], shard["table_crc32"], PART_FILE, fix)
