"""The per-cell table and the parts it is merged from: labels and batches from any column, pixel
files across shards, parts of different pixel types, a reader that pickles to a handle, and the
evaluated sample of held-out cells."""

import pickle

import numpy as np
import pyarrow as pa
import pytest

from tests.support.packing import write_packed
from training.data.split import Split, evaluated_rows, stratified_sample
from training.data.store.cells import CellTable, categories_of
from training.data.store.merge import merge_parts
from training.data.store.read import PackedImages
from training.data.store.write import PartWriter
from training.errors import UserError


def images(n, shape=(2, 6, 5), dtype=np.uint16, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 200, shape).astype(dtype) for _ in range(n)]


PLATE_MAP = {"Metadata_Treatment": ["DMSO", "cpdB", "cpdA", "DMSO", "cpdB", None],
             "Metadata_Batch": ["b2", "b1", "b1", "b2", "b2", "b1"], "Metadata_Dose": [10, 2, 2, 0, 10, 1]}


def test_labels_and_batches_come_from_the_columns_the_config_names(tmp_path):
    write_packed(tmp_path / "p", images(6), ["x"] * 6, PLATE_MAP)
    packed = PackedImages(tmp_path / "p", label_column="Treatment", batch_column="Metadata_Batch")
    assert packed.class_names == ["DMSO", "cpdA", "cpdB"]  # sorted: the codes are the class ids
    assert packed.labels.tolist() == [0, 2, 1, 0, 2, -1]  # no value: -1, left out of the evaluation
    batches = packed.batch_categories()
    assert batches.names == ["b1", "b2"] and batches.codes.tolist() == [1, 0, 0, 1, 1, 0]
    dose = PackedImages(tmp_path / "p", label_column="Dose")
    assert dose.class_names == ["0", "1", "2", "10"] and dose.labels.tolist() == [3, 2, 2, 0, 3, 1]  # numbers in order
    assert PackedImages(tmp_path / "p").class_names == ["x"]  # default: the class folders
    with pytest.raises(UserError, match=r"data.label_column='Plate' names no column of the per-cell table \(its "
                                        r"columns: Metadata_Class, Metadata_Treatment, Metadata_Batch, Metadata_Dose\)"):
        _ = PackedImages(tmp_path / "p", label_column="Plate").labels


def test_categories_of_a_dictionary_written_elsewhere_are_sorted_too():
    unsorted = pa.DictionaryArray.from_arrays(pa.array([0, 1, 0, None], pa.int32()), pa.array(["zeta", "alpha"]))
    found = categories_of(unsorted)
    assert found.names == ["alpha", "zeta"] and found.codes.tolist() == [1, 0, 1, -1]


def test_cells_across_pixel_files_and_parts_read_back_exactly(tmp_path):
    first, second = images(7, seed=1), images(5, seed=2)
    for name, cells, offset in (("a", first, 0), ("b", second, 7)):
        writer = PartWriter(tmp_path / name, channels=2, dtype=np.uint16, shard_bytes=3 * first[0].nbytes)
        for i, image in enumerate(cells):
            writer.append(image, f"cell{offset + i}", {"Metadata_Class": "c", "Metadata_Index": offset + i})
        writer.finish()
    index = merge_parts([tmp_path / "a", tmp_path / "b"], tmp_path / "packed")
    assert len(index["shards"]) == 3 + 2  # three files of at most three cells, then two
    packed = PackedImages(tmp_path / "packed")
    everything = first + second
    assert list(packed.paths) == [f"cell{i}" for i in range(12)]
    assert packed.table.numbers("Metadata_Index").tolist() == list(range(12))
    rows = np.array([11, 0, 4, 7, 3])
    np.testing.assert_array_equal(packed.read_batch(rows), np.stack([everything[i] for i in rows]))
    for i in range(12):
        np.testing.assert_array_equal(packed.read(i), everything[i])
    assert packed.verify()
    assert (tmp_path / "a" / "images-00000.bin").stat().st_ino == (tmp_path / "packed" / "images-00000.bin").stat().st_ino


def test_parts_of_different_pixel_types_are_merged_in_the_widest(tmp_path):
    small, large = images(3, dtype=np.uint8), [np.full((2, 6, 5), 60000, np.uint16)]
    for name, cells in (("a", small), ("b", large)):
        writer = PartWriter(tmp_path / name, channels=2, dtype=cells[0].dtype)
        for i, image in enumerate(cells):
            writer.append(image, f"{name}{i}", {"Metadata_Class": name})
        writer.finish()
    merge_parts([tmp_path / "a", tmp_path / "b"], tmp_path / "packed")
    packed = PackedImages(tmp_path / "packed")
    assert packed.dtype == np.uint16 and packed.verify()  # the rewritten file's checksum recorded
    for i, image in enumerate(small + large):
        np.testing.assert_array_equal(packed.read(i), image)


def test_an_unfinished_part_is_named_and_nothing_is_merged(tmp_path):
    writer = PartWriter(tmp_path / "a", channels=2, dtype=np.uint16)
    writer.append(images(1)[0], "x", {})
    with pytest.raises(UserError, match=r"1 part\(s\) are not finished \(.*a\): run their tasks again"):
        merge_parts([tmp_path / "a"], tmp_path / "packed")
    assert not (tmp_path / "packed").exists()


def test_a_loader_worker_receives_the_folder_not_the_table(tmp_path):
    n = 3000
    write_packed(tmp_path / "p", images(n, shape=(1, 2, 2)), [f"class{i % 7}" for i in range(n)])
    packed = PackedImages(tmp_path / "p")
    packed.read_batch(np.arange(0, n, 100))
    _ = packed.labels
    sent = pickle.dumps(packed)
    assert len(sent) < 2000  # the folder and the index's few keys; the table is mapped again in the worker
    again = pickle.loads(sent)
    np.testing.assert_array_equal(again.labels, packed.labels)
    np.testing.assert_array_equal(again.read(2999), packed.read(2999))


def test_the_evaluated_cells_are_a_seeded_stratified_sample_above_the_cap(make_config):
    labels = np.repeat([0, 1, 2, -1], [600, 300, 100, 50])
    rows = np.arange(len(labels))
    sample = stratified_sample(labels, rows[:1000], 100, seed=3)
    assert np.bincount(labels[sample]).tolist() == [60, 30, 10]
    np.testing.assert_array_equal(sample, stratified_sample(labels, rows[:1000], 100, seed=3))
    assert not np.array_equal(sample, stratified_sample(labels, rows[:1000], 100, seed=4))
    np.testing.assert_array_equal(stratified_sample(labels, rows[:1000], 0, seed=3), rows[:1000])  # 0: all

    class Cells:
        pass

    cells = Cells()
    cells.labels = labels
    held = Split(train=np.arange(0, 1050, 2), holdout=np.arange(1, 1050, 2))
    chosen = evaluated_rows(make_config({"eval.max_cells": 50}), cells, held)
    assert len(chosen) == 50 and set(chosen) <= set(held.holdout) and (labels[chosen] >= 0).all()
    everything = evaluated_rows(make_config({"eval.max_cells": 10_000}), cells, held)
    np.testing.assert_array_equal(everything, held.holdout[labels[held.holdout] >= 0])


def test_a_table_in_memory_pickles_with_its_rows(tmp_path):
    table = CellTable(tmp_path / "none.arrow", table=pa.table({"path": pa.array(["a"], pa.large_string())}))
    assert pickle.loads(pickle.dumps(table)).strings("path")[0] == "a"
