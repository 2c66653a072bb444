"""`python -m training plan`: the model's arithmetic against the code it models, its warnings and
their fixes, its inputs, and its speed (every preset in under 5 s)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from training.cli import main
from training.config import load_config
from training.costs.instances import INSTANCES
from training.planning import inputs
from training.planning.model import Storage, steps_per_epoch
from training.rundir import RunLayout

REPO = Path(__file__).resolve().parents[3]


def _config(tmp_path, *overrides: str):
    return load_config(None, [f"run.output_dir={tmp_path / 'run'}", *overrides])


def _rows(tmp_path, capsys, *args: str) -> list[dict]:
    out = tmp_path / "plan.json"
    assert main(["plan", "--set", f"run.output_dir={tmp_path / 'run'}", "--json", str(out), *args]) == 0
    capsys.readouterr()
    return json.loads(out.read_text())["rows"]


@pytest.mark.parametrize(("images", "ranks", "batch"), [(112, 2, 16), (1000, 8, 30), (1001, 3, 7), (64, 64, 1)])
def test_steps_per_epoch_is_what_the_sampler_draws(tmp_path, images, ranks, batch):
    import numpy as np

    from training.data.loading.sampler import DistributedBatchSampler

    work = inputs.workload(_config(tmp_path, f"optim.batch_size_per_gpu={batch}", "data.holdout_fraction=0"),
                           RunLayout(tmp_path / "run"), images)
    drawn = len(DistributedBatchSampler(np.arange(images), batch, rank=ranks - 1, world_size=ranks))
    assert steps_per_epoch(work, ranks) == drawn


def test_every_preset_is_answered_in_under_5_seconds(tmp_path):
    """The whole command, as a user runs it: a fresh interpreter, every preset, two node counts."""
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "training", "plan", "--images", "500000", "--preset", "all",
                             "--nodes", "1,2", "--set", f"run.output_dir={tmp_path}"], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    seconds = time.perf_counter() - start
    assert result.returncode == 0, result.stderr
    assert seconds < 5, f"plan took {seconds:.2f} s"
    for name in INSTANCES:
        assert sum(line.startswith(name + " ") for line in result.stdout.splitlines()) == 2, result.stdout
    assert "planned 12 row(s) for 6 preset(s) in" in result.stdout


def test_rows_carry_the_issue_s_fields_and_more_nodes_take_less_time(tmp_path, capsys):
    rows = _rows(tmp_path, capsys, "--images", "200000", "--preset", "p4d.24xlarge", "--nodes", "1,2,4")
    for row in rows:
        assert {"preset", "nodes", "wall_h", "gpu_h", "cost_usd", "bottleneck", "warnings"} <= set(row)
        assert row["bottleneck"] in ("gpu step", "loader cpu", "fsx", "network")
        assert row["cost_usd"] == pytest.approx(row["wall_h"] * row["nodes"] * 21.957642, rel=1e-3)
        assert row["gpu_h"] == pytest.approx(row["wall_h"] * row["nodes"] * 8, rel=1e-3)
    walls = [row["wall_h"] for row in rows]
    assert walls[0] > walls[1] > walls[2]  # weak scaling: fewer steps per rank
    assert [row["pretrain"]["ranks"] for row in rows] == [8, 16, 32]


def test_published_figures_are_named_when_nothing_was_measured(tmp_path, capsys):
    (row,) = _rows(tmp_path, capsys, "--images", "100000", "--preset", "g5.12xlarge", "--nodes", "1")
    assert row["basis"]["step"].startswith("measured MFU 13.7% (eager)")
    assert row["basis"]["loader"].startswith("published")
    assert "assumed 16-bit images" in row["dataset"]
    assert row["price"]["date"] == "2026-11-24" and row["price"]["usd_per_hour"] == 5.672


def test_a_slow_or_small_file_system_is_named_with_its_fix(tmp_path, capsys):
    args = ("--images", "4000000", "--image-bytes", "400000", "--preset", "p5.48xlarge", "--nodes", "1",
            "--set", "data.gpu_augment=true", "--set", "optim.epochs=1")
    (slow,) = _rows(tmp_path, capsys, *args, "-c", "storage.fsx_throughput_per_tib=125")
    assert slow["bottleneck"] == "fsx"
    assert any("FSx for Lustre at 146 MB/s" in w and "storage.fsx_throughput_per_tib" in w for w in slow["warnings"])
    assert any("(1600 GB) is larger than the file system" in w for w in slow["warnings"])
    (fast,) = _rows(tmp_path, capsys, *args, "-c", "storage.fsx_throughput_per_tib=1000",
                    "-c", "storage.fsx_capacity_gib=9600")
    assert not any("FSx" in w or "file system" in w for w in fast["warnings"])
    assert fast["wall_h"] < slow["wall_h"] and fast["bottleneck"] != "fsx"


def test_a_slow_loader_is_named_with_the_fix_the_vcpus_allow(tmp_path, capsys):
    loader = tmp_path / "loader.json"
    loader.write_text(json.dumps({"benchmark": "loader", "packed_cpu_ms_per_image": 50.0,
                                  "device_augment": {"cpu_ms_per_image": 1.0}}))
    common = ("--images", "100000", "--preset", "p5.48xlarge", "--nodes", "1", "--loader-json", str(loader))
    (few,) = _rows(tmp_path, capsys, *common, "--set", "data.num_workers=2")
    (many,) = _rows(tmp_path, capsys, *common, "--set", "data.num_workers=23")
    assert few["bottleneck"] == many["bottleneck"] == "loader cpu"
    assert any("data.num_workers=2: raise it towards the 23 spare vCPUs" in w for w in few["warnings"])
    assert any("24 vCPUs per GPU cannot make the crops" in w and "data.gpu_augment=true" in w
               for w in many["warnings"])
    (gpu,) = _rows(tmp_path, capsys, *common, "--set", "data.num_workers=23", "--set", "data.gpu_augment=true")
    assert gpu["bottleneck"] == "gpu step" and gpu["basis"]["loader"].startswith("measured: bench loader, device")


def test_a_batch_that_cannot_fit_the_gpu_is_named(tmp_path, capsys):
    (big,) = _rows(tmp_path, capsys, "--images", "100000", "--preset", "g4dn.12xlarge", "--nodes", "1",
                   "--set", "optim.batch_size_per_gpu=256", "--set", "data.gpu_augment=true")
    assert any("lower optim.batch_size_per_gpu or shard the state" in w for w in big["warnings"])
    (fits,) = _rows(tmp_path, capsys, "--images", "100000", "--preset", "p5en.48xlarge", "--nodes", "1",
                    "--set", "optim.batch_size_per_gpu=32", "--set", "data.gpu_augment=true")
    assert not any("batch_size_per_gpu" in w for w in fits["warnings"])


def _step_json(tmp_path, device: str, mfu: float | None, step_s: float = 0.5, batch: int = 30) -> Path:
    path = tmp_path / f"step_{device.replace(' ', '_')}.json"
    path.write_text(json.dumps({
        "benchmark": "step", "device": device, "step_time_s": step_s, "backward_s": step_s / 2, "params": 44_000_000,
        "flops_per_step": batch * 114.8e9, "mfu": mfu, "peak_memory_gb": None, "batch_size": batch,
        "startup_s": 7.0, "warmup_step_s": step_s * 3, "checkpoint_s": 1.5}))
    return path


def test_a_measured_step_is_used_as_is_on_its_gpu_and_at_its_mfu_elsewhere(tmp_path, capsys):
    step = _step_json(tmp_path, "NVIDIA A100-SXM4-40GB", mfu=0.3)
    rows = _rows(tmp_path, capsys, "--images", "100000", "--preset", "p4d.24xlarge", "--preset", "p5.48xlarge",
                 "--nodes", "1", "--step-json", str(step), "--set", "data.gpu_augment=true")
    a100, h100 = rows
    assert a100["basis"]["step"].startswith("measured: bench step on NVIDIA A100")
    assert a100["pretrain"]["compute_s"] == pytest.approx(0.5)
    assert "measured MFU (30.0%)" in h100["basis"]["step"]
    assert h100["pretrain"]["compute_s"] == pytest.approx(30 * 114.8e9 / (0.3 * 989e12), rel=1e-3)
    assert a100["pretrain"]["startup_s"] == 7.0 and a100["pretrain"]["checkpoint_s"] == 1.5
    cpu = _step_json(tmp_path, "cpu", mfu=None)
    (row,) = _rows(tmp_path, capsys, "--images", "100000", "--preset", "p4d.24xlarge", "--nodes", "1",
                   "--step-json", str(cpu))
    assert "not transferable" in row["basis"]["step"] and row["basis"]["step"].startswith("measured MFU 13.7% (eager)")


def test_a_step_measured_at_another_batch_is_scaled(tmp_path, capsys):
    step = _step_json(tmp_path, "NVIDIA A10G", mfu=0.2)
    (row,) = _rows(tmp_path, capsys, "--images", "100000", "--preset", "g5.12xlarge", "--nodes", "1",
                   "--step-json", str(step), "--set", "optim.batch_size_per_gpu=60")
    assert row["pretrain"]["compute_s"] == pytest.approx(1.0)
    assert "at batch 30, scaled to 60" in row["basis"]["step"]


def test_the_dataset_size_comes_from_the_packed_dataset(tmp_path, capsys):
    import numpy as np

    from tests.support.packing import write_packed

    write_packed(tmp_path / "run" / "packed", [np.zeros((5, 40, 40), np.uint16), np.zeros((5, 60, 60), np.uint16)],
                 ["a", "b"])
    work = inputs.workload(_config(tmp_path), RunLayout(tmp_path / "run"), None)
    assert work.image_bytes == pytest.approx(2 * 5 * (40 * 40 + 60 * 60) / 2)
    assert "packed dataset" in work.source


@pytest.mark.parametrize(("args", "message"), [
    (["--images", "10", "--preset", "x9.large"], "--preset 'x9.large': unknown"),
    (["--images", "10", "-c", "cluster.max_nodes"], "-c 'cluster.max_nodes': give KEY=VALUE"),
    (["--images", "10", "-c", "storage.fsx_throughput_per_tib=300"], "setting storage.fsx_throughput_per_tib"),
    (["--preset", "g5.12xlarge"], "give --images N"),
    (["--images", "10", "--nodes", "0"], "node counts must be 1 or more"),
    (["--images", "10", "--preset", "local"], "the local cluster has no published figure"),
    (["--images", "10", "--step-json", "missing.json"], "--step-json missing.json: no such file"),
])
def test_bad_input_is_one_line_naming_the_fix(tmp_path, capsys, args, message):
    assert main(["plan", "--set", f"run.output_dir={tmp_path / 'run'}", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_the_local_cluster_is_planned_in_core_hours_without_a_price(tmp_path, capsys):
    step = _step_json(tmp_path, "cpu", mfu=None, step_s=1.2, batch=16)
    (row,) = _rows(tmp_path, capsys, "--images", "160", "--preset", "local", "--step-json", str(step),
                   "--set", "optim.batch_size_per_gpu=16", "--set", "data.holdout_fraction=0.3",
                   "--set", "optim.epochs=2", "--set", "data.num_workers=0")
    assert (row["unit"], row["cost_usd"], row["nodes"]) == ("core_h", None, 2)
    part = row["pretrain"]
    assert part["steps_per_epoch"] == 3
    # start-up + the warm-up step's extra + 2 epochs of (3 steps + one checkpoint); with no workers,
    # the loader's time (published, scaled to 2 x 224 + 8 x 96 crops) is in each step
    assert part["step_s"] == pytest.approx(1.2 + 16 * 3.95e-3, rel=1e-3)
    expected = 7.0 + (3.6 - 1.2) + 2 * (3 * part["step_s"] + 1.5)
    assert part["pretrain_s"] == pytest.approx(expected, rel=1e-4)
    assert any("all-reduce is not counted" in w for w in row["warnings"])


def test_storage_throughput_is_capacity_times_the_per_tib_rate():
    settings = inputs.PlanSettings("us-east-1", ("g4dn.12xlarge",), 2, 2400, 500, "ONDEMAND")
    assert settings.storage == Storage(2400, 2400 / 1024 * 500)


def test_save_keeps_the_rows_in_the_run_directory(tmp_path, capsys):
    assert main(["plan", "--set", f"run.output_dir={tmp_path / 'run'}", "--images", "1000", "--preset",
                 "g6e.12xlarge", "--nodes", "1", "--save"]) == 0
    capsys.readouterr()
    (row,) = json.loads(RunLayout(tmp_path / "run").plan.read_text())["rows"]
    assert (row["preset"], row["nodes"]) == ("g6e.12xlarge", 1)


# --- each back end's fixed cost (training/planning/fixed.py) -------------------------------------------

def _settings(**overrides) -> inputs.PlanSettings:
    base = {"backend": "parallelcluster", "head_node_instance_type": "c6i.2xlarge",
            "login_node_instance_type": "c6i.xlarge", "login_nodes": 0, "pcs_login_nodes": 1, "pcs_size": "SMALL"}
    return inputs.PlanSettings("us-east-1", ("g4dn.12xlarge",), 2, 1200, 250, "ONDEMAND", **{**base, **overrides})


def test_parallelcluster_s_fixed_cost_is_its_head_node_and_login_nodes_from_the_dated_table():
    from training.costs.prices import on_demand
    from training.planning.fixed import fixed_costs

    head, login = on_demand("c6i.2xlarge", "us-east-1"), on_demand("c6i.xlarge", "us-east-1")
    (chosen, other) = fixed_costs(_settings())
    assert (chosen["backend"], chosen["chosen"], other["backend"]) == ("parallelcluster", True, "pcs")
    assert chosen["usd_per_hour"] == head.usd_per_hour and head.date == "2026-11-26"
    (with_logins, _) = fixed_costs(_settings(login_nodes=2))
    assert with_logins["usd_per_hour"] == pytest.approx(head.usd_per_hour + 2 * login.usd_per_hour)
    assert fixed_costs(_settings(backend="")) == []


def test_pcs_s_fixed_cost_is_its_fees_by_size_and_its_login_node_and_says_which_fee_is_missing(monkeypatch):
    from training.costs import prices
    from training.planning.fixed import fixed_costs

    (pcs, _) = fixed_costs(_settings(backend="pcs", pcs_size="MEDIUM"))
    assert pcs["usd_per_hour"] is None and pcs["known_usd_per_hour"] == 0.17
    missing = [item["missing"] for item in pcs["items"] if item["usd_per_hour"] is None]
    assert len(missing) == 2 and all("PCS_FEES" in m and prices.PCS_PRICING_PAGE in m for m in missing)
    assert [item["what"] for item in pcs["items"]][:2] == ["PCS controller fee (MEDIUM)", "PCS accounting fee (MEDIUM)"]
    dated = {"controller-MEDIUM": prices.Price(2.0, "test", "2026-11-26"),
             "accounting-MEDIUM": prices.Price(0.5, "test", "2026-11-26")}
    monkeypatch.setitem(prices.PCS_FEES, "us-east-1", dated)
    (pcs, _) = fixed_costs(_settings(backend="pcs", pcs_size="MEDIUM", pcs_login_nodes=2))
    assert pcs["usd_per_hour"] == pytest.approx(2.0 + 0.5 + 2 * 0.17)


def test_plan_prices_both_back_ends_side_by_side_the_chosen_first(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "--set", f"run.output_dir={tmp_path / 'run'}", "--images", "100000", "--preset",
                 "g4dn.12xlarge", "--nodes", "1", "-c", "backend=pcs", "-c", "cluster.capacity_type=SPOT",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    pcs_at, pc_at = text.index("  pcs (chosen): at least $0.17/h"), text.index("  parallelcluster: $0.34/h")
    assert pcs_at < pc_at and "PCS controller fee (SMALL): not in training/costs/prices.py PCS_FEES" in text
    (row,) = json.loads(out.read_text())["rows"]
    assert row["fixed"]["parallelcluster"]["cost_usd"] == pytest.approx(0.34 * row["wall_h"], rel=1e-3)
    assert row["fixed"]["pcs"]["cost_usd"] is None and row["fixed"]["pcs"]["chosen"]
    assert any("cluster.capacity_type=SPOT" in w and "upper bound" in w for w in row["warnings"])
