"""Readers of what earlier steps wrote into a run directory, and the writer of the one file two steps
write in one format (bad_images.json: `prepare`'s unreadable images, `ingest`'s bad fields of view).

A later step, the plots, the report and the summary read a run only through these functions (the
packed dataset through training/data/store/read.py, feature sets through features.py, both checking with
integrity.py as these do), so a missing or damaged file always gives the same one-line message: the
file, what is missing or wrong with it (truncated, unparsable, wrong size, checksum mismatch) and the
step that writes it again.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from training.errors import DamagedFileError, MissingInputError, UserError
from training.rundir import tags
from training.rundir.features import FeatureSet, list_tags, load_features, read_index
from training.rundir.integrity import load_torch, parse_json, require_keys, rerun
from training.rundir.layout import RunLayout, checkpoint_role, set_aside_path
from training.writes.atomic import write_json_atomic

log = logging.getLogger(__name__)


def read_json(path: Path, what: str, step: str, keys: tuple[str, ...] = ()) -> Any:
    """A JSON file an earlier step wrote (an object with `keys`, when given); MissingInputError names
    that step when it is absent, DamagedFileError when it is damaged."""
    if not path.exists():
        raise MissingInputError(what, path, step)
    payload = parse_json(path, rerun(step))
    return require_keys(payload, keys, path, rerun(step)) if keys else payload


MERGED_REMEDY = "delete it and rerun the step that writes it"
"""For a file its own writer reads back first (results.json): a rerun alone would fail again."""


def read_optional_json(path: Path, step: str | None = None) -> Any:
    """A JSON file, or None when its step has not run (yet); damaged, a DamagedFileError that names
    `step` (else says to delete it: see MERGED_REMEDY)."""
    return parse_json(path, rerun(step) if step else MERGED_REMEDY) if path.exists() else None


def load_labels(layout: RunLayout) -> dict[str, Any]:
    """labels.json: class names, labels, dataset indices and paths of the held-out images, one of
    each per cell (and imaging batches, where it has them)."""
    labels = read_json(layout.labels, "held-out labels", "labels", ("class_names", "labels", "indices", "paths"))
    lists = [key for key in ("labels", "indices", "paths", "batches") if key in labels]
    lengths = {key: len(labels[key]) if isinstance(labels[key], list) else None for key in lists}
    if None in lengths.values() or len(set(lengths.values())) > 1:
        shown = ", ".join(f"{key} {n if n is not None else 'not a list'}" for key, n in lengths.items())
        raise DamagedFileError(layout.labels, f"lists cells of different lengths ({shown})", rerun("labels"))
    return labels


def load_knn(layout: RunLayout) -> dict[str, Any]:
    return read_json(layout.knn_json, "kNN results", "knn", ("tags",))


def load_linear(layout: RunLayout) -> dict[str, Any]:
    return read_json(layout.linear_json, "linear-probe results", "linear", ("tags",))


def read_split(layout: RunLayout, remedy: str = rerun("prepare")) -> dict[str, Any] | None:
    """split.json: the settings of a split by row (its membership in split.npy), or an older split's
    membership by path; None when no split was saved. `remedy`: what writes it again (the step that
    wrote the packed dataset, training/data/store/format.py writer_step)."""
    if not layout.split.exists():
        return None
    saved = parse_json(layout.split, remedy)
    keys = ("n_cells", "n_train", "n_holdout") if isinstance(saved, dict) and saved.get("format") == "rows" \
        else ("train", "holdout")
    return require_keys(saved, keys, layout.split, remedy)


def read_mean_std(path: Path, layout: RunLayout) -> dict[str, Any]:
    """mean_std.json (or the file data.mean_std_file names): per-channel "mean" and "std" lists of
    one length."""
    if not path.exists():
        raise MissingInputError("mean/std file", path, "mean-std")
    remedy = rerun("mean-std") if path == layout.mean_std else "fix or replace the file data.mean_std_file names"
    stats = require_keys(parse_json(path, remedy), ("mean", "std"), path, remedy)
    mean, std = stats["mean"], stats["std"]
    lists = isinstance(mean, list) and isinstance(std, list) and len(mean) == len(std) > 0
    if not lists or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in [*mean, *std]):
        raise DamagedFileError(path, 'does not hold two equally long lists of numbers, "mean" and "std"', remedy)
    bad = [f"{name}[{c}] = {v}" for name, values in (("mean", mean), ("std", std)) for c, v in enumerate(values)
           if not math.isfinite(v) or (name == "std" and v < 0)]
    if bad:
        raise DamagedFileError(path, f"holds values no normalisation can use ({', '.join(bad[:3])})", remedy)
    return stats


def checkpoint_remedy(path: Path) -> str:
    """What mends a damaged checkpoint: for a run's latest one, `pretrain` (its resume sets the file
    aside and goes on from the newest intact one); a numbered one is set aside by hand; weights from
    elsewhere are copied again."""
    role = checkpoint_role(path)
    if role == "latest":
        return f"{rerun('pretrain')} (it sets the file aside and resumes from the newest intact checkpoint), then this step"
    if role == "numbered":
        return (f"rename it to {set_aside_path(path).name} and {rerun('features')} (the other epochs are "
                "evaluated without it)")
    return "replace it with an intact copy"


def read_checkpoint(path: Path, *, mmap_weights: bool = False, verify: bool = True) -> dict[str, Any]:
    """A checkpoint's dict on the CPU, checked first (integrity.zip_problem); DamagedFileError names
    the file and what mends it (`checkpoint_remedy`)."""
    saved = load_torch(Path(path), checkpoint_remedy(Path(path)), verify=verify, mmap_weights=mmap_weights)
    if not isinstance(saved, dict):
        raise UserError(f"{path} holds a {type(saved).__name__}, not a checkpoint dict: "
                        f"{checkpoint_remedy(Path(path))}")
    return saved


def checkpoint_world_size(layout: RunLayout) -> int | None:
    """How many ranks wrote the latest checkpoint (its "world_size"), None without a checkpoint.
    Memory-maps the file, so the weights are not read (nor checksummed)."""
    return checkpoint_progress(layout).get("world_size")


def checkpoint_progress(layout: RunLayout) -> dict[str, Any]:
    """The latest checkpoint's "world_size", "global_step" and "epoch" (absent ones left out; {}
    without a checkpoint). Memory-maps the file, so the weights are not read (nor checksummed)."""
    if not layout.latest_checkpoint.is_file():
        return {}
    saved = read_checkpoint(layout.latest_checkpoint, mmap_weights=True)
    return {key: saved[key] for key in ("world_size", "global_step", "epoch") if saved.get(key) is not None}


def load_tagged_features(layout: RunLayout, labels: dict[str, Any]) -> dict[str, FeatureSet]:
    """Every complete feature set (in tag order), each as the rows of the cells labels.json lists
    (a set of every cell, features/final, is read for those rows only)."""
    found = sorted(list_tags(layout.features_root), key=tags.sort_key)
    if not found:
        raise MissingInputError("features", layout.features_root, "features")
    expected = np.asarray(labels["indices"], np.int64)
    return {tag: load_features(layout.features(tag), rows=expected) for tag in found}


def final_weights(layout: RunLayout) -> Path:
    """The weights behind features/final (possibly `features --checkpoint`), else the latest checkpoint."""
    index = read_index(layout.features(tags.FINAL))
    if index and index.get("checkpoint") and Path(index["checkpoint"]).is_file():
        return Path(index["checkpoint"])
    return layout.latest_checkpoint


def write_bad_images(layout: RunLayout, step: str, bad: list[tuple[str, str]]) -> None:
    """bad_images.json: every image (or field of view) `step` skipped, as (path, reason) pairs, with
    one warning counting them by reason; removed when there is none."""
    if not bad:
        layout.bad_images.unlink(missing_ok=True)
        return
    write_json_atomic(layout.bad_images, {"step": step, "count": len(bad),
                                          "images": [{"path": path, "reason": reason} for path, reason in bad]})
    kinds = Counter(reason.split(":")[0].split("(")[0].strip() for _, reason in bad)
    log.warning("skipped %d bad images (%s); details in %s", len(bad),
                ", ".join(f"{n} {k}" for k, n in kinds.most_common()), layout.bad_images)


def bad_image_paths(layout: RunLayout, step: str = "prepare") -> set[str]:
    """Paths an earlier step (`step`: prepare, or ingest for bad fields of view) reported as unreadable
    (bad_images.json), to be left out."""
    if not layout.bad_images.exists():
        return set()
    report = read_json(layout.bad_images, "bad-image report", step, ("images",))
    images = report["images"]
    if not isinstance(images, list) or not all(isinstance(entry, dict) and "path" in entry for entry in images):
        raise DamagedFileError(layout.bad_images, 'does not list its images as objects with a "path"', rerun(step))
    return {entry["path"] for entry in images}


def read_metrics(layout: RunLayout) -> list[dict[str, Any]]:
    """metrics.jsonl as records (none when absent). A line that is not a JSON object (a truncated
    last line while pretraining writes, or damage) is skipped, with one warning naming the lines."""
    if not layout.metrics.is_file():
        return []
    records, skipped = [], []
    text = layout.metrics.read_bytes().decode("utf-8", errors="replace")
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if isinstance(record, dict):
            records.append(record)
        else:
            skipped.append(number)
    if skipped:
        shown = ", ".join(map(str, skipped[:5])) + (", ..." if len(skipped) > 5 else "")
        log.warning("%s: skipped %d line(s) that are not JSON records (line %s)", layout.metrics, len(skipped), shown)
    return records


def read_timings(layout: RunLayout) -> dict[str, float]:
    """timings.json: each step's last wall time; a damaged one names the fix (any pipeline step)."""
    remedy = "rerun any pipeline step (`python -m training <step>`), which moves it aside and starts a new one"
    timings = parse_json(layout.timings, remedy) if layout.timings.exists() else {}
    if not isinstance(timings, dict):
        raise DamagedFileError(layout.timings, "is not a JSON object", remedy)
    return timings


def timings_to_update(layout: RunLayout) -> dict[str, float]:
    """The timings a step merges its own into: a damaged timings.json is moved aside (with a
    warning) and a new one started, so that it cannot fail every step after its work is done."""
    try:
        return read_timings(layout)
    except DamagedFileError as exc:
        aside = set_aside_path(layout.timings)
        layout.timings.rename(aside)
        log.warning("%s %s: moved aside to %s; starting a new one", layout.timings, exc.problem, aside.name)
        return {}
