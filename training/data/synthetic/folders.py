"""A synthetic single-cell dataset: N-channel 16-bit TIFFs of cell-like objects in class folders.

What defines a class is what a good representation of cells should pick up and what survives
DINO's augmentations (crops, flips, per-channel brightness, blur): where the marker (channel 3)
sits relative to the nucleus, cytoplasm and membrane (diffuse, nuclear, membrane, puncta, a polar
cap), the granularity of the cytoplasm (channel 1) and how far the nucleus sits from the centre of
the cell. What varies regardless of class, and dominates distances between raw pixels: position,
rotation, size and elongation of the cell and its nucleus, a second marker (channel 4) with its own
coarse texture, per-channel gain, background, noise and debris of neighbouring cells. A randomly
initialised network mostly measures how much of each channel is bright, which the size nuisance
scrambles, so a trained representation does clearly better than either baseline.

`render_cells` draws cells at a given centre and scale with their extents (label masks): the
synthetic screen (training/data/synthetic/plates.py) places them into larger fields of view.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tifffile
from tqdm import tqdm

from training.errors import UserError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Phenotype:
    """Class-level means of the generative features (each image draws around them)."""

    name: str
    nucleus_offset: float
    """Nucleus centre away from the cell centre, as a fraction of the free room (0 = central)."""
    grain_scale: float
    """Grain size (px) of the cytoplasm texture."""
    grain_amount: float
    marker_where: tuple[float, float, float, float, float]
    """Marker (channel 3) weight in nucleus, cytoplasm, membrane, puncta and a polar cap."""


PHENOTYPES = (
    Phenotype("nuclear", 0.10, 0.8, 0.35, (1.0, 0.10, 0.0, 0.0, 0.0)),
    Phenotype("membrane", 0.10, 0.8, 0.35, (0.05, 0.10, 1.0, 0.0, 0.0)),
    Phenotype("punctate", 0.10, 0.8, 0.35, (0.05, 0.10, 0.0, 1.0, 0.0)),
    Phenotype("polar", 0.55, 0.8, 0.35, (0.05, 0.10, 0.0, 0.0, 1.0)),
    Phenotype("granular", 0.10, 2.2, 1.2, (0.05, 0.60, 0.0, 0.0, 0.0)),
    Phenotype("diffuse", 0.30, 0.8, 0.10, (0.20, 0.60, 0.25, 0.0, 0.0)),
)

CELL_RADIUS = 10.0
"""Mean cell radius at 50 px; the size spread below is nuisance shared by every class."""
PUNCTA = 7
MASK_MARGIN = 1.0
"""A cell's extent (its label mask in a screen) reaches this many px beyond the middle of its membrane."""


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


def _frame(rng: np.random.Generator, n: int, size: int, centres: np.ndarray | None = None,
           cell_px: int | None = None) -> dict[str, np.ndarray]:
    """Cell coordinates (u along the long axis, v across) of n randomly rotated, sized cells in
    size x size images; `centres` (n, 2) as (x, y) in pixels, drawn near the middle when None.
    Cells are drawn at the scale they have in a `cell_px` image (default: `size`), CELL_RADIUS at 50."""
    cell_px = size if cell_px is None else cell_px
    grid = np.arange(size, dtype=np.float32)
    y, x = grid[None, :, None], grid[None, None, :]
    if centres is None:
        cx = size / 2 + rng.uniform(-0.24, 0.24, n).astype(np.float32)[:, None, None] * size
        cy = size / 2 + rng.uniform(-0.24, 0.24, n).astype(np.float32)[:, None, None] * size
    else:
        cx, cy = (np.asarray(centres, dtype=np.float32)[:, i, None, None] for i in (0, 1))
    theta = rng.uniform(0, 2 * np.pi, n).astype(np.float32)[:, None, None]
    radius = _jitter(rng, CELL_RADIUS * cell_px / 50, 0.22, n)
    elong = rng.uniform(1.0, 1.6, n).astype(np.float32)[:, None, None]
    u = (x - cx) * np.cos(theta) + (y - cy) * np.sin(theta)
    v = -(x - cx) * np.sin(theta) + (y - cy) * np.cos(theta)
    return {"u": u, "v": v, "a": radius * np.sqrt(elong), "b": radius / np.sqrt(elong), "radius": radius,
            "cell_px": cell_px}


def _puncta(rng: np.random.Generator, f: dict[str, np.ndarray]) -> np.ndarray:
    """A few small bright spots scattered over the cytoplasm."""
    n = f["u"].shape[0]
    angle = rng.uniform(0, 2 * np.pi, (n, PUNCTA, 1, 1))
    reach = rng.uniform(0.45, 0.85, (n, PUNCTA, 1, 1))
    pu = (reach * np.cos(angle) * f["a"][:, None]).astype(np.float32)
    pv = (reach * np.sin(angle) * f["b"][:, None]).astype(np.float32)
    sigma = 0.9 * f["cell_px"] / 50
    dist2 = (f["u"][:, None] - pu) ** 2 + (f["v"][:, None] - pv) ** 2
    return np.exp(-dist2 / (2 * sigma ** 2)).sum(axis=1).clip(0, 1.5)


def _compartments(rng: np.random.Generator, p: Phenotype, n: int, size: int,
                  centres: np.ndarray | None = None, cell_px: int | None = None) -> dict[str, np.ndarray]:
    """Body, membrane ring, nucleus, puncta and polar-cap masks of n cells, and each cell's extent:
    the pixels less than MASK_MARGIN px outside its membrane (the middle of the ring)."""
    f = _frame(rng, n, size, centres, cell_px)
    u, v, a, b = f["u"], f["v"], f["a"], f["b"]
    rc = np.sqrt((u / a) ** 2 + (v / b) ** 2)
    frac = _jitter(rng, 0.45, 0.12, n)
    offset = np.clip(p.nucleus_offset + 0.08 * rng.standard_normal(n), 0, 0.9).astype(np.float32)[:, None, None]
    side = rng.choice([-1.0, 1.0], n).astype(np.float32)[:, None, None]
    nu = u - side * offset * a * (1 - frac)
    rn = np.sqrt((nu / (frac * a)) ** 2 + (v / (frac * b)) ** 2)
    body = _sigmoid((1 - rc) * 10)
    cap_side = -side * (u / a)
    return {
        "body": body,
        "ring": np.exp(-(((rc - 1) * f["radius"]) / 1.3) ** 2),
        "nucleus": _sigmoid((1 - rn) * 8),
        "puncta": _puncta(rng, f) * body,
        "cap": body * _sigmoid((cap_side - 0.45) * 12),
        "extent": (rc - 1) * f["radius"] < MASK_MARGIN,
    }


def render_cells(rng: np.random.Generator, p: Phenotype, n: int, size: int, centres: np.ndarray | None = None,
                 cell_px: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Five noiseless channels (n, 5, size, size) of n cells of phenotype `p` (membrane, cytoplasm,
    DNA, marker, second marker) and their extents (n, size, size) bool; see _frame for the arguments."""
    m = _compartments(rng, p, n, size, centres, cell_px)
    body, nucleus = m["body"], m["nucleus"]
    cytoplasm = body * (1 - 0.8 * nucleus)
    grains = np.clip(_texture(rng, n, size, p.grain_scale), 0, None)
    textured = cytoplasm * (1 + _jitter(rng, p.grain_amount, 0.2, n) * grains)
    fine = _texture(rng, n, size, 0.8)
    parts = (nucleus, textured, m["ring"], m["puncta"], m["cap"])
    marker = sum(w * part for w, part in zip(p.marker_where, parts))
    second = body * (1 + 0.8 * np.clip(_texture(rng, n, size, 3.0), 0, None))
    return np.stack([
        m["ring"] + 0.25 * body * (1 + 0.3 * fine),
        textured,
        nucleus * (1 + 0.15 * fine),
        marker,
        second,
    ], axis=1), m["extent"]


def _nuisance(rng: np.random.Generator, clean: np.ndarray) -> np.ndarray:
    """Brightness, per-channel gain, debris and noise, then 16-bit quantisation.

    Background and noise scale with the gain, so that after per-image min-max scaling they look
    alike in every image: an offset that differs per image and channel survives every DINO
    augmentation and would be what self-supervision learns to tell images apart by.
    """
    n, c, size, _ = clean.shape
    def per_channel(low: float, high: float) -> np.ndarray:
        return rng.uniform(low, high, (n, c, 1, 1)).astype(np.float32)

    gain = np.exp(0.35 * rng.standard_normal((n, 1, 1, 1)) + 0.2 * rng.standard_normal((n, c, 1, 1)))
    debris = _debris(rng, n, size)[:, None] * per_channel(0.0, 0.4) * (rng.random((n, 1, 1, 1)) < 0.35)
    image = clean + per_channel(0.04, 0.06) + debris
    image += (0.03 + 0.04 * np.sqrt(np.clip(image, 0, None))) * rng.standard_normal(image.shape, dtype=np.float32)
    return np.clip(image * gain.astype(np.float32) * 12000 + 100, 0, 65535).astype(np.uint16)


def _debris(rng: np.random.Generator, n: int, size: int) -> np.ndarray:
    """A blob of a neighbouring cell near a random edge: spatial clutter without class meaning."""
    grid = np.arange(size, dtype=np.float32)
    angle = rng.uniform(0, 2 * np.pi, n)
    cx = (size / 2 + 0.55 * size * np.cos(angle))[:, None, None]
    cy = (size / 2 + 0.55 * size * np.sin(angle))[:, None, None]
    r = rng.uniform(0.12, 0.25, n)[:, None, None] * size
    dist2 = (grid[None, None, :] - cx) ** 2 + (grid[None, :, None] - cy) ** 2
    return np.exp(-dist2 / (2 * r ** 2)).astype(np.float32)


def mix_channels(rng: np.random.Generator, base: np.ndarray, channels: int) -> np.ndarray:
    """Any channel count from the five base channels (axis 1 of `base`): the first few, or extra
    fixed mixtures of all five."""
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
        clean, _ = render_cells(rng, phenotype, per_class, size)
        images.append(_nuisance(rng, mix_channels(np.random.default_rng([seed, 7]), clean, channels)))
        labels.append(np.full(per_class, label))
    return np.concatenate(images), np.concatenate(labels), [p.name for p in PHENOTYPES[:classes]]


def write_tiff(path: Path, array: np.ndarray, channel_axis: str = "last") -> None:
    """Write a multi-channel image as plain grey samples (never guessed to be RGB)."""
    planar = "contig" if channel_axis == "last" or array.ndim != 3 else "separate"
    tifffile.imwrite(path, np.ascontiguousarray(array), photometric="minisblack", planarconfig=planar)


def write_dataset(out: Path, classes: int = 5, per_class: int = 200, channels: int = 5, size: int = 50,
                  seed: int = 0, channel_axis: str = "last", channel_order: tuple[int, ...] | None = None) -> int:
    """Write out/<class>/<class>_<i>.tif (channels last, as scDINO's data, unless told otherwise);
    `channel_order` stores generated channel channel_order[i] as channel i (e.g. (3, 1, 0, 4, 2) puts
    the marker first), so that a model is shown not to depend on where a stain sits."""
    images, labels, names = generate(classes, per_class, channels, size, seed)
    if channel_order is not None:
        if sorted(channel_order) != list(range(channels)):
            raise ValueError(f"channel_order must be a permutation of 0..{channels - 1}, got {channel_order}")
        images = images[:, list(channel_order)]
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


def write_class_folders(out: Path, *, classes: int, per_class: int, channels: int, size: int, seed: int,
                        channels_first: bool = False, corrupt: bool = False, channel_order: str | None = None) -> None:
    """`synth-data`'s class folders, its options checked first (each error names the option):
    `channel_order` as digits (31042 puts the marker first), `corrupt` adds one of each kind of bad
    image to the first class folder."""
    if not 1 <= classes <= len(PHENOTYPES):
        raise UserError(f"--classes must be between 1 and {len(PHENOTYPES)}, got {classes}")
    if per_class < 1 or size < 16 or channels < 1:
        raise UserError("--per-class must be >= 1, --size >= 16 and --channels >= 1")
    order = None
    if channel_order:
        order = tuple(int(c) for c in channel_order if c.isdigit())
        if len(order) != len(channel_order) or sorted(order) != list(range(channels)):
            raise UserError(f"--channel-order must list each of the {channels} channels once, as digits such as "
                            f"{''.join(map(str, reversed(range(channels))))}; got {channel_order!r}")
    write_dataset(out, classes, per_class, channels, size, seed,
                  channel_axis="first" if channels_first else "last", channel_order=order)
    if corrupt:
        first = sorted(p for p in Path(out).iterdir() if p.is_dir())[0]
        written = write_corrupt_files(first, channels, size, seed)
        log.info("wrote %d bad images into %s", len(written), first)
