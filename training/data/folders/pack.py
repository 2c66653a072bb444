"""Pack a folder of single-cell TIFFs (scDINO's class folders) into a packed dataset.

`prepare` packs slices of the sorted image list into parts (`pack_part`: every image read by a few
threads, written into one part, training/data/store/write.py), one per task of a Slurm array or all
in one process, and merges them into <run>/packed (training/data/store/merge.py). `pack_images`
does both in one call. Each cell's table row holds its path and its class folder (Metadata_Class).
"""

from __future__ import annotations

import logging
import shutil
from contextlib import closing
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from tqdm import tqdm

from training.data.folders.index import VOTE_SAMPLE, ImageIndex, expected_format
from training.data.read_ahead import read_in_order
from training.data.store.cells import CLASS_COLUMN
from training.data.store.merge import merge_parts
from training.data.store.write import PartWriter
from training.data.tiff import BadImage, ChannelAxis, read_image
from training.writes.diskspace import require_free

log = logging.getLogger(__name__)

READ_THREADS, READ_AHEAD = 8, 256
"""Threads reading files, and how many images they may read ahead of the writer."""


def estimated_bytes(root: Path, index: ImageIndex, rows: range, channel_axis: ChannelAxis, dtype: np.dtype) -> int:
    """The packed size of `rows`, as if each image were as large as the first readable one."""
    for rel in index.paths[rows.start:rows.start + VOTE_SAMPLE]:
        try:
            return read_image(root / rel, channel_axis).size * np.dtype(dtype).itemsize * len(rows)
        except BadImage:
            continue
    return 0


def conform(image: np.ndarray, channels: int, path: str) -> np.ndarray:
    """Check one image against the dataset's channel count."""
    if image.shape[0] != channels:
        raise BadImage(path, f"wrong shape: {image.shape[0]} channels, the dataset has {channels}")
    return image


def read_all(root: Path, paths: list[str], channel_axis: ChannelAxis) -> Iterator[np.ndarray | BadImage]:
    """Every image in order, read by READ_THREADS threads at most READ_AHEAD ahead (read_ahead.py)."""
    def read(rel: str) -> np.ndarray | BadImage:
        try:
            return read_image(root / rel, channel_axis)
        except BadImage as bad:
            bad.path = rel
            return bad

    return read_in_order(read, paths, threads=READ_THREADS, ahead=READ_AHEAD)


def pack_part(root: Path, index: ImageIndex, rows: range, part_dir: Path, *, channel_axis: ChannelAxis,
              on_bad: Callable[[BadImage], None], identity: dict | None = None) -> dict:
    """Pack the images `rows` of `index` into one part; returns its part.json, which lists the bad
    images (path and reason). `on_bad(bad)` is called for each; it raises to stop (policy "fail")."""
    root = Path(root)
    channels, dtype = expected_format(root, index, channel_axis)
    require_free(part_dir.parent, estimated_bytes(root, index, rows, channel_axis, dtype), "the packed images")
    writer = PartWriter(part_dir, channels=channels, dtype=dtype)
    bad: list[BadImage] = []
    paths = [index.paths[i] for i in rows]
    with closing(read_all(root, paths, channel_axis)) as results:
        for i, result in zip(rows, tqdm(results, total=len(paths), desc="prepare", unit="img")):
            try:
                if isinstance(result, BadImage):
                    raise result
                image = conform(result, channels, index.paths[i])
            except BadImage as found:
                on_bad(found)
                bad.append(found)
                continue
            writer.append(image, index.paths[i], {CLASS_COLUMN: index.class_names[index.labels[i]]})
    return writer.finish(bad=[{"path": b.path, "reason": b.reason} for b in bad], identity=identity)


def pack_images(root: Path, index: ImageIndex, out_dir: Path, *, channel_axis: ChannelAxis,
                on_bad: Callable[[BadImage], None], folder_depth_for_labels: int = 0) -> list[BadImage]:
    """Pack every good image of `index` into out_dir (atomically: the merge swaps a finished folder
    in); returns the bad images."""
    out_dir = Path(out_dir)
    part = out_dir.with_name(f".{out_dir.name}.part")
    try:
        info = pack_part(root, index, range(len(index)), part, channel_axis=channel_axis, on_bad=on_bad)
        merge_parts([part], out_dir, source=str(root), folder_depth_for_labels=folder_depth_for_labels)
    finally:
        shutil.rmtree(part, ignore_errors=True)
    return [BadImage(b["path"], b["reason"]) for b in info["bad"]]
