"""Ingest benchmark: crops per second per core, and peak memory at two numbers of fields of view.

    python -m training bench ingest [--fields 16,64] [--cells 200] [--crop 64] [--out ingest.json]

Fields of view as a Cell Painting screen has them: 1080 x 1080 pixels, 5 channels of uint16, one
uncompressed TIFF per field on local disk, each with a uint16 label mask of `--cells` round cells
(radius 12-24 px, on a jittered grid, none touching) and a LoadData table. DISTINCT_FIELDS files are
written and the table's rows cycle through them (the files are read from the page cache either way,
as on a node that just read them). For each number of fields a fresh process runs what one task of
`ingest` runs (read, measure, cut, append to a part; no merge, which links files) and reports:

    crops_per_core_s   crops cut per CPU-second of that process (user + system, reader threads
                       included): the figure that holds on a shared machine; the goal is >= 2,000
    crops_per_wall_s   crops per second of wall time
    peak_rss_mb        the process's peak resident memory: flat in the number of fields when memory
                       does not grow with them (the first field count is the baseline)
"""

from __future__ import annotations

import multiprocessing
import resource
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import tifffile

SIDE, CHANNELS = 1080, 5
DISTINCT_FIELDS = 8
RADII = (12, 24)


def draw_labels(rng: np.random.Generator, cells: int) -> np.ndarray:
    """A label mask of `cells` discs on a jittered grid (each in its own grid cell, so none touch)."""
    per_side = int(np.ceil(np.sqrt(cells)))
    pitch = SIDE // per_side
    labels = np.zeros((SIDE, SIDE), np.uint16)
    yy, xx = np.mgrid[0:pitch, 0:pitch]
    for number in range(1, cells + 1):
        row, col = divmod(number - 1, per_side)
        radius = rng.uniform(*RADII)
        room = max(pitch / 2 - radius - 1, 0)
        cy, cx = pitch / 2 + rng.uniform(-room, room, 2)
        disc = (yy - cy) ** 2 + (xx - cx) ** 2 < radius ** 2
        labels[row * pitch:(row + 1) * pitch, col * pitch:(col + 1) * pitch][disc] = number
    return labels


def write_screen(folder: Path, fields: int, cells: int, seed: int = 0) -> Path:
    """DISTINCT_FIELDS fields of view and masks under `folder`, and a load table of `fields` rows; its path."""
    rng = np.random.default_rng(seed)
    (folder / "images").mkdir(parents=True, exist_ok=True)  # files of an earlier call are written again, alike
    for k in range(min(DISTINCT_FIELDS, fields)):
        image = rng.integers(100, 4000, (CHANNELS, SIDE, SIDE), dtype=np.uint16)
        tifffile.imwrite(folder / "images" / f"f{k}.tif", image, photometric="minisblack")
        tifffile.imwrite(folder / "images" / f"f{k}_cells.tif", draw_labels(rng, cells), photometric="minisblack")
    lines = ["Metadata_Plate,Metadata_Well,Metadata_Site,FileName_Cell,PathName_Cell,ObjectsFileName_Cells,"
             "ObjectsPathName_Cells"]
    for row in range(fields):
        k = row % min(DISTINCT_FIELDS, fields)
        lines.append(f"P{row // 384 + 1},W{row % 384:03d},1,f{k}.tif,images,f{k}_cells.tif,images")
    table = folder / f"load_data_{fields}.csv"
    table.write_text("\n".join(lines) + "\n")
    return table


def measure(table: str, out: str, crop: int, queue) -> None:
    """In a fresh process: one ingest part of every row of `table`; puts the figures on `queue`."""
    from training.config import Config
    from training.data.ingest.part import ingest_part
    from training.data.ingest.table import LoadTable

    config = Config().replace({"ingest.table": table, "ingest.crop_size": crop, "data.channels": "01234"})
    load = LoadTable(config)
    start, cpu = time.perf_counter(), _cpu()
    info = ingest_part(config, load, range(len(load)), Path(out), {})
    wall, cpu = time.perf_counter() - start, _cpu() - cpu
    cut = info["counts"]["cut"]
    queue.put({"fields": len(load), "crops": cut, "skipped": info["counts"]["skipped"], "wall_s": round(wall, 3),
               "cpu_s": round(cpu, 3), "crops_per_core_s": round(cut / cpu, 1), "crops_per_wall_s": round(cut / wall, 1),
               "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)})


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_ingest_benchmark(field_counts: list[int], cells: int = 200, crop: int = 64) -> dict[str, Any]:
    """Every field count in its own spawned process, on one scratch screen; the JSON figures."""
    scratch = Path(tempfile.mkdtemp(prefix="bench-ingest-"))
    context = multiprocessing.get_context("spawn")
    try:
        runs = []
        for fields in field_counts:
            table = write_screen(scratch, fields, cells)
            queue = context.Queue()
            child = context.Process(target=measure, args=(str(table), str(scratch / f"part-{fields}"), crop, queue))
            child.start()
            runs.append(queue.get())
            child.join()
            shutil.rmtree(scratch / f"part-{fields}", ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    best = max(runs, key=lambda r: r["fields"])
    return {"benchmark": "ingest", "field": [CHANNELS, SIDE, SIDE], "dtype": "uint16", "cells_per_field": cells,
            "crop_size": crop, "goal_crops_per_core_s": 2000, "crops_per_core_s": best["crops_per_core_s"],
            "crops_per_wall_s": best["crops_per_wall_s"], "peak_rss_mb": {str(r["fields"]): r["peak_rss_mb"] for r in runs},
            "runs": runs}
