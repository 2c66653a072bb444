"""What opening a dataset costs as it grows: the per-cell table against the JSON index it replaced.

    python -m training bench scale [--sizes 100000,1000000,10000000] [--out scale.json]

For each N a packed dataset of N cells (5 x 50 x 50 uint16, realistic paths, a plate map's columns)
is generated in a scratch folder: the table written as `prepare` writes it, the pixel files sparse
(no pixel is written, as none is read but a batch). Each figure is measured in a fresh process:

    open_s, rss_open_mb     time to open the dataset (its index read, its table mapped), RSS added by it
    rss_batch_mb            RSS added after opening and reading one batch of 256 random cells
                            (labels and batches read as a training step reads them), the batch's 6.4 MB
                            included; measured after a warm-up on a 1,000-cell dataset, so that the
                            libraries' own pages, loaded once per process whatever N, are not counted
    anon_open_mb, anon_batch_mb   the same, private memory only (RssAnon): the rest of the RSS is pages
                            of the memory-mapped files, shared by every process on the node through the
                            page cache and given back under pressure (random reads map the kernel's
                            read-ahead window around each cell: a bound set by the batch, not by N)
    worker_bytes            what a spawned DataLoader worker receives: the reader pickled after the batch
    split_save_s, split_load_s, split_rss_mb   the split by row (split.npy) written and read back
    features_load_s, features_rss_mb           a feature set of N rows (its rows.npy and index) loaded
    v1_open_s, v1_rss_mb, v1_worker_bytes      the same cells behind the JSON index of format v1, opened
                            as the reader did before the table (json.loads, then lists and arrays), and
                            pickled with those lists: the "before" of the table (up to 10^6 cells: its
                            JSON alone is ~0.8 GB at 10^7)

Also `prepare_images_per_core_s`: `prepare` on 2,000 synthetic TIFFs, images per CPU-second.
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
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

log = logging.getLogger(__name__)

SHAPE = (5, 50, 50)
BATCH = 256
V1_LIMIT = 1_000_000
PLATES, WELLS, SITES = 40, 384, 9


def synthetic_table(n: int) -> pa.Table:
    """N cells' rows with CellProfiler-like paths and plate-map columns, built without Python objects per cell."""
    cell = np.arange(n, dtype=np.int64)
    plate, well = cell % PLATES, (cell // PLATES) % WELLS
    names = np.char.add(np.char.add(np.char.add(np.char.add(
        np.char.add(b"screen-2026/Plate", np.char.zfill(plate.astype("S"), 3)), b"/images/r"),
        np.char.zfill((well // 24).astype("S"), 2)), np.char.add(b"c", np.char.zfill((well % 24).astype("S"), 2))),
        np.char.add(b"f01p01-ch1sk1fk1fl1.tiff#", cell.astype("S")))
    text = lambda values: pa.array(values).cast(pa.string())  # noqa: E731
    return pa.table({
        "path": pa.array(names).cast(pa.large_string()),
        **storage_columns(cell),
        "Metadata_Plate": text(np.char.add(b"P", plate.astype("S"))),
        "Metadata_Well": text(np.char.add(b"W", well.astype("S"))),
        "Metadata_Treatment": text(np.char.add(b"cpd", (well % 300).astype("S"))),
        "Metadata_Batch": text(np.char.add(b"B", (plate // 10).astype("S"))),
    })


def storage_columns(cell: np.ndarray) -> dict[str, pa.Array]:
    """Where each cell's pixels lie in the sparse shards of write_dataset (4 GiB each)."""
    elements = int(np.prod(SHAPE))
    per_shard = (4 << 30) // (elements * 2)
    return {"shard": pa.array((cell // per_shard).astype(np.uint16)), "offset": pa.array((cell % per_shard) * elements),
            "height": pa.array(np.full(len(cell), SHAPE[1], np.int32)),
            "width": pa.array(np.full(len(cell), SHAPE[2], np.int32))}


def write_dataset(folder: Path, n: int, table: pa.Table | None = None) -> None:
    """index.json, cells.arrow and sparse pixel files, as `prepare` lays them out; `table`: the cells'
    rows (path, storage_columns and metadata), synthetic_table's by default."""
    from training.data.store.cells import CELLS_FILE, write_table
    from training.data.store.format import FORMAT, INDEX_FILE, shard_name
    from training.writes.atomic import write_json_atomic

    folder.mkdir(parents=True)
    table = synthetic_table(n) if table is None else table
    written = write_table(folder / CELLS_FILE, table)
    elements = int(np.prod(SHAPE))
    per_shard = (4 << 30) // (elements * 2)
    shards = []
    for number in range((n + per_shard - 1) // per_shard):
        count = min(per_shard, n - number * per_shard)
        with open(folder / shard_name(number), "wb") as handle:
            handle.truncate(count * elements * 2)
        shards.append({"file": shard_name(number), "elements": count * elements, "bytes": count * elements * 2,
                       "crc32": None})
    write_json_atomic(folder / INDEX_FILE, {
        "format": FORMAT, "dtype": "<u2", "channels": SHAPE[0], "n_cells": n, "shape": list(SHAPE),
        "shards": shards, "table": {"file": CELLS_FILE, "bytes": written.bytes, "crc32": f"{written.crc32:08x}",
                                    "columns": written.columns}})


def write_v1_index(folder: Path, table: pa.Table) -> None:
    """The same cells behind a v1 index.json (every path, label, shape and offset listed)."""
    folder.mkdir(parents=True)
    n = table.num_rows
    labels = table.column("Metadata_Treatment").combine_chunks().dictionary_encode()
    (folder / "images.bin").touch()
    with open(folder / "index.json", "w") as handle:
        json.dump({"format": "scdino-packed-v1", "dtype": "<u2", "channels": SHAPE[0],
                   "paths": table.column("path").to_pylist(), "labels": labels.indices.to_pylist(),
                   "class_names": labels.dictionary.to_pylist(), "shapes": [list(SHAPE)] * n,
                   "offsets": (np.arange(n) * int(np.prod(SHAPE))).tolist(), "total_elements": n * int(np.prod(SHAPE))},
                  handle)


PROBE = r"""
import json, pickle, sys, time
import numpy as np
def status(key):
    return int(next(l for l in open("/proc/self/status") if l.startswith(key + ":")).split()[1]) / 1024
def rss():
    return status("VmRSS")
def anon():
    return status("RssAnon")
folder, what, warm = sys.argv[1], sys.argv[2], sys.argv[3]
def open_and_read(folder):
    images = PackedImages(folder, label_column="Metadata_Treatment", batch_column="Metadata_Batch")
    len(images.paths)
    rows = np.sort(np.random.default_rng(0).choice(len(images), 256, replace=False))
    batch = images.read_batch(rows); labels = images.labels[rows]; batches = images.batch_categories().codes[rows]
    return images, batch
if what == "table":
    from training.data.store.read import PackedImages
    open_and_read(warm)  # the libraries' own pages, loaded once per process whatever N is
    base, base_anon = rss(), anon(); start = time.perf_counter()
    images = PackedImages(folder, label_column="Metadata_Treatment", batch_column="Metadata_Batch")
    len(images.paths)  # maps the table
    opened = time.perf_counter() - start; rss_open, anon_open = rss() - base, anon() - base_anon
    images, batch = open_and_read(folder)
    out = {"open_s": opened, "rss_open_mb": rss_open, "anon_open_mb": anon_open, "rss_batch_mb": rss() - base,
           "anon_batch_mb": anon() - base_anon, "worker_bytes": len(pickle.dumps(images)),
           "batch_shape": list(batch.shape)}
    print(json.dumps(out))
else:
    base, base_anon = rss(), anon(); start = time.perf_counter()
    meta = json.load(open(folder + "/index.json"))
    labels = np.asarray(meta["labels"], dtype=np.int64)
    shapes = np.asarray(meta["shapes"], dtype=np.int64).reshape(-1, 3)
    offsets = np.asarray(meta["offsets"], dtype=np.int64)
    out = {"v1_open_s": time.perf_counter() - start, "v1_rss_mb": rss() - base, "v1_anon_mb": anon() - base_anon,
           "v1_worker_bytes": len(pickle.dumps((meta, labels, shapes, offsets)))}
    print(json.dumps(out))
"""


def probe(folder: Path, what: str, warm: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, str(folder), what, str(warm)], capture_output=True, text=True,
                          check=False, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"the {what} probe failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith("VmRSS")).split()[1]) / 1024


def split_and_features(folder: Path, n: int) -> dict:
    """Write and read back a split by row and a feature set of N rows (4-d features) in this process."""
    from training.rundir import RunLayout
    from training.rundir.features import INDEX_FILE, FeatureSet, load_features, save_features

    layout = RunLayout(folder)
    member = np.zeros(n, np.uint8)
    member[::5] = 1
    start = time.perf_counter()
    np.save(layout.split_rows, member)
    saved = time.perf_counter() - start
    base, start = rss_mb(), time.perf_counter()
    loaded = np.load(layout.split_rows, mmap_mode="r")
    train, holdout = np.flatnonzero(loaded == 0), np.flatnonzero(loaded == 1)
    split = {"split_save_s": saved, "split_load_s": time.perf_counter() - start, "split_rss_mb": rss_mb() - base,
             "n_holdout": int(len(holdout))}
    del train, holdout, loaded
    features = layout.features("final")
    save_features(features, FeatureSet(np.zeros((n, 4), np.float32), np.arange(n, dtype=np.int64)))
    base, start = rss_mb(), time.perf_counter()
    feature_set = load_features(features, mmap=True)
    split.update(features_load_s=time.perf_counter() - start, features_rss_mb=rss_mb() - base,
                 features_index_bytes=(features / INDEX_FILE).stat().st_size)
    del feature_set
    return split


def prepare_rate(scratch: Path, images: int = 2000) -> dict:
    """`prepare` on synthetic TIFFs: images per CPU-second (user + system time of this process)."""
    from training.data.folders.index import scan_images
    from training.data.folders.pack import pack_images
    from training.data.synthetic.folders import write_dataset as write_tiffs

    source = scratch / "tiffs"
    write_tiffs(source, classes=4, per_class=images // 4, channels=SHAPE[0], size=SHAPE[1], seed=0)
    index = scan_images(source, 0)
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    pack_images(source, index, scratch / "packed-tiffs", channel_axis="last", on_bad=lambda bad: None)
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"prepare_images": len(index), "prepare_wall_s": round(time.perf_counter() - start, 3),
            "prepare_cpu_s": round(cpu, 3), "prepare_images_per_core_s": round(len(index) / max(cpu, 1e-9), 1)}


def run_scale_benchmark(sizes: list[int], *, prepare_images: int = 2000, scratch: Path | None = None) -> dict:
    """The figures of the module docstring, one row per size."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-scale-", dir=scratch) as tmp:
        root = Path(tmp)
        write_dataset(root / "warm", 1000)
        for n in sizes:
            log.info("bench scale: %d cells", n)
            folder = root / f"n{n}"
            start = time.perf_counter()
            write_dataset(folder, n)
            row = {"n_cells": n, "generate_s": round(time.perf_counter() - start, 2),
                   "table_bytes": (folder / "cells.arrow").stat().st_size, **probe(folder, "table", root / "warm"),
                   **split_and_features(folder, n)}
            if n <= V1_LIMIT:
                write_v1_index(root / f"v1-{n}", synthetic_table(n))
                row.update(probe(root / f"v1-{n}", "v1", root / "warm"))
                shutil.rmtree(root / f"v1-{n}")
            rows.append({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()})
            shutil.rmtree(folder)
        rate = prepare_rate(root, prepare_images) if prepare_images else {}
    return {"benchmark": "scale", "shape": list(SHAPE), "batch": BATCH, "rows": rows, **rate}
