"""A synthetic screen: fields of view (FOVs) of several cells, their label masks, a plate map with
treatments of known phenotype mixtures, and an imaging batch effect per plate.

    python -m training synth-data --screen --out runs/demo/data/screen [--plates 4 --batches 2 ...]

What it writes under --out (these names are the contract with `python -m training ingest`):

    images/<Plate>/<Well>_s<Site>.tif          one (C, H, W) uint16 TIFF per FOV, or with
    images/<Plate>/<Well>_s<Site>_<Channel>.tif  --per-channel-files one (H, W) TIFF per channel
    masks/<Plate>/<Well>_s<Site>_cells.tif     uint16 labels: 0 background, 1..n the cells
    load_data.csv   one row per FOV, CellProfiler LoadData columns (Metadata_*, FileName_Cell and
                    PathName_Cell or FileName_/PathName_<Channel> per channel, ObjectsFileName_Cells
                    and ObjectsPathName_Cells); every PathName_ is relative to the folder that holds
                    load_data.csv, and a reader resolves it from there
    platemap.csv    Metadata_Plate, Metadata_Well, Metadata_Treatment, Metadata_MOA, Metadata_Control
    truth.csv       one row per cell: plate, well, site, ObjectNumber (its label), Location_Center_X
                    and _Y (its mask's centroid, 0-based column and row), AreaShape_Area, Phenotype
    screen.json     the generating parameters: treatments and mixtures, batches and their effects

Each cell is drawn by the class-folder generator's renderer (training/data/synthetic/folders.py) at
the scale of its 50 px images; cells of a FOV touch at most, never overlap. Treatments draw each cell's
phenotype from their mixture: ten compounds, two per mechanism of action (Metadata_MOA), each
compound with its mechanism's mixture, and DMSO, the control. Plates are imaged in batches: every
batch has its own gain and background per channel (plates and wells add smaller ones), and favours
some compounds over others (every treatment is in every batch; the two compounds of a mechanism are
favoured by different batches where there are two), so that on raw pixels a cell's nearest neighbours share its
batch and, through the layout, often its treatment: plain kNN on treatments then scores clearly
higher than kNN that never lets a cell vote with its own batch (not-same-batch).
"""

from __future__ import annotations

import csv
import io
import logging
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import tifffile

from training.data.synthetic.folders import CELL_RADIUS, PHENOTYPES, mix_channels, render_cells, write_tiff
from training.errors import UserError
from training.writes.atomic import write_json_atomic, write_text_atomic

log = logging.getLogger(__name__)

CONTROL = "DMSO"
MECHANISMS: dict[str, dict[str, float]] = {
    CONTROL: {"diffuse": 0.70, "nuclear": 0.10, "membrane": 0.10, "granular": 0.10},
    "nuclear": {"nuclear": 0.60, "diffuse": 0.30, "punctate": 0.10},
    "membrane": {"membrane": 0.60, "diffuse": 0.25, "polar": 0.15},
    "punctate": {"punctate": 0.60, "diffuse": 0.25, "granular": 0.15},
    "polar": {"polar": 0.60, "diffuse": 0.25, "membrane": 0.15},
    "granular": {"granular": 0.60, "diffuse": 0.25, "nuclear": 0.15},
}
"""Each mechanism of action (MOA) as a mixture over the built-in phenotypes (fractions of the cells
of a well treated with a compound of that mechanism); the control's is the untreated mixture."""
TREATMENT_MOA: dict[str, str] = {
    CONTROL: CONTROL,
    "cpdA": "nuclear", "cpdB": "membrane", "cpdC": "punctate", "cpdD": "polar", "cpdE": "granular",
    "cpdF": "nuclear", "cpdG": "membrane", "cpdH": "punctate", "cpdI": "polar", "cpdJ": "granular",
}
"""Each treatment's mechanism: two compounds per mechanism (Metadata_MOA), so that profiles can be
scored for phenotypic consistency (compounds of one mechanism retrieve each other) as well as activity."""
TREATMENTS: dict[str, dict[str, float]] = {t: MECHANISMS[m] for t, m in TREATMENT_MOA.items()}
"""Each treatment's mixture over the built-in phenotypes: its mechanism's; DMSO is the control."""
DEFAULT_CHANNEL_NAMES = ("Membrane", "Cytoplasm", "DNA", "Marker", "Marker2")
"""The five generated channels, in order; channels past the fifth are mixtures, named Mix<index>."""

FAVOURED_WEIGHT = 5.0
"""A batch holds this many times more wells of the compounds it favours than of the others."""
BATCH_LOG_GAIN = 0.30
"""Batches' per-channel gains spread over exp(-0.3)..exp(+0.3) (x batch_strength)."""
BATCH_BACKGROUND = 0.06
"""Batches' extra background per channel spreads over 0..0.06 of a bright cell's level (x batch_strength)."""
PLATE_LOG_GAIN, PLATE_BACKGROUND, WELL_LOG_GAIN = 0.12, 0.01, 0.12
"""Standard deviations of the smaller per-plate and per-well effects (x batch_strength)."""
BASE_BACKGROUND = 0.05
CELL_LOG_GAIN, CELL_CHANNEL_LOG_GAIN = 0.25, 0.15
"""Cell-to-cell expression spread: all channels together, and each channel on its own."""
PATCH = 72
"""Side of the window each cell is drawn in before it is placed (room for the largest cells)."""
EDGE_MARGIN = 1.5 * CELL_RADIUS
"""Cell centres lie at least this far inside the FOV: most of a cell is in view, some are cut."""
MAX_COVER = 0.30
"""Cells may cover at most this fraction of a FOV (by mean cell area), so that placement succeeds."""
PLACEMENT_TRIES = 200
PLATE_ROWS = {96: "ABCDEFGH", 384: "ABCDEFGHIJKLMNOP"}
NAME_PATTERN = re.compile(r"[A-Za-z0-9]+")


def max_cells_per_fov(fov_size: int) -> int:
    return int(MAX_COVER * fov_size ** 2 / (np.pi * CELL_RADIUS ** 2))


def controls_per_plate(wells_per_plate: int) -> int:
    """A third of a small plate's wells are DMSO (8 of 24), at most 16: normalising a plate to its own
    controls needs several (a median absolute deviation of 4 wells moved the synthetic screen's
    compounds into the controls' range)."""
    return max(1, min(wells_per_plate // 3, 16))


def min_wells_per_plate(plates: int, batches: int) -> int:
    """The fewest wells that give every batch a control on each plate and a well of each compound."""
    compounds = len(TREATMENTS) - 1
    smallest_batch = plates // batches
    wells = 2
    while smallest_batch * (wells - controls_per_plate(wells)) < compounds:
        wells += 1
    return wells


@dataclass(frozen=True)
class ScreenSpec:
    """The screen's sizes and seed; invalid values raise a UserError naming the command-line option."""

    plates: int = 4
    batches: int = 2
    wells_per_plate: int = 24
    sites: int = 1
    fov_size: int = 256
    cells_per_fov: int = 20
    channel_names: tuple[str, ...] = DEFAULT_CHANNEL_NAMES
    per_channel_files: bool = False
    batch_strength: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        _check_range("--plates", self.plates, 2, 99)
        _check_range("--batches", self.batches, 2, self.plates, "(at most --plates)")
        _check_range("--wells-per-plate", self.wells_per_plate, min_wells_per_plate(self.plates, self.batches), 384,
                     f"(every batch needs a {CONTROL} well per plate and a well of each of {len(TREATMENTS) - 1} "
                     "compounds)")
        _check_range("--sites", self.sites, 1, 99)
        _check_range("--fov-size", self.fov_size, 64, 4096)
        _check_range("--cells-per-fov", self.cells_per_fov, 1, max_cells_per_fov(self.fov_size),
                     f"for --fov-size {self.fov_size} (cells may cover {MAX_COVER:.0%} of a field)")
        _check_range("--channels", len(self.channel_names), 1, 64)
        if not 0 <= self.batch_strength <= 5:
            raise UserError(f"--batch-strength must be between 0 (no imaging effects) and 5, got {self.batch_strength}")
        bad = [n for n in self.channel_names if not NAME_PATTERN.fullmatch(n)]
        if bad or len(set(self.channel_names)) != len(self.channel_names):
            raise UserError(f"channel names {list(self.channel_names)} must be distinct and made of letters and "
                            "digits only (they become file names and LoadData columns): fix data.channel_names")

    @property
    def channels(self) -> int:
        return len(self.channel_names)


def _check_range(option: str, value: int, low: int, high: int, why: str = "") -> None:
    if not low <= value <= high:
        raise UserError(f"{option} must be between {low} and {high}{' ' + why if why else ''}, got {value}")


def channel_names_for(channels: int, configured: dict[int, str]) -> tuple[str, ...]:
    """Names of `channels` channels: `configured` (channel index -> name, e.g. from data.channel_names)
    where given, else DEFAULT_CHANNEL_NAMES and Mix<index>."""
    return tuple(configured.get(c, DEFAULT_CHANNEL_NAMES[c] if c < len(DEFAULT_CHANNEL_NAMES) else f"Mix{c}")
                 for c in range(channels))


@dataclass(frozen=True)
class Well:
    plate: str
    batch: str
    well: str
    treatment: str

    @property
    def moa(self) -> str:
        return TREATMENT_MOA[self.treatment]


def well_names(count: int) -> list[str]:
    """The first `count` wells of a 96-well plate (384 beyond 96), row by row: A01, A02, ..."""
    fmt = 96 if count <= 96 else 384
    rows, columns = PLATE_ROWS[fmt], fmt // len(PLATE_ROWS[fmt])
    return [f"{rows[i // columns]}{i % columns + 1:02d}" for i in range(count)]


def favoured_batch(compound: int, compounds: int, batches: int) -> int:
    """The batch whose plates hold most of a compound's wells: compounds split into consecutive groups."""
    return compound * batches // compounds


def _apportion(total: int, weights: np.ndarray) -> np.ndarray:
    """Integer counts summing to `total`, one at least each, the rest in proportion to the weights
    (largest remainders first, ties to the earlier entry)."""
    counts = np.ones(len(weights), dtype=int)
    share = (total - len(weights)) * weights / weights.sum()
    counts += np.floor(share).astype(int)
    leftover = total - counts.sum()
    order = np.argsort(-(share - np.floor(share)), kind="stable")
    counts[order[:leftover]] += 1
    return counts


def plate_map(spec: ScreenSpec) -> list[Well]:
    """Every well of every plate with its batch and treatment: controls on each plate, each batch's
    other wells shared among the compounds with its favoured ones weighted FAVOURED_WEIGHT, dealt
    round-robin over the batch's plates, then shuffled over each plate's well positions."""
    rng = np.random.default_rng([spec.seed, 1])
    compounds = [t for t in TREATMENTS if t != CONTROL]
    plates = [f"Plate{p + 1:02d}" for p in range(spec.plates)]
    batch_of = [p * spec.batches // spec.plates for p in range(spec.plates)]
    controls = controls_per_plate(spec.wells_per_plate)
    wells: list[Well] = []
    for batch in range(spec.batches):
        members = [p for p in range(spec.plates) if batch_of[p] == batch]
        weights = np.array([FAVOURED_WEIGHT if favoured_batch(k, len(compounds), spec.batches) == batch else 1.0
                            for k in range(len(compounds))])
        counts = _apportion(len(members) * (spec.wells_per_plate - controls), weights)
        dealt = [t for t, n in zip(compounds, counts) for _ in range(n)]
        for j, p in enumerate(members):
            layout = [CONTROL] * controls + dealt[j::len(members)]
            layout = [layout[i] for i in rng.permutation(len(layout))]
            wells += [Well(plates[p], f"Batch{batch + 1}", name, t)
                      for name, t in zip(well_names(spec.wells_per_plate), layout)]
    return sorted(wells, key=lambda w: (w.plate, w.well))


@dataclass(frozen=True)
class Imaging:
    """Per-channel gain (multiplies) and background (adds, in units of a bright cell's level) of
    each batch, plate and well; a field's are the products and sums of its batch's, plate's and well's."""

    batch_gain: dict[str, list[float]]
    batch_background: dict[str, list[float]]
    plate_gain: dict[str, list[float]]
    plate_background: dict[str, list[float]]
    well_gain: dict[str, list[float]]

    def of(self, well: Well) -> tuple[np.ndarray, np.ndarray]:
        key = f"{well.plate}/{well.well}"
        gain = np.array(self.batch_gain[well.batch]) * self.plate_gain[well.plate] * np.array(self.well_gain[key])
        background = np.array(self.batch_background[well.batch]) + self.plate_background[well.plate]
        return gain.astype(np.float32), background.astype(np.float32)


def imaging_effects(spec: ScreenSpec, wells: list[Well]) -> Imaging:
    """Batches spread evenly between opposite gains (each channel's direction random) and from no
    extra background to BATCH_BACKGROUND; plates and wells jitter around their batch."""
    rng = np.random.default_rng([spec.seed, 2])
    c, s = spec.channels, spec.batch_strength
    sign = rng.choice([-1.0, 1.0], c)
    level = rng.uniform(0.5, 1.5, c)
    batches = sorted({w.batch for w in wells})
    position = {b: i / (len(batches) - 1) for i, b in enumerate(batches)}
    plates = sorted({w.plate for w in wells})

    def rounded(values: np.ndarray) -> list[float]:
        return [round(float(v), 6) for v in values]

    return Imaging(
        batch_gain={b: rounded(np.exp(s * BATCH_LOG_GAIN * (2 * t - 1) * sign)) for b, t in position.items()},
        batch_background={b: rounded(BASE_BACKGROUND + s * BATCH_BACKGROUND * t * level) for b, t in position.items()},
        plate_gain={p: rounded(np.exp(s * PLATE_LOG_GAIN * rng.standard_normal(c))) for p in plates},
        plate_background={p: rounded(s * PLATE_BACKGROUND * rng.standard_normal(c)) for p in plates},
        well_gain={f"{w.plate}/{w.well}": rounded(np.exp(s * WELL_LOG_GAIN * rng.standard_normal(c))) for w in wells},
    )


@dataclass
class Field:
    """One rendered FOV: pixels (C, H, W) uint16, labels (H, W) uint16 and each label's phenotype."""

    image: np.ndarray
    labels: np.ndarray
    phenotypes: list[str]
    dropped: int


def _draw_cells(rng: np.random.Generator, mixture: dict[str, float], n: int) -> tuple[list[int], np.ndarray, np.ndarray]:
    """n cells of phenotypes drawn from `mixture`, each in a PATCH window with its centre within
    one pixel of the window's middle, with its own expression level; in random order."""
    names = [p.name for p in PHENOTYPES]
    probs = np.array([mixture.get(name, 0.0) for name in names])
    kinds = np.sort(rng.choice(len(names), n, p=probs / probs.sum()))
    clean, extent = [], []
    for k in np.unique(kinds):
        m = int((kinds == k).sum())
        centres = PATCH / 2 + rng.uniform(0, 1, (m, 2))
        pixels, inside = render_cells(rng, PHENOTYPES[k], m, PATCH, centres, cell_px=50)
        clean.append(pixels)
        extent.append(inside)
    clean, extent = np.concatenate(clean), np.concatenate(extent)
    clean *= np.exp(CELL_LOG_GAIN * rng.standard_normal((n, 1, 1, 1))
                    + CELL_CHANNEL_LOG_GAIN * rng.standard_normal((n, clean.shape[1], 1, 1))).astype(np.float32)
    order = rng.permutation(n)
    return [int(kinds[i]) for i in order], clean[order], extent[order]


def _place(rng: np.random.Generator, labels: np.ndarray, inside: np.ndarray) -> tuple[slice, slice, slice, slice] | None:
    """A position for a cell's window where its extent overlaps no placed cell: (FOV rows, FOV
    columns, window rows, window columns) of the part in view; None after PLACEMENT_TRIES tries."""
    size = labels.shape[0]
    low, high = int(np.ceil(EDGE_MARGIN)), int(size - EDGE_MARGIN)
    for _ in range(PLACEMENT_TRIES):
        top, left = (int(v) - PATCH // 2 for v in rng.integers(low, high, 2))
        rows = slice(max(top, 0), min(top + PATCH, size))
        cols = slice(max(left, 0), min(left + PATCH, size))
        window = (slice(rows.start - top, rows.stop - top), slice(cols.start - left, cols.stop - left))
        if not (labels[rows, cols].astype(bool) & inside[window]).any():
            return rows, cols, *window
    return None


def render_field(rng: np.random.Generator, spec: ScreenSpec, mixture: dict[str, float],
                 gain: np.ndarray, background: np.ndarray, mix_rng_seed: list[int]) -> Field:
    """Draw, place and image the cells of one FOV (gain and background per channel of its well)."""
    kinds, clean, extent = _draw_cells(rng, mixture, spec.cells_per_fov)
    size = spec.fov_size
    canvas = np.zeros((clean.shape[1], size, size), dtype=np.float32)
    labels = np.zeros((size, size), dtype=np.uint16)
    phenotypes: list[str] = []
    for kind, pixels, inside in zip(kinds, clean, extent):
        where = _place(rng, labels, inside)
        if where is None:
            continue
        rows, cols, window_rows, window_cols = where
        labels[rows, cols][inside[window_rows, window_cols]] = len(phenotypes) + 1
        canvas[:, rows, cols] += pixels[:, window_rows, window_cols]
        phenotypes.append(PHENOTYPES[kind].name)
    canvas = mix_channels(np.random.default_rng(mix_rng_seed), canvas[None], spec.channels)[0]
    image = canvas + background[:, None, None]
    image += (0.03 + 0.04 * np.sqrt(np.clip(image, 0, None))) * rng.standard_normal(image.shape, dtype=np.float32)
    pixels = np.clip(image * gain[:, None, None] * 12000 + 100, 0, 65535).astype(np.uint16)
    return Field(pixels, labels, phenotypes, spec.cells_per_fov - len(phenotypes))


def label_measurements(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Area and centroid (x = column, y = row, 0-based) of labels 1..max, as CellProfiler measures them."""
    flat = labels.ravel().astype(np.int64)
    count = int(labels.max())
    rows, cols = np.indices(labels.shape)
    area = np.bincount(flat, minlength=count + 1)[1:]
    x = np.bincount(flat, weights=cols.ravel(), minlength=count + 1)[1:] / area
    y = np.bincount(flat, weights=rows.ravel(), minlength=count + 1)[1:] / area
    return area, x, y


def _csv_text(header: list[str], rows: list[list[object]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()


def _load_data_header(spec: ScreenSpec) -> list[str]:
    image = ["FileName_Cell", "PathName_Cell"] if not spec.per_channel_files else \
        [f"{kind}_{name}" for name in spec.channel_names for kind in ("FileName", "PathName")]
    return ["Metadata_Plate", "Metadata_Well", "Metadata_Site", "Metadata_Treatment", "Metadata_MOA", "Metadata_Batch",
            *image, "ObjectsFileName_Cells", "ObjectsPathName_Cells"]


def _write_field(out: Path, spec: ScreenSpec, well: Well, site: int, fov: Field) -> list[object]:
    """The FOV's image(s) and mask; returns its load_data.csv row (paths relative to `out`)."""
    stem = f"{well.well}_s{site}"
    image_dir, mask_dir = Path("images", well.plate), Path("masks", well.plate)
    (out / image_dir).mkdir(parents=True, exist_ok=True)
    (out / mask_dir).mkdir(parents=True, exist_ok=True)
    files: list[object] = []
    if spec.per_channel_files:
        for name, plane in zip(spec.channel_names, fov.image):
            write_tiff(out / image_dir / f"{stem}_{name}.tif", plane)
            files += [f"{stem}_{name}.tif", image_dir.as_posix()]
    else:
        write_tiff(out / image_dir / f"{stem}.tif", fov.image, channel_axis="first")
        files += [f"{stem}.tif", image_dir.as_posix()]
    tifffile.imwrite(out / mask_dir / f"{stem}_cells.tif", fov.labels, photometric="minisblack")
    return [well.plate, well.well, site, well.treatment, well.moa, well.batch, *files, f"{stem}_cells.tif", mask_dir.as_posix()]


def _truth_rows(well: Well, site: int, fov: Field) -> list[list[object]]:
    area, x, y = label_measurements(fov.labels)
    return [[well.plate, well.well, site, i + 1, f"{x[i]:.4f}", f"{y[i]:.4f}", int(area[i]), fov.phenotypes[i]]
            for i in range(len(fov.phenotypes))]


SCREEN_FILES = ("load_data.csv", "platemap.csv", "truth.csv", "screen.json")
TRUTH_HEADER = ["Metadata_Plate", "Metadata_Well", "Metadata_Site", "ObjectNumber", "Location_Center_X",
                "Location_Center_Y", "AreaShape_Area", "Phenotype"]


def _clear(out: Path) -> None:
    """Make `out` ready for a screen: a new or empty folder, or an earlier screen (removed first)."""
    if not out.exists() or not any(out.iterdir()):
        return
    if not (out / "screen.json").is_file():
        raise UserError(f"--out {out} is not empty and holds no earlier screen (screen.json): "
                        "choose a new or empty folder")
    for name in ("images", "masks"):
        shutil.rmtree(out / name, ignore_errors=True)
    for name in SCREEN_FILES:
        (out / name).unlink(missing_ok=True)


@dataclass(frozen=True)
class ScreenSummary:
    fields: int
    cells: int
    dropped: int


def write_screen(out: Path, spec: ScreenSpec) -> ScreenSummary:
    """Write the whole screen under `out` (see the module docstring); deterministic given spec.seed.
    load_data.csv is written last: a folder that has it holds a complete screen."""
    out = Path(out)
    _clear(out)
    wells = plate_map(spec)
    imaging = imaging_effects(spec, wells)
    load_rows, truth_rows, dropped = [], [], 0
    for w, well in enumerate(wells):
        gain, background = imaging.of(well)
        for site in range(1, spec.sites + 1):
            rng = np.random.default_rng([spec.seed, 3, w, site])
            fov = render_field(rng, spec, TREATMENTS[well.treatment], gain, background, [spec.seed, 7])
            load_rows.append(_write_field(out, spec, well, site, fov))
            truth_rows += _truth_rows(well, site, fov)
            dropped += fov.dropped
    write_text_atomic(out / "platemap.csv", _csv_text(
        ["Metadata_Plate", "Metadata_Well", "Metadata_Treatment", "Metadata_MOA", "Metadata_Control"],
        [[w.plate, w.well, w.treatment, w.moa, w.treatment == CONTROL] for w in wells]))
    write_text_atomic(out / "truth.csv", _csv_text(TRUTH_HEADER, truth_rows))
    write_json_atomic(out / "screen.json", _parameters(spec, wells, imaging, len(truth_rows), dropped), indent=1)
    write_text_atomic(out / "load_data.csv", _csv_text(_load_data_header(spec), load_rows))
    summary = ScreenSummary(len(load_rows), len(truth_rows), dropped)
    log.info("wrote a screen of %d plates in %d batches, %d fields of view, %d cells (%d did not fit) to %s",
             spec.plates, spec.batches, summary.fields, summary.cells, dropped, out)
    return summary


def _parameters(spec: ScreenSpec, wells: list[Well], imaging: Imaging, cells: int, dropped: int) -> dict:
    """screen.json: what generated the screen, enough to tell what any kNN on it should find."""
    batches = sorted({w.batch for w in wells})
    return {
        "seed": spec.seed,
        "sizes": {k: v for k, v in asdict(spec).items() if k != "seed"},
        "cells": cells,
        "cells_not_placed": dropped,
        "control": CONTROL,
        "treatments": {t: {"mixture": m, "moa": TREATMENT_MOA[t], "wells": sum(w.treatment == t for w in wells),
                           "wells_per_batch": {b: sum(w.treatment == t and w.batch == b for w in wells)
                                               for b in batches}}
                       for t, m in TREATMENTS.items()},
        "batches": {b: {"plates": sorted({w.plate for w in wells if w.batch == b}),
                        "gain": imaging.batch_gain[b], "background": imaging.batch_background[b]}
                    for b in batches},
        "effects": {"batch_strength": spec.batch_strength, "batch_log_gain": BATCH_LOG_GAIN,
                    "batch_background": BATCH_BACKGROUND, "plate_log_gain_sd": PLATE_LOG_GAIN,
                    "plate_background_sd": PLATE_BACKGROUND, "well_log_gain_sd": WELL_LOG_GAIN,
                    "plate_gain": imaging.plate_gain, "plate_background": imaging.plate_background,
                    "well_gain": imaging.well_gain},
        "intensity": "pixel = (signal + background + noise) x gain x 12000 + 100, clipped to uint16",
    }
