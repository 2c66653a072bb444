"""prepare: pack the TIFF folder into one memory-mapped array + index, and fix the hold-out split.

    python -m training prepare --config run.yaml

Reads data.source (class folders), writes <run>/packed (or data.packed_dir) atomically, the
seeded train/hold-out split (<run>/split.json) and, if any image is unusable, the report
<run>/bad_images.json (path and reason of each). data.on_bad_image=fail stops at the first one.
"""

from __future__ import annotations

import argparse
import logging
from collections import Counter
from pathlib import Path

import numpy as np

from training.config import Config
from training.data.dataset import BadImageError, packed_dir
from training.data.index import scan_images
from training.data.io import write_json_atomic
from training.data.packed import is_packed, pack_images
from training.data.split import make_split, save_split
from training.data.tiff import BadImage
from training.errors import UserError
from training.layout import RunLayout

log = logging.getLogger(__name__)


def _fail_on_bad(bad: BadImage) -> None:
    raise BadImageError(bad)


def _skip_bad(bad: BadImage) -> None:
    log.debug("bad image %s: %s", bad.path, bad.reason)


def write_bad_report(config: Config, bad: list[BadImage]) -> None:
    """bad_images.json with every skipped image; removed when a re-run finds none."""
    path = RunLayout.from_config(config).bad_images
    if not bad:
        path.unlink(missing_ok=True)
        return
    write_json_atomic(path, {"step": "prepare", "count": len(bad),
                             "images": [{"path": b.path, "reason": b.reason} for b in bad]})
    kinds = Counter(b.reason.split(":")[0].split("(")[0].strip() for b in bad)
    log.warning("skipped %d bad images (%s); details in %s", len(bad),
                ", ".join(f"{n} {k}" for k, n in kinds.most_common()), path)


def run(config: Config, args: argparse.Namespace) -> int:
    source = Path(config.data.source)
    if is_packed(source):
        raise UserError(f"data.source {source} is already a packed dataset; point it at the TIFF folder")
    index = scan_images(source, config.data.folder_depth_for_labels)
    out = packed_dir(config)
    on_bad = _fail_on_bad if config.data.on_bad_image == "fail" else _skip_bad
    report = pack_images(source, index, out, channel_axis=config.data.channel_axis, on_bad=on_bad,
                         folder_depth_for_labels=config.data.folder_depth_for_labels)
    if report.n_images == 0:
        raise UserError(f"none of the {len(index)} images under {source} is readable; see the log")
    write_bad_report(config, report.bad)
    kept = index.without({b.path for b in report.bad})
    split = make_split(np.asarray(kept.labels), config.data.holdout_fraction, config.run.seed)
    save_split(config, split, kept.paths)
    log.info("packed %d images (%d skipped) into %s; split: %d train, %d hold-out",
             report.n_images, len(report.bad), out, len(split.train), len(split.holdout))
    return 0
