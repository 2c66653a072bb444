"""What it costs to never hand out a wrong row of the per-cell table, at 10^5 to 10^7 cells.

    python -m training.benchmarks.data.table_checks [--sizes 100000,1000000,10000000] [--repeats 3] [--out checks.json]

For each N, the packed dataset of `bench scale` (training/benchmarks/data/scale.py: 5 x 50 x 50 uint16
cells, CellProfiler-like paths, a plate map's columns; sparse pixel files) is written, then measured
in fresh processes, page cache warm (the table was just written), medians of --repeats:

    open_s          PackedImages opened: index.json, every file's size, the table's footer
    first_batch_s   then what a training process reads first: labels, batch codes and one batch of
                    256 random cells, which checks the columns it reads (shard, offset, the label and
                    batch codes: CellTable checks a column once per process)
    checks_s        the part of first_batch_s spent checking those columns
    next_batch_s    a second batch (nothing left to check)

and, in one process, each way of checking the table on its own:

    training_columns_s   column_checksum of the four columns training reads (what checks_s pays)
    all_columns_s        every column (a step that reads the whole table: `export`, `--verify`)
    file_crc32_s         the CRC-32 of the whole file (what a check at every open would cost)
    validate_full_s      Arrow's own table.validate(full=True) (bounds of indices and offsets, UTF-8;
                         blind to a garbled number)

with the bytes each reads (`training_columns_bytes`, `table_bytes`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

log = logging.getLogger(__name__)

TRAINING_COLUMNS = ("shard", "offset", "Metadata_Treatment", "Metadata_Batch")
"""What a pretraining process reads of the table: where each cell is, its label and its batch."""

PROBE = r"""
import json, sys, time
import numpy as np
from training.data.store.cells import CellTable
from training.data.store.read import PackedImages
folder = sys.argv[1]
check, spent = CellTable._check, [0.0]
def timed_check(self, name, array):
    start = time.perf_counter()
    check(self, name, array)
    spent[0] += time.perf_counter() - start
CellTable._check = timed_check
start = time.perf_counter()
images = PackedImages(folder, label_column="Metadata_Treatment", batch_column="Metadata_Batch")
opened = time.perf_counter() - start
rng = np.random.default_rng(0)
start = time.perf_counter()
labels, batches = images.labels, images.batch_categories().codes
images.read_batch(np.sort(rng.choice(len(images), 256, replace=False)))
first = time.perf_counter() - start
start = time.perf_counter()
images.read_batch(np.sort(rng.choice(len(images), 256, replace=False)))
print(json.dumps({"open_s": opened, "first_batch_s": first, "checks_s": spent[0],
                  "next_batch_s": time.perf_counter() - start}))
"""


def probe(folder: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, str(folder)], capture_output=True, text=True, check=False,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"the probe failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def timed(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def standalone(folder: Path, repeats: int) -> dict:
    """Each way of checking the table, timed in this process on its map."""
    import pyarrow as pa

    from training.data.store.cells import CELLS_FILE, column_checksum, one_array, read_table
    from training.rundir.integrity import file_crc32

    path = folder / CELLS_FILE
    table = read_table(path)
    arrays = {name: one_array(table, name) for name in table.column_names}
    used = [arrays[name] for name in TRAINING_COLUMNS]
    buffers = lambda array: sum(b.size for b in array.buffers() if b is not None)  # noqa: E731
    return {
        "table_bytes": path.stat().st_size,
        "training_columns_bytes": sum(buffers(array) for array in used),
        "training_columns_s": timed(lambda: [column_checksum(array) for array in used], repeats),
        "all_columns_s": timed(lambda: [column_checksum(array) for array in arrays.values()], repeats),
        "file_crc32_s": timed(lambda: file_crc32(path), repeats),
        "validate_full_s": timed(lambda: table.validate(full=True), repeats),
        "zlib_crc32_gb_per_s": round(path.stat().st_size / 1e9 / timed(
            lambda: zlib.crc32(pa.memory_map(str(path)).read_buffer()), repeats), 2),
    }


def run_table_checks(sizes: list[int], repeats: int = 3, scratch: Path | None = None) -> dict:
    from training.benchmarks.data.scale import write_dataset

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-table-checks-", dir=scratch) as tmp:
        for n in sizes:
            log.info("table checks: %d cells", n)
            folder = Path(tmp) / f"n{n}"
            write_dataset(folder, n)
            runs = [probe(folder) for _ in range(repeats)]
            row: dict = {"n_cells": n, **{key: statistics.median(r[key] for r in runs) for key in runs[0]}}
            row.update(standalone(folder, repeats))
            rows.append({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()})
            for path in folder.iterdir():
                path.unlink()
            folder.rmdir()
    return {"benchmark": "table_checks", "repeats": repeats, "training_columns": list(TRAINING_COLUMNS),
            "cpus": os.cpu_count(), "load_average": os.getloadavg(), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000,10000000", help="dataset sizes in cells")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes (and timings) per figure")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    result = run_table_checks([int(s) for s in args.sizes.split(",")], args.repeats)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
