"""The weak-scaling model of training/costs/scaling.py and its command, training/benchmarks/speed/scaling.py."""

import json

import pytest

from training.benchmarks.speed import allreduce, scaling
from training.costs import scaling as model
from training.costs.scaling import PRESETS, StepProfile, allreduce_seconds, efficiency

pytestmark = pytest.mark.slow


def test_allreduce_time_follows_the_bus_bandwidth_definition():
    # 8 ranks, 1 GB at a bus bandwidth of 100 GB/s: 2 * 7/8 * 1e9 / 1e11 seconds.
    assert allreduce_seconds(1e9, 100.0, 8) == pytest.approx(0.0175)
    assert allreduce_seconds(1e9, 100.0, 1) == 0.0


def test_exposed_communication_lowers_efficiency_and_compression_helps():
    profile = StepProfile(step_time_s=0.02, backward_s=0.01, params=44_000_000)
    net = PRESETS["g4dn.12xlarge"]
    full, exposed = efficiency(profile, net, 4, grad_bytes_per_param=4)
    half, _ = efficiency(profile, net, 4, grad_bytes_per_param=2)
    fsdp, _ = efficiency(profile, net, 4, grad_bytes_per_param=4, volume_factor=1.5)
    assert exposed > 0
    assert fsdp < full < half <= 1.0
    p5, _ = efficiency(profile, PRESETS["p5.48xlarge"], 4, grad_bytes_per_param=4)
    assert p5 > full


def _allreduce_json(tmp_path, busbw: float, nodes: int) -> str:
    """The all-reduce benchmark's own JSON, from an all_reduce_perf log with one row (no ranks needed)."""
    log = tmp_path / "all_reduce_perf.log"
    time_us = 1e6 * 2**30 / (busbw * 1e9)  # algbw = busbw: the columns only need to parse
    log.write_text(f"  1073741824  268435456  float  sum  -1  {time_us:.1f}  {busbw}  {busbw}  0"
                   f"  {time_us:.1f}  {busbw}  {busbw}  0\n")
    out = tmp_path / f"busbw_{nodes}.json"
    assert allreduce.main(["--nccl-tests", str(log), "--nodes", str(nodes), "--instance-type", "p4d.24xlarge",
                           "--out", str(out)]) == 0
    return str(out)


def test_cli_reads_step_and_measured_bandwidth(tmp_path, capsys):
    busbw = _allreduce_json(tmp_path, 1.0, nodes=2)
    capsys.readouterr()
    scaling.main(["--step-time", "0.05", "--params", "44000000", "--busbw-json", busbw,
                  "--preset", "p4d.24xlarge", "--nodes", "1,2"])
    out = json.loads(capsys.readouterr().out)
    preset = out["presets"]["p4d.24xlarge"]
    assert preset["interconnect"]["inter_busbw_gbs"] == 1.0
    assert preset["interconnect"]["intra_busbw_gbs"] == PRESETS["p4d.24xlarge"].intra_busbw_gbs
    one, two = preset["rows"]
    assert one["efficiency_ddp"] == 1.0 and two["efficiency_ddp"] < 0.5
    assert two["compression_pays"] is True
    assert "DDP" in preset["fsdp"]


def test_a_one_node_measurement_replaces_the_inside_node_figure(tmp_path, capsys):
    busbw = _allreduce_json(tmp_path, 2.0, nodes=1)
    capsys.readouterr()
    scaling.main(["--step-time", "0.05", "--busbw-json", busbw, "--preset", "p4d.24xlarge", "--nodes", "1,2"])
    preset = json.loads(capsys.readouterr().out)["presets"]["p4d.24xlarge"]
    assert preset["interconnect"]["intra_busbw_gbs"] == 2.0
    assert preset["interconnect"]["inter_busbw_gbs"] == PRESETS["p4d.24xlarge"].inter_busbw_gbs
    assert preset["rows"][0]["efficiency_ddp"] < 1.0  # 8 GPUs at 2 GB/s inside the node expose the all-reduce


class RecordingDict(dict):
    """A dict that remembers which keys were asked for, however they were asked."""

    def __init__(self, data: dict) -> None:
        super().__init__(data)
        self.asked: set[str] = set()

    def __getitem__(self, key):
        self.asked.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.asked.add(key)
        return super().get(key, default)

    def __contains__(self, key) -> bool:
        self.asked.add(key)
        return super().__contains__(key)


@pytest.fixture(scope="module")
def bench_step_json() -> dict:
    """What `python -m training bench step` prints for a tiny model on this machine."""
    from tests.support.tiny import tiny_config
    from training.benchmarks.request import StepBenchRequest
    from training.benchmarks.speed.step import run_step_benchmark

    config = tiny_config({"data.channels": "01", "model.out_dim": 64, "dino.global_crop_size": 16,
                          "dino.local_crop_size": 8, "dino.local_crops_number": 1, "optim.batch_size_per_gpu": 2})
    return json.loads(json.dumps(run_step_benchmark(config, StepBenchRequest(steps=1, warmup=1))))


def test_the_model_reads_only_fields_bench_step_writes(bench_step_json):
    data = RecordingDict(bench_step_json)
    profile = model.profile_from_step_json(data)
    assert data.asked <= set(bench_step_json), data.asked - set(bench_step_json)
    assert (profile.step_time_s, profile.backward_s, profile.params, profile.flops_per_step) == (
        bench_step_json["step_time_s"], bench_step_json["backward_s"], bench_step_json["params"],
        bench_step_json["flops_per_step"])


def test_cli_reads_what_bench_step_writes(tmp_path, capsys, bench_step_json):
    """The scaling model is fed the step benchmark's own JSON, not a hand-written stand-in."""
    measured = bench_step_json
    step = tmp_path / "step.json"
    step.write_text(json.dumps(measured))
    capsys.readouterr()
    scaling.main(["--step-json", str(step), "--preset", "p4d.24xlarge", "--nodes", "1,2"])
    out = json.loads(capsys.readouterr().out)
    preset = out["presets"]["p4d.24xlarge"]
    assert preset["step_time_s"] == measured["step_time_s"] and measured["params"] > 1e6
    assert out["model"]["backward_s"] == measured["backward_s"] and out["model"]["params"] == measured["params"]
    assert preset["rows"][0]["efficiency_ddp"] == 1.0 and 0.5 < preset["rows"][1]["efficiency_ddp"] <= 1.0
    assert preset["step_time_basis"].startswith("measured step time")  # no MFU on a CPU


def test_gpu_figures_of_bench_step_move_the_prediction(tmp_path, capsys, bench_step_json):
    """On a GPU `mfu` and `peak_memory_gb` are numbers: the step time follows each preset's peak,
    and a measured peak memory near the GPU's size makes the verdict FSDP."""
    assert bench_step_json["mfu"] is None and bench_step_json["peak_memory_gb"] is None  # a CPU wrote it
    step = tmp_path / "step.json"
    step.write_text(json.dumps({**bench_step_json, "mfu": 0.3, "peak_memory_gb": 35.0}))
    capsys.readouterr()
    scaling.main(["--step-json", str(step), "--nodes", "1"])
    presets = json.loads(capsys.readouterr().out)["presets"]
    assert "30.0%" in presets["p4d.24xlarge"]["step_time_basis"]
    assert presets["p5.48xlarge"]["step_time_s"] < presets["p4d.24xlarge"]["step_time_s"]
    assert presets["p4d.24xlarge"]["fsdp"].startswith("FSDP")  # 35 GB of a 40 GB A100
    assert presets["p5.48xlarge"]["fsdp"].startswith("DDP")  # fits in 70% of 80 GB


def test_other_json_is_refused_with_the_reason(tmp_path):
    loader = tmp_path / "loader.json"
    loader.write_text(json.dumps({"benchmark": "loader", "ratio": 3.0}))
    with pytest.raises(SystemExit, match="not the output of `python -m training bench step`"):
        scaling.main(["--step-json", str(loader)])
