"""Find the images of a dataset and their class labels from folder names (scDINO's layout), and the
format most of them share (`expected_format`).

`root/<class>/<image>.tif` gives the label "<class>" at folder_depth_for_labels=0 (the folder that
holds the image); with deeper trees (`root/<donor>/<class>/<plate>/<image>.tif`) the depth counts
upwards from the image: 1 gives "<class>", 2 "<donor>", as in scDINO.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from training.data.tiff import BadImage, ChannelAxis, read_image
from training.errors import UserError

log = logging.getLogger(__name__)

TIFF_SUFFIXES = (".tif", ".tiff")
VOTE_SAMPLE = 32
"""How many leading images vote on the dataset's channel count and give its first pixel type."""


@dataclass(frozen=True)
class ImageRecord:
    """One image: its path relative to the dataset root and its integer label."""

    path: str
    label: int


@dataclass(frozen=True)
class ImageIndex:
    """All images of a dataset in a fixed (sorted) order; indices into it are dataset indices."""

    paths: list[str]
    labels: list[int]
    class_names: list[str]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> ImageRecord:
        return ImageRecord(self.paths[i], self.labels[i])

    def without(self, excluded: set[str]) -> "ImageIndex":
        """The same index minus some paths (e.g. images `prepare` found to be bad)."""
        keep = [i for i, p in enumerate(self.paths) if p not in excluded]
        return ImageIndex([self.paths[i] for i in keep], [self.labels[i] for i in keep], self.class_names)


def label_of(relative: Path, folder_depth_for_labels: int) -> str:
    """The class name of one image: the folder `depth` levels above the image's own."""
    folders = relative.parts[:-1]
    if len(folders) <= folder_depth_for_labels:
        raise UserError(
            f"image {relative} has no class folder at data.folder_depth_for_labels="
            f"{folder_depth_for_labels}: put images in <root>/<class>/ folders or lower the depth"
        )
    return folders[-1 - folder_depth_for_labels]


def scan_images(root: Path, folder_depth_for_labels: int) -> ImageIndex:
    """List every .tif/.tiff below root (sorted, so indices are stable) with its label."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(
            f"image folder not found: {root}: set data.source, or create the demo data with "
            "`python -m training synth-data --out <folder>`"
        )
    relatives = [Path(*parts) for parts in sorted(_tiff_parts(root))]
    if not relatives:
        raise UserError(f"no .tif/.tiff images found under {root}")
    names = [label_of(rel, folder_depth_for_labels) for rel in relatives]
    class_names = sorted(set(names))
    to_label = {name: i for i, name in enumerate(class_names)}
    log.info("found %d images in %d classes under %s", len(relatives), len(class_names), root)
    return ImageIndex([rel.as_posix() for rel in relatives], [to_label[n] for n in names], class_names)


def _tiff_parts(root: Path) -> list[tuple[str, ...]]:
    """The path components, below root, of every regular .tif/.tiff file (a symbolic link to a file
    counts; one to a folder is not followed, as Path.rglob does not). The directory entries' types
    say what is a file: no stat per image, which on a parallel file system (FSx for Lustre) asks the
    storage servers for each file's size. Sorting the component tuples gives the order of sorted
    Paths, so dataset indices stay as they were."""
    found, pending = [], [((), root)]
    while pending:
        prefix, folder = pending.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(((*prefix, entry.name), Path(entry.path)))
                elif os.path.splitext(entry.name)[1].lower() in TIFF_SUFFIXES and entry.is_file():
                    found.append((*prefix, entry.name))
    return found


def expected_format(root: Path, index: ImageIndex, channel_axis: ChannelAxis) -> tuple[int, np.dtype]:
    """The channel count most of the leading readable images have, and a pixel type that holds all
    of those images exactly (their own if they share one), so that a mixed folder rarely needs
    the packed file rewritten later. Every task of an array votes on the same leading images."""
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
