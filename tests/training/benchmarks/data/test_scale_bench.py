"""bench scale at a small size: the generated dataset opens through the product's reader, and the
JSON holds each figure, the table's against the v1 JSON index's."""



from training.benchmarks.data.scale import run_scale_benchmark
from training.cli import main


def test_the_table_reader_sends_a_worker_less_than_the_v1_index_and_grows_slower(tmp_path):
    result = run_scale_benchmark([2000, 20000], prepare_images=40, scratch=tmp_path)
    small, large = result["rows"]
    for row in (small, large):
        assert row["batch_shape"] == [256, 5, 50, 50]
        assert row["open_s"] >= 0 and row["anon_batch_mb"] >= 0 and row["n_holdout"] == row["n_cells"] // 5
    assert large["worker_bytes"] < 5000 < large["v1_worker_bytes"]
    assert large["v1_worker_bytes"] > 5 * small["v1_worker_bytes"]  # the v1 pickle grows with the cells
    assert large["worker_bytes"] - small["worker_bytes"] < 100  # the table's handle does not
    assert large["table_bytes"] > 5 * small["table_bytes"]
    assert result["prepare_images"] == 40 and result["prepare_images_per_core_s"] > 0


def test_sizes_too_small_are_refused(capsys):
    assert main(["bench", "scale", "--sizes", "10,abc"]) == 2
    assert "--sizes '10,abc': give cell counts of at least 1000" in capsys.readouterr().err
