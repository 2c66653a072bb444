"""The packed dataset: every image in one flat memory-mapped file, plus index.json.

    packed/images.bin   raw pixels, each image stored channel-first (C, H, W) in C order, back to back
    packed/index.json   paths, labels, class_names, shapes, offsets (in elements), dtype, channels,
                        and images.bin's size and CRC-32 ("data_bytes", "data_crc32", computed while
                        writing)

Integrity: opening checks the index (parses, its lists agree, every image lies inside the data) and
images.bin's size, in microseconds; the CRC-32 of every byte is checked on request (`verify`,
`python -m training prepare --verify`). An index written before the checksum was recorded gets
the size check (total_elements x item size) and nothing more. Damage is a DamagedFileError that
names the file and says to rerun `prepare`.

Images of different sizes are supported (offsets + shapes); when all share one shape the reader
exposes the file as a single (N, C, H, W) array so a batch is one fancy-indexing copy. The memory
map is opened lazily in each process (DataLoader workers share the page cache, not Python objects).

All images are stored in one pixel type: their own when they share it (the usual case), else the
smallest type that holds every image (float32 for uint16 among float32; exact up to 32-bit types).
Every image is min-max scaled on its own when read, so the stored type changes no result.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import zlib
from collections import Counter, deque
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from tqdm import tqdm

from training.data.index import ImageIndex
from training.data.tiff import BadImage, ChannelAxis, read_image
from training.errors import DamagedFileError
from training.rundir.integrity import check_crc32, check_size, crc32_hex, parse_json, require_keys, rerun

log = logging.getLogger(__name__)

FORMAT = "scdino-packed-v1"
IMAGES_FILE = "images.bin"
INDEX_FILE = "index.json"
VOTE_SAMPLE = 32
"""How many leading images vote on the dataset's channel count and give its first pixel type."""
WIDEN_CHUNK = 1 << 24
"""Elements converted at a time when the packed file is rewritten in a wider pixel type."""


REMEDY = rerun("prepare")
INDEX_KEYS = ("format", "dtype", "channels", "paths", "labels", "class_names", "shapes", "offsets", "total_elements")


def is_packed(folder: Path) -> bool:
    return (Path(folder) / INDEX_FILE).is_file() and (Path(folder) / IMAGES_FILE).is_file()


def check_not_half_packed(folder: Path) -> None:
    """DamagedFileError when the run's packed folder holds one of its two files but not the other."""
    index, images = Path(folder) / INDEX_FILE, Path(folder) / IMAGES_FILE
    if index.is_file() != images.is_file():
        present, absent = (index, images) if index.is_file() else (images, index)
        raise DamagedFileError(absent, f"is missing ({present.name} is there)", REMEDY)


@dataclass
class PackReport:
    """What `pack_images` wrote and what it had to leave out."""

    n_images: int = 0
    bad: list[BadImage] = field(default_factory=list)


def expected_format(root: Path, index: ImageIndex, channel_axis: ChannelAxis) -> tuple[int, np.dtype]:
    """The channel count most of the leading readable images have, and a pixel type that holds all
    of those images exactly (their own if they share one), so that a mixed folder rarely needs
    the packed file rewritten later."""
    votes: Counter = Counter()
    for rel in index.paths[: VOTE_SAMPLE * 2]:
        try:
            image = read_image(root / rel, channel_axis)
        except BadImage:
            continue
        votes[(image.shape[0], image.dtype.str)] += 1
        if sum(votes.values()) >= VOTE_SAMPLE:
            break
    if not votes:
        return 0, np.dtype(np.uint16)
    (channels, _), _ = votes.most_common(1)[0]
    types = [np.dtype(dtype) for n_channels, dtype in votes if n_channels == channels]
    return channels, np.result_type(*types)


def conform(image: np.ndarray, channels: int, path: str) -> np.ndarray:
    """Check one image against the dataset's channel count."""
    if image.shape[0] != channels:
        raise BadImage(path, f"wrong shape: {image.shape[0]} channels, the dataset has {channels}")
    return image


class PixelWriter:
    """Appends images to the flat pixel file in one type, widening the type when an image needs it.

    Widening rewrites what was written so far (once per new type, and only for a mixed folder);
    offsets count elements, not bytes, so those already recorded stay valid. The CRC-32 of the
    file is kept up to date as it is written (no second read).
    """

    def __init__(self, path: Path, dtype: np.dtype) -> None:
        self.path, self.dtype, self.elements, self.crc = Path(path), np.dtype(dtype), 0, 0
        self.file = open(self.path, "wb")

    def append(self, image: np.ndarray) -> int:
        """Write one image; returns its offset in elements."""
        if not np.can_cast(image.dtype, self.dtype, casting="safe"):
            self._widen(image.dtype)
        offset = self.elements
        data = image.astype(self.dtype, copy=False).tobytes()
        self.file.write(data)
        self.crc = zlib.crc32(data, self.crc)
        self.elements += image.size
        return offset

    def _widen(self, other: np.dtype) -> None:
        dtype = np.promote_types(self.dtype, other)
        log.info("pixel types differ (%s and %s): packing every image as %s", self.dtype, other, dtype)
        self.file.close()
        wider = self.path.with_name(self.path.name + ".wider")
        self.crc = 0
        with open(wider, "wb") as out:
            if self.elements:
                written = np.memmap(self.path, dtype=self.dtype, mode="r", shape=(self.elements,))
                for start in range(0, self.elements, WIDEN_CHUNK):
                    data = written[start:start + WIDEN_CHUNK].astype(dtype).tobytes()
                    out.write(data)
                    self.crc = zlib.crc32(data, self.crc)
                del written
        os.replace(wider, self.path)
        self.dtype, self.file = dtype, open(self.path, "ab")

    def close(self) -> None:
        self.file.close()


READ_THREADS, READ_AHEAD = 8, 256
"""Threads reading files for `prepare`, and how many images they may read ahead of the writer."""


def _read_all(root: Path, index: ImageIndex, channel_axis: ChannelAxis) -> Iterator[np.ndarray | BadImage]:
    """Read images in order with a few threads, which hides per-file latency on FSx/S3 mounts.

    At most READ_AHEAD images wait in memory; closing the generator (a bad image under the `fail`
    policy, an interrupt) cancels the reads not yet started instead of finishing the whole folder.
    """
    def read(rel: str) -> np.ndarray | BadImage:
        try:
            return read_image(root / rel, channel_axis)
        except BadImage as bad:
            bad.path = rel
            return bad

    with ThreadPoolExecutor(max_workers=READ_THREADS) as pool:
        pending: deque[Future] = deque()
        try:
            for rel in index.paths:
                pending.append(pool.submit(read, rel))
                if len(pending) >= READ_AHEAD:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()


def _write_index(folder: Path, meta: dict) -> None:
    (folder / INDEX_FILE).write_text(json.dumps(meta))


def pack_images(root: Path, index: ImageIndex, out_dir: Path, *, channel_axis: ChannelAxis,
                on_bad: Callable[[BadImage], None], folder_depth_for_labels: int = 0) -> PackReport:
    """Pack all good images of `index` into out_dir atomically (temp folder, then rename).

    `on_bad(bad: BadImage)` is called for each bad image; it raises to stop (policy "fail").
    """
    root, out_dir = Path(root), Path(out_dir)
    channels, dtype = expected_format(root, index, channel_axis)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    report, kept, shapes, offsets = PackReport(), [], [], []
    try:
        with ExitStack() as stack:
            writer = PixelWriter(tmp / IMAGES_FILE, dtype)
            stack.callback(writer.close)
            results = stack.enter_context(closing(_read_all(root, index, channel_axis)))
            for i, result in enumerate(tqdm(results, total=len(index), desc="prepare", unit="img")):
                try:
                    if isinstance(result, BadImage):
                        raise result
                    image = conform(result, channels, index.paths[i])
                except BadImage as bad:
                    on_bad(bad)
                    report.bad.append(bad)
                    continue
                offsets.append(writer.append(image))
                kept.append(i)
                shapes.append(list(image.shape))
        _write_index(tmp, {
            "format": FORMAT, "dtype": writer.dtype.str, "channels": channels,
            "paths": [index.paths[i] for i in kept], "labels": [index.labels[i] for i in kept],
            "class_names": index.class_names, "shapes": shapes, "offsets": offsets,
            "total_elements": writer.elements, "source": str(root), "folder_depth_for_labels": folder_depth_for_labels,
            "data_bytes": writer.elements * writer.dtype.itemsize, "data_crc32": crc32_hex(writer.crc),
        })
        _replace_dir(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report.n_images = len(kept)
    return report


def _replace_dir(new: Path, target: Path) -> None:
    """Swap a finished folder into place; an existing one is removed only after the swap."""
    old = target.with_name(f".{target.name}.old-{os.getpid()}")
    if target.exists():
        target.rename(old)
    new.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def read_packed_index(folder: Path) -> dict:
    """index.json, checked to describe a packed dataset whose images all lie inside images.bin."""
    path = Path(folder) / INDEX_FILE
    meta = require_keys(parse_json(path, REMEDY), INDEX_KEYS, path, REMEDY)
    if meta["format"] != FORMAT:
        raise DamagedFileError(path, f"is not a {FORMAT} index (format {meta['format']!r})", REMEDY)
    try:
        np.dtype(meta["dtype"])
        shapes = np.asarray(meta["shapes"], dtype=np.int64).reshape(-1, 3)
        offsets = np.asarray(meta["offsets"], dtype=np.int64)
    except (TypeError, ValueError) as exc:
        raise DamagedFileError(path, f"holds unreadable dtype, shapes or offsets ({exc})", REMEDY) from None
    lengths = {len(meta["paths"]), len(meta["labels"]), len(shapes), len(offsets)}
    ends = offsets + shapes.prod(axis=1)
    if len(lengths) != 1 or (len(ends) and (ends.max() > int(meta["total_elements"]) or offsets.min() < 0)):
        raise DamagedFileError(path, "is inconsistent (paths, labels, shapes and offsets disagree, or an image "
                               "lies beyond total_elements)", REMEDY)
    return meta


class PackedImages:
    """Read access to a packed dataset; cheap to pickle (the memory map is reopened per process).

    Opening checks the index and the size of images.bin (DamagedFileError); `verify` its CRC-32."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        meta = read_packed_index(self.folder)
        expected = meta.get("data_bytes", int(meta["total_elements"]) * np.dtype(meta["dtype"]).itemsize)
        check_size(self.folder / IMAGES_FILE, expected, INDEX_FILE, REMEDY)
        self.meta = meta
        self.dtype = np.dtype(meta["dtype"])
        self.paths: list[str] = meta["paths"]
        self.labels = np.asarray(meta["labels"], dtype=np.int64)
        self.channels = int(meta["channels"])
        self.class_names: list[str] = meta["class_names"]
        self.shapes = np.asarray(meta["shapes"], dtype=np.int64).reshape(-1, 3)
        self.offsets = np.asarray(meta["offsets"], dtype=np.int64)
        unique = {tuple(s) for s in self.shapes.tolist()}
        self.uniform_shape: tuple[int, int, int] | None = unique.pop() if len(unique) == 1 else None
        self._flat: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.paths)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_flat": None}

    @property
    def flat(self) -> np.ndarray:
        if self._flat is None:
            total = int(self.meta["total_elements"])
            self._flat = np.memmap(self.folder / IMAGES_FILE, dtype=self.dtype, mode="r", shape=(max(total, 1),))
        return self._flat

    def verify(self) -> bool:
        """Check every byte of images.bin against the CRC-32 in the index (a full read: about a
        second per few GB from the page cache); False when the index records none (an older pack)."""
        if "data_crc32" not in self.meta:
            return False
        start = time.perf_counter()
        check_crc32(self.folder / IMAGES_FILE, self.meta["data_crc32"], INDEX_FILE, REMEDY)
        log.info("%s matches its CRC-32 (%.1f GB in %.1f s)", self.folder / IMAGES_FILE,
                 self.meta["data_bytes"] / 1e9, time.perf_counter() - start)
        return True

    def read(self, i: int) -> np.ndarray:
        """Image i as a (C, H, W) array view of the memory map."""
        c, h, w = self.shapes[i]
        start = self.offsets[i]
        return self.flat[start:start + c * h * w].reshape(c, h, w)

    def read_batch(self, indices: np.ndarray) -> np.ndarray | list[np.ndarray]:
        """A (B, C, H, W) copy when all images share a shape, else a list of (C, H, W) arrays."""
        if self.uniform_shape is not None:
            stack = self.flat[: len(self) * int(np.prod(self.uniform_shape))]
            return np.asarray(stack.reshape(len(self), *self.uniform_shape)[np.asarray(indices)])
        return [np.asarray(self.read(int(i))) for i in indices]
