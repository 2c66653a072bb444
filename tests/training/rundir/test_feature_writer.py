"""Feature sets written as the rows come (training/rundir/features.py): FeatureSetWriter gives
save_features' bytes block by block, an interrupted one leaves nothing that reads as complete, and
merge_parts makes the same set of ranks' parts in any order, a block at a time."""

from __future__ import annotations

import io
import json
import tracemalloc
import zlib

import numpy as np
import pytest

import training.rundir.features as features_module
from training.errors import DamagedFileError, MissingInputError, UserError
from training.rundir.features import (
    FeaturePartWriter,
    FeatureSet,
    FeatureSetWriter,
    checked_index,
    crc32_combine,
    load_features,
    merge_parts,
    read_index,
    save_features,
)

META = {"tag": "final", "epoch": 4, "kind": "checkpoint"}


def _rows(n=1000, d=7, seed=0):
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(5 * n, n, replace=False)).astype(np.int64), rng.standard_normal((n, d)).astype(np.float32)


def _npy_bytes(array):
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def _files(directory):
    return {name: (directory / name).read_bytes() for name in ("features.npy", "rows.npy", "index.json")}


def test_crc32_combine_joins_two_crcs_as_zlib_computes_the_whole():
    rng = np.random.default_rng(1)
    data = rng.bytes(300_007)
    for cut in (0, 1, 128, 65_536, 300_000, len(data)):
        first, second = data[:cut], data[cut:]
        assert crc32_combine(zlib.crc32(first), zlib.crc32(second), len(second)) == zlib.crc32(data), cut


def test_blocks_streamed_give_save_features_bytes_and_np_save_s(tmp_path):
    rows, features = _rows()
    save_features(tmp_path / "whole", FeatureSet(features, rows, META))
    with FeatureSetWriter(tmp_path / "streamed", 7, META) as writer:
        for start in range(0, len(rows), 97):  # blocks of 97 rows, the last shorter
            writer.append(rows[start:start + 97], features[start:start + 97])
    streamed = _files(tmp_path / "streamed")
    assert streamed == _files(tmp_path / "whole")
    assert streamed["features.npy"] == _npy_bytes(features) and streamed["rows.npy"] == _npy_bytes(rows)
    index = json.loads(streamed["index.json"])
    assert index == {**META, "n_images": 1000, "dim": 7,
                     "features_bytes": len(streamed["features.npy"]),
                     "features_crc32": f"{zlib.crc32(streamed['features.npy']):08x}",
                     "rows_bytes": len(streamed["rows.npy"]), "rows_crc32": f"{zlib.crc32(streamed['rows.npy']):08x}"}
    assert list(json.loads(streamed["index.json"])) == list(index)  # the keys in save_features' order
    loaded = load_features(tmp_path / "streamed")  # every row read: CRC-32s checked
    np.testing.assert_array_equal(loaded.features, features)
    np.testing.assert_array_equal(loaded.indices, rows)


def test_an_empty_set_is_a_set_of_no_rows(tmp_path):
    with FeatureSetWriter(tmp_path, 5, META):
        pass
    assert (tmp_path / "features.npy").read_bytes() == _npy_bytes(np.zeros((0, 5), np.float32))
    assert load_features(tmp_path).features.shape == (0, 5)


def test_rows_must_rise_across_blocks_and_blocks_fit_the_width(tmp_path):
    rows, features = _rows(20, 3)
    with pytest.raises(ValueError, match="ascending and distinct"), FeatureSetWriter(tmp_path, 3) as writer:
        writer.append(rows[10:], features[10:])
        writer.append(rows[:10], features[:10])
    with pytest.raises(ValueError, match="ascending and distinct"), FeatureSetWriter(tmp_path, 3) as writer:
        writer.append(rows[[0, 0]], features[:2])
    with pytest.raises(ValueError, match=r"expected \(4, 3\)"), FeatureSetWriter(tmp_path, 3) as writer:
        writer.append(rows[:4], features[:4, :2])
    assert list(tmp_path.iterdir()) == []


def test_a_writer_interrupted_mid_set_leaves_nothing_that_reads_as_complete(tmp_path):
    rows, features = _rows()
    with pytest.raises(KeyboardInterrupt), FeatureSetWriter(tmp_path / "new", 7, META) as writer:
        writer.append(rows[:500], features[:500])
        raise KeyboardInterrupt
    assert list((tmp_path / "new").iterdir()) == []  # no index, and no temporary file left
    assert read_index(tmp_path / "new") is None
    with pytest.raises(MissingInputError, match="run `python -m training features` first"):
        load_features(tmp_path / "new")
    save_features(tmp_path / "old", FeatureSet(features, rows, META))
    before = _files(tmp_path / "old")
    with pytest.raises(KeyboardInterrupt), FeatureSetWriter(tmp_path / "old", 7, {"tag": "other"}) as writer:
        writer.append(rows[:10], features[:10] + 1)
        raise KeyboardInterrupt
    assert _files(tmp_path / "old") == before and checked_index(tmp_path / "old")["tag"] == "final"


def test_a_crash_between_the_arrays_and_the_index_leaves_an_incomplete_set(tmp_path, monkeypatch):
    """The arrays are renamed into place, then the index is written: a crash between leaves arrays
    without an index, which the next read reports as incomplete (and `features` recomputes)."""
    rows, features = _rows()
    save_features(tmp_path, FeatureSet(features, rows, META))

    def crash(*args, **kwargs):
        raise OSError("no space left on device")

    monkeypatch.setattr(features_module, "write_json_atomic", crash)
    with pytest.raises(OSError), FeatureSetWriter(tmp_path, 7, META) as writer:
        writer.append(rows[:3], features[:3])
    assert not (tmp_path / "index.json").exists()
    with pytest.raises(DamagedFileError, match=r"index\.json is missing \(features\.npy is there\): "
                                               r"rerun `python -m training features`"):
        read_index(tmp_path)


def _peak_while(write):
    """Peak traced Python and numpy memory while `write()` runs, above what was held before it."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        write()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def test_the_writer_holds_no_more_than_the_block_it_is_given(tmp_path):
    blocks, n, d = 40, 2000, 64
    block_bytes = n * d * 4  # 512 kB a block, 20 MB in all

    def write():
        rng = np.random.default_rng(0)
        with FeatureSetWriter(tmp_path, d) as writer:
            for k in range(blocks):
                writer.append(np.arange(k * n, (k + 1) * n), rng.standard_normal((n, d), dtype=np.float32))

    peak = _peak_while(write)
    assert (tmp_path / "features.npy").stat().st_size > blocks * block_bytes
    assert peak < 4 * block_bytes  # this block, the one it replaces, the rows and their difference


def _write_parts(directory, rows, features, shards, d, per_append=13):
    """Each rank's rows in the order `shards[rank]` lists them (positions into rows), in small appends."""
    for rank, positions in enumerate(shards):
        with FeaturePartWriter(directory, rank, len(shards), d) as part:
            for start in range(0, len(positions), per_append):
                chosen = positions[start:start + per_append]
                part.append(rows[chosen], features[chosen])


def test_parts_in_any_order_merge_into_save_features_bytes_and_are_removed(tmp_path, monkeypatch):
    rows, features = _rows()
    save_features(tmp_path / "whole", FeatureSet(features, rows, META))
    order = np.random.default_rng(2).permutation(len(rows))
    shards = [np.sort(order[:600]), order[600:990], np.arange(0), np.sort(order[990:])]  # rank 1 out of order
    monkeypatch.setattr(features_module, "MERGE_BYTES", 7 * 4 * 50)  # 50 rows a round: many rounds
    _write_parts(tmp_path / "merged", rows, features, shards, 7)
    merge_parts(tmp_path / "merged", 4, 7, META)
    assert _files(tmp_path / "merged") == _files(tmp_path / "whole")
    assert sorted(p.name for p in (tmp_path / "merged").iterdir()) == ["features.npy", "index.json", "rows.npy"]


def test_overlapping_parts_are_refused_and_leave_no_set(tmp_path):
    rows, features = _rows(100, 3)
    _write_parts(tmp_path, rows, features, [np.arange(0, 60), np.arange(50, 100)], 3)
    with pytest.raises(RuntimeError, match="ranks extracted overlapping shards"):
        merge_parts(tmp_path, 2, 3, META)
    assert read_index(tmp_path) is None


def test_a_part_missing_names_the_shared_file_system(tmp_path):
    rows, features = _rows(10, 3)
    with FeaturePartWriter(tmp_path, 0, 2, 3) as part:  # rank 1's part never reached this file system
        part.append(rows, features)
    with pytest.raises(UserError, match=r"part-00001-of-00002\.features\.npy is missing .* every node shares"):
        merge_parts(tmp_path, 2, 3, META)


def test_the_merge_holds_a_block_whatever_the_set_s_size(tmp_path, monkeypatch):
    n, d, ranks = 40_000, 32, 2
    rng = np.random.default_rng(3)
    rows, features = np.arange(n, dtype=np.int64), rng.standard_normal((n, d), dtype=np.float32)
    _write_parts(tmp_path, rows, features, [np.arange(r, n, ranks) for r in range(ranks)], d, per_append=4000)
    del features
    block_bytes = 1000 * d * 4  # 128 kB against the set's 5 MB
    monkeypatch.setattr(features_module, "MERGE_BYTES", block_bytes)
    peak = _peak_while(lambda: merge_parts(tmp_path, ranks, d, META))
    assert read_index(tmp_path)["n_images"] == n
    assert peak < 6 * block_bytes  # the rows, the features joined and put in order, and their rows' order
