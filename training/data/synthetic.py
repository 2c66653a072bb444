"""A synthetic single-cell dataset: N-channel 16-bit TIFFs of cell-like objects in class folders.

Classes differ in what a good representation should pick up: cell size and elongation, nucleus
size and position, the texture (granularity) of the cytoplasm, and where each marker channel is
expressed (nucleus, cytoplasm, membrane) and how strongly. Nuisance variation that it should
ignore: position, rotation, global brightness, per-channel gain, background, noise and debris.
Every class overlaps the others in any single feature, so raw pixels do clearly worse than a
representation that combines shape, texture and marker localisation.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tifffile
from tqdm import tqdm

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Phenotype:
    """Class-level means of the generative features (each image draws around them)."""

    name: str
    radius: float
    elongation: float
    nucleus_fraction: float
    nucleus_offset: float
    grain_scale: float
    grain_amount: float
    marker_where: tuple[float, float, float]
    """Marker (channel 3) weight in nucleus, cytoplasm, membrane."""
    marker_strength: float
    second_marker: float


PHENOTYPES = (
    Phenotype("round_central", 12.0, 1.10, 0.48, 0.05, 1.0, 0.20, (1.0, 0.3, 0.1), 0.7, 0.35),
    Phenotype("polar_granular", 12.5, 1.20, 0.40, 0.40, 2.0, 0.55, (0.4, 1.0, 0.2), 0.6, 0.60),
    Phenotype("elongated", 12.0, 1.55, 0.44, 0.15, 1.4, 0.30, (0.3, 0.4, 1.0), 0.6, 0.45),
    Phenotype("large_nucleus", 13.0, 1.25, 0.58, 0.10, 1.0, 0.30, (1.0, 0.6, 0.2), 0.45, 0.65),
    Phenotype("small_speckled", 11.0, 1.20, 0.44, 0.30, 0.7, 0.65, (0.4, 0.7, 0.6), 0.65, 0.50),
    Phenotype("flat_dim", 13.5, 1.40, 0.38, 0.25, 1.7, 0.15, (0.6, 0.6, 0.4), 0.4, 0.30),
)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1 + np.tanh(0.5 * x))


def _texture(rng: np.random.Generator, n: int, size: int, scale: float) -> np.ndarray:
    """Band-limited noise fields (n, size, size) with unit std; `scale` is the grain size in px."""
    white = rng.standard_normal((n, size, size)).astype(np.float32)
    freq = np.fft.fftfreq(size)
    gain = np.exp(-2 * (np.pi * scale) ** 2 * (freq[:, None] ** 2 + freq[None, :] ** 2))
    field = np.fft.ifft2(np.fft.fft2(white) * gain).real.astype(np.float32)
    return field / (field.std(axis=(1, 2), keepdims=True) + 1e-6)


def _jitter(rng: np.random.Generator, mean: float, spread: float, n: int) -> np.ndarray:
    return (mean * np.exp(spread * rng.standard_normal(n))).astype(np.float32)[:, None, None]


def _shapes(rng: np.random.Generator, p: Phenotype, n: int, size: int) -> dict[str, np.ndarray]:
    """Body, membrane ring and nucleus masks of n randomly placed and rotated cells."""
    grid = np.arange(size, dtype=np.float32)
    y, x = grid[None, :, None], grid[None, None, :]
    cx = size / 2 + rng.uniform(-0.14, 0.14, n).astype(np.float32)[:, None, None] * size
    cy = size / 2 + rng.uniform(-0.14, 0.14, n).astype(np.float32)[:, None, None] * size
    theta = rng.uniform(0, np.pi, n).astype(np.float32)[:, None, None]
    u = (x - cx) * np.cos(theta) + (y - cy) * np.sin(theta)
    v = -(x - cx) * np.sin(theta) + (y - cy) * np.cos(theta)
    radius = _jitter(rng, p.radius * size / 50, 0.12, n)
    elong = _jitter(rng, p.elongation, 0.10, n)
    a, b = radius * np.sqrt(elong), radius / np.sqrt(elong)
    rc = np.sqrt((u / a) ** 2 + (v / b) ** 2)
    frac = _jitter(rng, p.nucleus_fraction, 0.10, n)
    offset = (p.nucleus_offset + 0.08 * rng.standard_normal(n)).astype(np.float32)[:, None, None]
    side = rng.choice([-1.0, 1.0], n).astype(np.float32)[:, None, None]
    rn = np.sqrt(((u - side * offset * a * (1 - frac)) / (frac * a)) ** 2 + (v / (frac * b)) ** 2)
    return {
        "body": _sigmoid((1 - rc) * 10),
        "ring": np.exp(-(((rc - 1) * radius) / 1.3) ** 2),
        "nucleus": _sigmoid((1 - rn) * 8),
    }


def _render(rng: np.random.Generator, p: Phenotype, n: int, size: int) -> np.ndarray:
    """Five noiseless channels (n, 5, size, size): membrane, cytoplasm, DNA, marker, second marker."""
    m = _shapes(rng, p, n, size)
    body, ring, nucleus = m["body"], m["ring"], m["nucleus"]
    cytoplasm = body * (1 - 0.7 * nucleus)
    grains = np.clip(_texture(rng, n, size, p.grain_scale), 0, None)
    amount = _jitter(rng, p.grain_amount, 0.25, n)
    fine = _texture(rng, n, size, 0.8)
    w_nuc, w_cyto, w_mem = p.marker_where
    marker = (w_nuc * nucleus + w_cyto * cytoplasm * (1 + amount * grains) + w_mem * ring)
    strength = _jitter(rng, p.marker_strength, 0.25, n)
    second = _jitter(rng, p.second_marker, 0.25, n) * body * (1 + 0.5 * np.clip(_texture(rng, n, size, 2.5), 0, None))
    return np.stack([
        ring + 0.25 * body * (1 + 0.3 * fine),
        cytoplasm * (1 + amount * grains),
        nucleus * (1 + 0.15 * fine),
        strength * marker,
        second,
    ], axis=1)


def _nuisance(rng: np.random.Generator, clean: np.ndarray) -> np.ndarray:
    """Brightness, per-channel gain, background, debris and noise, then 16-bit quantisation."""
    n, c, size, _ = clean.shape
    def per_channel(low: float, high: float) -> np.ndarray:
        return rng.uniform(low, high, (n, c, 1, 1)).astype(np.float32)

    gain = np.exp(0.35 * rng.standard_normal((n, 1, 1, 1)) + 0.2 * rng.standard_normal((n, c, 1, 1)))
    image = clean * gain.astype(np.float32) + per_channel(0.02, 0.2)
    debris = _debris(rng, n, size)[:, None] * per_channel(0.0, 0.8)
    image += debris * (rng.random((n, 1, 1, 1)) < 0.35)
    shot = 0.05 * np.sqrt(np.clip(image, 0, None))
    image += (per_channel(0.02, 0.07) + shot) * rng.standard_normal(image.shape, dtype=np.float32)
    return np.clip(image * 12000 + 300, 0, 65535).astype(np.uint16)


def _debris(rng: np.random.Generator, n: int, size: int) -> np.ndarray:
    """A blob of a neighbouring cell near a random edge: spatial clutter without class meaning."""
    grid = np.arange(size, dtype=np.float32)
    angle = rng.uniform(0, 2 * np.pi, n)
    cx = (size / 2 + 0.55 * size * np.cos(angle))[:, None, None]
    cy = (size / 2 + 0.55 * size * np.sin(angle))[:, None, None]
    r = rng.uniform(0.12, 0.25, n)[:, None, None] * size
    dist2 = (grid[None, None, :] - cx) ** 2 + (grid[None, :, None] - cy) ** 2
    return np.exp(-dist2 / (2 * r ** 2)).astype(np.float32)


def _mix_channels(rng: np.random.Generator, base: np.ndarray, channels: int) -> np.ndarray:
    """Any channel count from the five base channels: the first few, or extra fixed mixtures."""
    if channels <= base.shape[1]:
        return base[:, :channels]
    weights = rng.dirichlet(np.ones(base.shape[1]), size=channels - base.shape[1]).astype(np.float32)
    extra = np.einsum("kc,nchw->nkhw", weights, base)
    return np.concatenate([base, extra], axis=1)


def generate(classes: int = 5, per_class: int = 200, channels: int = 5, size: int = 50,
             seed: int = 0) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Images (N, C, size, size) uint16, labels (N,) and class names; deterministic by seed."""
    if not 1 <= classes <= len(PHENOTYPES):
        raise ValueError(f"classes must be between 1 and {len(PHENOTYPES)}, got {classes}")
    rng = np.random.default_rng(seed)
    images, labels = [], []
    for label, phenotype in enumerate(PHENOTYPES[:classes]):
        clean = _render(rng, phenotype, per_class, size)
        images.append(_nuisance(rng, _mix_channels(np.random.default_rng([seed, 7]), clean, channels)))
        labels.append(np.full(per_class, label))
    return np.concatenate(images), np.concatenate(labels), [p.name for p in PHENOTYPES[:classes]]


def write_tiff(path: Path, array: np.ndarray, channel_axis: str = "last") -> None:
    """Write a multi-channel image as plain grey samples (never guessed to be RGB)."""
    planar = "contig" if channel_axis == "last" or array.ndim != 3 else "separate"
    tifffile.imwrite(path, np.ascontiguousarray(array), photometric="minisblack", planarconfig=planar)


def write_dataset(out: Path, classes: int = 5, per_class: int = 200, channels: int = 5, size: int = 50,
                  seed: int = 0, channel_axis: str = "last") -> int:
    """Write out/<class>/<class>_<i>.tif (channels last, as scDINO's data, unless told otherwise)."""
    images, labels, names = generate(classes, per_class, channels, size, seed)
    out = Path(out)
    for name in names:
        (out / name).mkdir(parents=True, exist_ok=True)
    for i, (image, label) in enumerate(tqdm(list(zip(images, labels)), desc="synth-data", unit="img")):
        array = np.moveaxis(image, 0, -1) if channel_axis == "last" else image
        write_tiff(out / names[label] / f"{names[label]}_{i:05d}.tif", array, channel_axis)
    log.info("wrote %d images of %d classes (%d channels, %dx%d) to %s",
             len(images), classes, channels, size, size, out)
    return len(images)


CORRUPT_REASONS = {
    "corrupt_empty.tif": "empty file",
    "corrupt_truncated.tif": "truncated",
    "corrupt_garbage.tif": "corrupt or truncated TIFF",
    "corrupt_channels.tif": "channels, the dataset has",
    "corrupt_blank.tif": "blank image",
    "corrupt_ndim.tif": "wrong shape",
}
"""File name -> a phrase the reader's reason for rejecting it contains."""


def write_corrupt_files(folder: Path, channels: int = 5, size: int = 50, seed: int = 0) -> dict[str, str]:
    """Write one of each kind of bad image into `folder`; returns CORRUPT_REASONS."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    good = rng.integers(0, 60000, (size, size, channels), dtype=np.uint16)
    (folder / "corrupt_empty.tif").write_bytes(b"")
    write_tiff(folder / "corrupt_truncated.tif", good)
    data = (folder / "corrupt_truncated.tif").read_bytes()
    (folder / "corrupt_truncated.tif").write_bytes(data[: len(data) // 2])
    (folder / "corrupt_garbage.tif").write_bytes(rng.integers(0, 256, 4096, dtype=np.uint8).tobytes())
    write_tiff(folder / "corrupt_channels.tif", good[..., :2] if channels > 2 else np.concatenate([good] * 2, -1))
    write_tiff(folder / "corrupt_blank.tif", np.zeros_like(good))
    tifffile.imwrite(folder / "corrupt_ndim.tif", rng.integers(0, 60000, (2, 3, size, size), dtype=np.uint16),
                     photometric="minisblack")
    return dict(CORRUPT_REASONS)
