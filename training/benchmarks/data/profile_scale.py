"""What the `features` step's writing and the steps after it cost as a screen grows: its feature set
written, `export`'s AnnData and Parquet files, the per-well medians and their normalisation, and the
retrieval mAP.

    python -m training bench profile-scale [--sizes 100000,1000000,10000000] [--plates 40] [--steps a,b] [--out FILE]

For each N a synthetic screen is written in a scratch folder, and deleted once measured: N cells on
--plates plates of 384 wells, each well's cells stored together as a screen's table lists them, DMSO
in the first and last column of every plate and the other wells' compounds in REPLICATES wells each,
on plates of other imaging batches; the per-cell table as `prepare` writes it (pixel files sparse: no
pixel is read), the split, and features/final of DIM float32 per cell (ViT-tiny's CLS and mean patch
token, 2 x 192: the screen recipe's) in the files and bytes the `features` step writes
(training/rundir/features.py). Each step then runs in a fresh process through the product's own
functions (`python -m training.benchmarks.data.profile_scale STEP FOLDER CELLS PLATES`), its imports
first (IMPORTS: not timed), and is measured:

    seconds, cpu_s          the step's wall time and CPU seconds (user + system, every thread), both
                            from the end of its imports; s_per_million, cpu_s_per_million per 10^6 cells
    cells_per_min           cells over the wall time
    process_s, process_cpu_s   the same of the whole process, imports included (os.wait4's rusage)
    peak_anon_mb            the process's largest private memory: RssAnon of /proc/PID/status, sampled
                            every SAMPLE_S (what no other process shares and the kernel cannot drop)
    base_anon_mb            the same once its imports are done, before its work
    peak_rss_mb             ru_maxrss: private memory plus the pages of the memory-mapped files it read,
                            which belong to the page cache and are given back under pressure
    load_before             the machine's load average as the step began (others' work shares its cores)
    bytes                   what the step wrote

The steps: `extract` (the `features` step's writing path, training/eval/extract.py's extract_sets on
one rank: batches of eval.batch_size cells L2-normalised and written as they come, each batch's rows
the synthetic rows of its cells in place of a model's), `extract_merged` (the same through the path
of several ranks: the rank's part beside the set, then rank 0's merge), `features` (features/final
for the later steps, written by training/rundir/features.py's FeatureSetWriter ROWS_PER_WRITE rows at a
time), `h5ad` and `parquet` (export's cells.h5ad and cells.parquet, training/eval/profiles/export.py),
`wells` (export's per-well medians and wells.parquet, then eval.profile_normalization's per-plate
mad_robustize and sphering and wells_normalized.parquet), `subpopulations` (every cell's share of
SUBPOPULATIONS k-means clusters per well, eval.profile_subpopulations, and wells_subpopulations.parquet:
training/eval/profiles/subpopulations.py, k-means on a sample of at most 50,000 cells), `map` (knn's phenotypic-activity mAP,
training/eval/retrieval.py, on the per-well profiles of every cell). --steps measures only the steps it
names (the JSON's "steps" lists those measured), `features` first where a later step reads its set.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

log = logging.getLogger(__name__)

DIM = 384
"""Features per cell: ViT-tiny's CLS token and mean patch token (2 x 192), the screen recipe's."""
PLATES, ROWS, COLUMNS = 40, 16, 24
CONTROL = "DMSO"
CONTROL_COLUMNS = (0, COLUMNS - 1)
"""The plate columns that hold the negative controls (32 wells a plate)."""
REPLICATES = 5
"""Wells of each compound, on plates a fifth of the screen apart (so in other imaging batches)."""
ACTIVE_EVERY = 4
"""One compound in ACTIVE_EVERY moves its cells' features: the mAP has something to find."""
BATCH_PLATES = 10
"""Plates per imaging batch."""
ROWS_PER_WRITE = 1 << 16
"""Feature rows generated and written at a time (100 MB at DIM floats)."""
NOISE_ROWS = 65521
"""Rows of the bank of noise the cells' features draw from (a prime: neighbouring cells differ)."""
SAMPLE_S = 0.01
STEPS = ("extract", "extract_merged", "features", "h5ad", "parquet", "wells", "subpopulations", "map")
READ_FEATURES = ("h5ad", "parquet", "wells", "subpopulations", "map")
"""The steps that read the feature set the `features` step writes: it runs before any of them."""
SUBPOPULATIONS = 32
"""k of the `subpopulations` step (eval.profile_subpopulations as the screens of docs/performance.md tried it)."""
IMPORTS = ("training.data.dataset", "training.models", "training.eval.extract", "training.eval.profiles.export",
           "training.eval.retrieval", "h5py", "anndata", "pandas", "pyarrow.parquet", "pycytominer", "copairs.map")
"""What the steps import, imported before the clock starts (training.data.dataset imports torch: ~4 s)."""


@dataclass(frozen=True)
class Screen:
    """N cells on `plates` plates of ROWS x COLUMNS wells, the cells of a well contiguous (plate-major)."""

    n: int
    plates: int = PLATES

    @property
    def wells(self) -> int:
        return self.plates * ROWS * COLUMNS

    @property
    def compounds(self) -> int:
        return self.plates * ROWS * (COLUMNS - len(CONTROL_COLUMNS)) // REPLICATES

    def well_of(self, start: int, stop: int) -> np.ndarray:
        """The well (over the whole screen, plate-major) of cells start..stop."""
        return np.arange(start, stop, dtype=np.int64) * self.wells // self.n

    def treatments(self) -> np.ndarray:
        """Each well's treatment: 0 for DMSO, 1 + its compound otherwise."""
        treated = ~np.isin(np.arange(self.wells) % COLUMNS, CONTROL_COLUMNS)
        out = np.zeros(self.wells, np.int64)
        out[treated] = 1 + np.arange(int(treated.sum())) % self.compounds
        return out

    def table(self) -> pa.Table:
        """The cells' rows: paths, the storage columns, plate, well, treatment and batch, built from
        per-well arrays, without a Python object per cell."""
        from training.benchmarks.data.scale import storage_columns

        per_plate = ROWS * COLUMNS
        cell, well = np.arange(self.n, dtype=np.int64), self.well_of(0, self.n)
        plates = [f"Plate{p:03d}" for p in range(self.plates)]
        wells = [f"{chr(ord('A') + w // COLUMNS)}{w % COLUMNS + 1:02d}" for w in range(per_plate)]
        prefixes = pa.array([f"screen-2026/{plates[w // per_plate]}/images/r{(w % per_plate) // COLUMNS + 1:02d}"
                             f"c{w % COLUMNS + 1:02d}f01p01-ch1sk1fk1fl1.tiff" for w in range(self.wells)])
        paths = pc.binary_join_element_wise(prefixes.take(pa.array(well)), pa.array(cell).cast(pa.string()), "#")
        per_well = {
            "Metadata_Plate": (well // per_plate, plates),
            "Metadata_Well": (well % per_plate, wells),
            "Metadata_Treatment": (self.treatments()[well], [CONTROL] + [f"cpd{c:05d}" for c in range(self.compounds)]),
            "Metadata_Batch": (well // per_plate // BATCH_PLATES, [f"B{b}" for b in range(-(-self.plates // BATCH_PLATES))]),
        }
        columns = {name: pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32)), pa.array(names))
                   for name, (codes, names) in per_well.items()}
        return pa.table({"path": paths.cast(pa.large_string()), **storage_columns(cell), **columns})


def run_layout(root: Path):
    """The scratch run's layout (its packed dataset inside it, as `prepare` puts it)."""
    from training.rundir import RunLayout

    return RunLayout(root / "run")


def screen_config(root: Path):
    """The screen recipe's settings that export, the medians and the mAP read, on the scratch run."""
    from training.config import Config

    layout = run_layout(root)
    return Config().replace({
        "run.output_dir": str(layout.root), "data.source": str(layout.packed),
        "data.label_column": "Metadata_Treatment", "data.batch_column": "Metadata_Batch",
        "data.control_column": "Metadata_Treatment", "data.control_value": CONTROL, "model.arch": "vit_tiny",
        "eval.feature": "cls_patch_mean", "eval.profile_cells": "all",
        "eval.profile_normalization": ["mad_robustize", "spherize"]})


def write_screen(root: Path, screen: Screen) -> None:
    """The packed dataset and its split (20 % held out, seeded), as `prepare` leaves them."""
    from training.benchmarks.data.scale import write_dataset
    from training.data.dataset import open_images
    from training.data.split import Split, save_split

    config = screen_config(root)
    write_dataset(Path(config.data.source), screen.n, screen.table())
    held = np.random.default_rng(0).random(screen.n) < config.data.holdout_fraction
    save_split(config, Split(np.flatnonzero(~held), np.flatnonzero(held)), open_images(config))


class SyntheticFeatures:
    """The cells' features: their compound's direction (active compounds only), their plate's offset
    and noise, float32; the same rows whatever the chunks they are asked for in."""

    def __init__(self, screen: Screen, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.screen = screen
        self.compound = rng.standard_normal((screen.compounds + 1, DIM), dtype=np.float32)
        self.compound[0] = 0
        self.compound[1:][np.arange(screen.compounds) % ACTIVE_EVERY != 0] = 0
        self.plate = 0.3 * rng.standard_normal((screen.plates, DIM), dtype=np.float32)
        self.noise = rng.standard_normal((NOISE_ROWS, DIM), dtype=np.float32)
        self.treatment = screen.treatments()

    def rows(self, start: int, stop: int) -> np.ndarray:
        well = self.screen.well_of(start, stop)
        out = self.noise[np.arange(start, stop) % NOISE_ROWS]
        out += self.compound[self.treatment[well]]
        out += self.plate[well // (ROWS * COLUMNS)]
        return out

    def all_rows(self) -> np.ndarray:
        """Every row in one (N, DIM) array, filled ROWS_PER_WRITE rows at a time."""
        n = self.screen.n
        out = np.empty((n, DIM), np.float32)
        for start in range(0, n, ROWS_PER_WRITE):
            out[start:start + ROWS_PER_WRITE] = self.rows(start, min(n, start + ROWS_PER_WRITE))
        return out


def feature_meta(config) -> dict[str, Any]:
    """What the features step records of the final checkpoint's set (training/eval/feature_plan.py)."""
    return {"tag": "final", "kind": "checkpoint", "epoch": 100, "arch": config.model.arch, "patch_size": 16,
            "image_size": config.eval.image_size, "channels": config.data.channels, "feature": config.eval.feature,
            "checkpoint": "synthetic: bench profile-scale", "cells": "all"}


def write_features(directory: Path, screen: Screen, meta: dict[str, Any]) -> None:
    """The screen's feature set through the product's writer, ROWS_PER_WRITE rows at a time."""
    from training.rundir.features import FeatureSetWriter

    n, synthetic = screen.n, SyntheticFeatures(screen)
    with FeatureSetWriter(directory, DIM, meta) as writer:
        for start in range(0, n, ROWS_PER_WRITE):
            stop = min(n, start + ROWS_PER_WRITE)
            writer.append(np.arange(start, stop, dtype=np.int64), synthetic.rows(start, stop))


def status_mb(key: str, pid: int | str = "self") -> float:
    with open(f"/proc/{pid}/status") as status:
        return int(next(line for line in status if line.startswith(key + ":")).split()[1]) / 1024


def folder_bytes(*paths: Path) -> int:
    return sum(f.stat().st_size for p in paths for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file())


def _export_source(config):
    from training.eval.profiles.export import open_source
    from training.rundir import RunLayout

    layout = RunLayout.from_config(config)
    return layout, open_source(config, layout)


def run_features(config, screen: Screen) -> dict[str, Any]:
    from training.rundir import RunLayout, tags

    directory = RunLayout.from_config(config).features(tags.FINAL)
    write_features(directory, screen, feature_meta(config))
    return {"bytes": folder_bytes(directory)}


def extract_features(directory: Path, config, screen: Screen, *, ascending: bool = True) -> None:
    """The screen's feature set through the `features` step's writing path (training/eval/extract.py)
    on one rank. The model and the loader are stood in for by each batch's synthetic rows: the pixel
    files are sparse, and a forward pass costs GPU time, not the writer's memory, which is what this
    measures. `ascending=False` takes the path of several ranks: the rank's part, then the merge."""
    import torch

    from training.eval.extract import SetTarget, extract_sets
    from training.rundir import tags

    synthetic, batch = SyntheticFeatures(screen), config.eval.batch_size

    def batches():
        for start in range(0, screen.n, batch):
            cells = torch.arange(start, min(screen.n, start + batch))
            yield cells, torch.zeros_like(cells), cells

    def encode(cells: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(synthetic.rows(int(cells[0]), int(cells[-1]) + 1))

    extract_sets({tags.FINAL: encode}, batches(), torch.device("cpu"),
                 {tags.FINAL: SetTarget(directory, DIM, feature_meta(config))}, ascending=ascending)


def run_extract(config, screen: Screen, *, ascending: bool = True) -> dict[str, Any]:
    """extract_features into a scratch set, deleted once measured (features/final stays the later
    steps' input)."""
    from training.rundir import RunLayout

    directory = RunLayout.from_config(config).root / "extract"
    extract_features(directory, config, screen, ascending=ascending)
    size = folder_bytes(directory)
    shutil.rmtree(directory)
    return {"bytes": size}


def run_extract_merged(config, screen: Screen) -> dict[str, Any]:
    return run_extract(config, screen, ascending=False)


def run_h5ad(config, screen: Screen) -> dict[str, Any]:
    from training.eval.profiles.export import write_h5ad

    layout, source = _export_source(config)
    layout.profiles_h5ad.parent.mkdir(parents=True, exist_ok=True)
    write_h5ad(layout.profiles_h5ad, source)
    return {"bytes": folder_bytes(layout.profiles_h5ad)}


def run_parquet(config, screen: Screen) -> dict[str, Any]:
    from training.eval.profiles.export import write_cells_parquet

    layout, source = _export_source(config)
    layout.profiles_cells.parent.mkdir(parents=True, exist_ok=True)
    write_cells_parquet(layout.profiles_cells, source)
    return {"bytes": folder_bytes(layout.profiles_cells)}


def run_wells(config, screen: Screen) -> dict[str, Any]:
    """Export's per-well part, as export_profiles runs it."""
    from training.eval.profiles.export import write_wells_parquet
    from training.eval.profiles.normalization import normalize_profiles
    from training.eval.profiles.wells import profiled_wells

    layout, source = _export_source(config)
    layout.profiles_wells.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    wells = profiled_wells(config, source.cells, source.features.features, source.rows)
    medians_s = time.perf_counter() - start
    write_wells_parquet(layout.profiles_wells, wells, wells.profiles, source.feature_names)
    start = time.perf_counter()
    normalized, kept = normalize_profiles(wells.profiles, config.eval.profile_normalization, wells.context(config))
    normalize_s = time.perf_counter() - start
    write_wells_parquet(layout.profiles_wells_normalized, wells, normalized, [source.feature_names[i] for i in kept])
    return {"bytes": folder_bytes(layout.profiles_wells, layout.profiles_wells_normalized),
            "n_wells": int(len(wells.profiles)), "medians_s": round(medians_s, 3), "normalize_s": round(normalize_s, 3)}


def run_subpopulations(config, screen: Screen) -> dict[str, Any]:
    """Export's subpopulation shares (eval.profile_subpopulations: SUBPOPULATIONS), as export_profiles
    writes them: the k-means fit on its sample, then every cell at its nearest centre."""
    from training.eval.profiles.export import write_wells_parquet
    from training.eval.profiles.subpopulations import subpopulation_name, well_shares
    from training.eval.profiles.wells import profiled_wells

    layout, source = _export_source(config)
    layout.profiles.mkdir(parents=True, exist_ok=True)
    wells = profiled_wells(config, source.cells, source.features.features, source.rows)
    start = time.perf_counter()
    shares = well_shares(source.features.features, wells.grouping, SUBPOPULATIONS, config.run.seed)
    shares_s = time.perf_counter() - start
    write_wells_parquet(layout.profiles_wells_subpopulations, wells, shares,
                        [subpopulation_name(i) for i in range(SUBPOPULATIONS)])
    return {"bytes": folder_bytes(layout.profiles_wells_subpopulations), "n_wells": int(wells.grouping.count),
            "k": SUBPOPULATIONS, "shares_s": round(shares_s, 3)}


def run_map(config, screen: Screen) -> dict[str, Any]:
    """knn's phenotypic activity (training/eval/retrieval.py) of every cell's per-well profiles
    (eval.profile_cells: all, the screen recipe's)."""
    from training.eval.retrieval import evaluation_wells, tag_map
    from training.rundir import RunLayout, tags
    from training.rundir.features import load_features

    features = load_features(RunLayout.from_config(config).features(tags.FINAL), mmap=True)
    setup = evaluation_wells(config, {"indices": features.indices})
    activity = tag_map(features.features, setup, config.run.seed)["map"]
    return {"bytes": 0, "n_wells": int(setup.wells.count), "mean_map": round(activity["mean_map"], 4),
            "fraction_retrieved": round(activity["fraction_significant"], 4),
            "n_treatments": activity["n_treatments"]}


CHILD_STEPS: dict[str, Callable[[Any, Screen], dict[str, Any]]] = {
    "extract": run_extract, "extract_merged": run_extract_merged, "features": run_features, "h5ad": run_h5ad,
    "parquet": run_parquet,
    "wells": run_wells, "subpopulations": run_subpopulations, "map": run_map}


def child(step: str, root: Path, screen: Screen) -> dict[str, Any]:
    """One step in this process (the imports it needs first, then timed): its figures."""
    import importlib

    for module in IMPORTS:
        importlib.import_module(module)
    config = screen_config(root)
    base, load = status_mb("RssAnon"), os.getloadavg()[0]
    start, cpu = time.perf_counter(), cpu_seconds()
    out = CHILD_STEPS[step](config, screen)
    return {"seconds": round(time.perf_counter() - start, 3), "cpu_s": round(cpu_seconds() - cpu, 3),
            "base_anon_mb": round(base, 1), "load_before": round(load, 2), **out}


def cpu_seconds() -> float:
    """User + system seconds of this process, all its threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class PeakSampler(threading.Thread):
    """The largest RssAnon of a process, read every SAMPLE_S until it ends."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.done = pid, 0.0, threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                self.peak = max(self.peak, status_mb("RssAnon", self.pid))
            except (OSError, StopIteration, ValueError):
                return
            time.sleep(SAMPLE_S)


def measure(step: str, root: Path, screen: Screen) -> dict[str, Any]:
    """Run `step` in a fresh process: its figures, with its peak private memory, ru_maxrss and CPU
    seconds read from here (os.wait4 gives this one child's rusage)."""
    n = screen.n
    command = [sys.executable, "-m", "training.benchmarks.data.profile_scale", step, str(root), str(n),
               str(screen.plates)]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=out, stderr=err, env={**os.environ, "OMP_NUM_THREADS": "1"})
        sampler = PeakSampler(process.pid)
        sampler.start()
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - started
        sampler.done.set()
        sampler.join()
        out.seek(0)
        err.seek(0)
        if process.returncode != 0:
            raise RuntimeError(f"profile-scale step {step} at {n} cells failed: {err.read()[-2000:]}")
        figures = json.loads(out.read().splitlines()[-1])
    return {**figures, "s_per_million": round(figures["seconds"] / n * 1e6, 3),
            "cpu_s_per_million": round(figures["cpu_s"] / n * 1e6, 3),
            "cells_per_min": round(n * 60 / figures["seconds"]) if figures["seconds"] else None,
            "process_s": round(wall, 3), "process_cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_anon_mb": round(sampler.peak, 1), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1)}


def steps_to_run(asked: tuple[str, ...] | None) -> tuple[str, ...]:
    """The steps measured for --steps `asked` (None: all), `features` among them where a later one reads
    its feature set."""
    wanted = set(STEPS if asked is None else asked)
    if wanted & set(READ_FEATURES):
        wanted.add("features")
    return tuple(step for step in STEPS if step in wanted)


def run_profile_scale_benchmark(sizes: list[int], *, plates: int = PLATES, scratch: Path | None = None,
                                steps: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The figures of the module docstring: per size, the screen's generation time and each step's figures
    (`steps`: only those, and `features` before the steps that read it)."""
    from training.data.store.cells import CELLS_FILE

    measured = steps_to_run(steps)
    rows = []
    for n in sizes:
        screen = Screen(n, plates)
        with tempfile.TemporaryDirectory(prefix="bench-profile-scale-", dir=scratch) as tmp:
            root = Path(tmp)
            log.info("bench profile-scale: %d cells on %d plates", n, plates)
            start = time.perf_counter()
            write_screen(root, screen)
            row: dict[str, Any] = {"n_cells": n, "generate_s": round(time.perf_counter() - start, 2),
                                   "table_bytes": folder_bytes(run_layout(root).packed / CELLS_FILE)}
            for step in measured:
                row[step] = measure(step, root, screen)
                log.info("bench profile-scale: %d cells, %s: %s", n, step, row[step])
                drop_outputs(root)
            rows.append(row)
    return {"benchmark": "profile-scale", "dim": DIM, "dtype": "float32", "plates": plates,
            "wells": Screen(1, plates).wells, "compounds": Screen(1, plates).compounds, "replicates": REPLICATES,
            "normalization": ["mad_robustize", "spherize"], "map_cells": "every cell (eval.profile_cells: all)",
            "memory": "peak_anon_mb: RssAnon of /proc/PID/status sampled every 10 ms; peak_rss_mb: the step "
                      "process's ru_maxrss (os.wait4), pages of memory-mapped files included",
            "cpus": os.cpu_count(), "steps": list(measured), "rows": rows}


def drop_outputs(root: Path) -> None:
    """Export's files, measured: deleted before the next step (at 10^7 cells each is ~15 GB)."""
    profiles = run_layout(root).profiles
    if profiles.exists():
        shutil.rmtree(profiles)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    print(json.dumps(child(sys.argv[1], Path(sys.argv[2]), Screen(int(sys.argv[3]), int(sys.argv[4])))))
