"""Open the dataset a config points at, as TIFF folder or packed array, behind one interface.

`open_dataset(config)[i]` gives `(image (C, H, W) float32 in [0, 1], label)`: the selected channels,
each min-max scaled per image as scDINO does. A constant channel scales to 0 rather than NaN.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from training.config import Config
from training.data.folders.index import ImageIndex, expected_format, scan_images
from training.data.store.format import check_not_half_packed, is_packed
from training.data.store.read import PackedImages
from training.data.tiff import BadImage, read_image
from training.errors import MissingInputError, UserError
from training.rundir import RunLayout
from training.rundir.artifacts import bad_image_paths

log = logging.getLogger(__name__)


class BadImageError(UserError):
    """A bad image met at read time under data.on_bad_image=fail."""

    def __init__(self, bad: BadImage) -> None:
        super().__init__(
            f"bad image {bad.path}: {bad.reason}; fix or remove it, or set data.on_bad_image=skip"
        )
        self.path, self.reason = bad.path, bad.reason


class TiffImages:
    """Read access to a folder of TIFFs, with the same methods as PackedImages."""

    uniform_shape = None

    def __init__(self, root: Path, index: ImageIndex, channel_axis: str) -> None:
        self.root = Path(root)
        self.paths = index.paths
        self.labels = np.asarray(index.labels, dtype=np.int64)
        self.class_names = index.class_names
        self.channel_axis = channel_axis
        self.channels, _ = expected_format(self.root, index, channel_axis)

    def __len__(self) -> int:
        return len(self.paths)

    def read(self, i: int) -> np.ndarray:
        try:
            image = read_image(self.root / self.paths[i], self.channel_axis)
            if image.shape[0] != self.channels:
                reason = f"wrong shape: {image.shape[0]} channels, the dataset has {self.channels}"
                raise BadImage(self.paths[i], reason)
            return image
        except BadImage as bad:
            bad.path = self.paths[i]
            raise

    def read_batch(self, indices: np.ndarray) -> list[np.ndarray]:
        return [self.read(int(i)) for i in indices]

    def batch_categories(self) -> None:
        """A TIFF folder has no per-cell table, so no batch column."""
        return None


def dataset_step(config: Config) -> str:
    """The step that writes the run's packed dataset, as the config tells it: `ingest` when it names a
    load table (slurm/submit_pipeline.sh then starts the chain with ingest), else `prepare`. The
    packed index's own record overrides it where it can be read (packed.writer_step)."""
    return "ingest" if config.ingest.table else "prepare"


def resolve_source(config: Config) -> tuple[str, Path]:
    """("packed", folder) or ("tiff", root), following data.loader ("auto" prefers packed). A run
    whose dataset `ingest` writes has no TIFF folder to fall back on: its packed dataset must be there."""
    source, packed = Path(config.data.source), RunLayout.from_config(config).packed
    if config.data.loader == "tiff":
        if is_packed(source):
            raise UserError(f"data.loader=tiff but data.source {source} is a packed dataset")
        return "tiff", source
    step = dataset_step(config)
    check_not_half_packed(packed, step)
    for folder in (packed, source):
        if is_packed(folder):
            return "packed", folder
    if config.data.loader in ("packed", "dali") or step == "ingest":
        raise MissingInputError("packed dataset", packed, step)
    return "tiff", source


def open_images(config: Config) -> PackedImages | TiffImages:
    """Raw (C, H, W) access to every image of the configured dataset, all channels, with the labels
    and batches data.label_column and data.batch_column name."""
    kind, folder = resolve_source(config)
    if kind == "packed":
        images = PackedImages(folder, label_column=config.data.label_column, batch_column=config.data.batch_column,
                              guess=dataset_step(config))
    else:
        if config.data.label_column or config.data.batch_column:
            raise UserError(f"data.label_column and data.batch_column name columns of a packed dataset's per-cell "
                            f"table, and {folder} is a TIFF folder: run `python -m training prepare` first")
        index = scan_images(folder, config.data.folder_depth_for_labels)
        images = TiffImages(folder, index.without(bad_image_paths(RunLayout.from_config(config))),
                            config.data.channel_axis)
    log.info("dataset: %d images, %d classes, %s form at %s", len(images), len(images.class_names), kind, folder)
    check_channels(images, config)
    return images


def paths_of(images: PackedImages | TiffImages, rows: np.ndarray) -> list[str]:
    """The paths of some cells, without listing every path of the dataset."""
    paths = images.paths
    return paths.take(rows) if hasattr(paths, "take") else [paths[int(i)] for i in rows]


def check_channels(images: PackedImages | TiffImages, config: Config) -> None:
    """Fail early, with the fix, when data.channels asks for channels the images lack."""
    needed, have = max(config.data.channel_indices) + 1, images.channels
    if have and have < needed:
        raise UserError(
            f"data.channels={config.data.channels!r} needs {needed} channels but the images have "
            f"{have}: choose channels among 0..{have - 1}"
        )


def minmax_scale(images: torch.Tensor) -> torch.Tensor:
    """Per-image, per-channel min-max scaling of (..., H, W) to [0, 1], in place on float input."""
    low = images.amin(dim=(-2, -1), keepdim=True)
    high = images.amax(dim=(-2, -1), keepdim=True)
    span = high - low
    images.sub_(low).div_(torch.where(span > 0, span, torch.ones_like(span)))
    return images


def to_scaled_tensor(raw: np.ndarray, channel_indices: tuple[int, ...]) -> torch.Tensor:
    """Select channels of a (C, H, W) or (B, C, H, W) raw array, as min-max scaled float32."""
    selected = np.take(raw, channel_indices, axis=-3).astype(np.float32)
    return minmax_scale(torch.from_numpy(selected))


class CellDataset(Dataset):
    """Single images for analysis steps: `ds[i] -> (image (C, H, W) in [0, 1], label)`."""

    def __init__(self, images: PackedImages | TiffImages, channel_indices: tuple[int, ...]) -> None:
        self.images = images
        self.channel_indices = tuple(channel_indices)
        self.class_names = images.class_names
        self.labels = images.labels
        self.paths = images.paths
        self.in_chans = len(self.channel_indices)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        try:
            raw = self.images.read(int(i))
        except BadImage as bad:
            raise BadImageError(bad) from None
        return to_scaled_tensor(raw, self.channel_indices), int(self.labels[i])


def open_dataset(config: Config) -> CellDataset:
    """The configured dataset (TIFF folder or packed, per data.loader) as a torch Dataset."""
    return CellDataset(open_images(config), config.data.channel_indices)
