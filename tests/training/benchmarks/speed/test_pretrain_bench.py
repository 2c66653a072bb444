"""`bench pretrain`: `pretrain`'s own loop beside the same model's free-running step, on CPU at the tiny
size, from crops staged on the device and from the real loader over packed synthetic images; its
flags as typed requests with one-line errors."""

import json

import pytest
import torch

from tests.support.tiny import tiny_config
from training.benchmarks.request import PretrainBenchRequest, pretrain_request
from training.cli import build_parser, main
from training.config import dump_config
from training.errors import UserError

torch.set_num_threads(1)


@pytest.mark.slow
@pytest.mark.parametrize("loader", ["staged", "packed"])
def test_the_loop_and_the_step_are_timed_side_by_side(tmp_path, capsys, loader):
    config = tmp_path / "tiny.yaml"
    dump_config(tiny_config({"data.channels": "01234", "optim.batch_size_per_gpu": 4, "data.num_workers": 1,
                             "train.log_every": 1}), config)
    out = tmp_path / "pretrain.json"
    assert main(["bench", "pretrain", "--config", str(config), "--batches", "2", "--warmup", "1",
                 "--loader", loader, "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert json.loads(out.read_text()) == printed
    assert printed["benchmark"] == "pretrain" and printed["loader"] == loader and printed["steps"] == 2
    loop, step = printed["loop"], printed["step"]
    for figures in (loop, step):
        assert figures["images_per_s"] == pytest.approx(4 / figures["step_time_s"], rel=1e-2)
        assert figures["mfu"] is None  # no peak for a CPU
    assert printed["loop_over_step"] == pytest.approx(loop["images_per_s"] / step["images_per_s"], rel=1e-2)
    assert loop["wall_s"] > 2 * loop["step_time_s"] and loop["after_last_step_s"] > 0  # the epoch's save
    assert (printed["gpu_augment"] is None) == (loader == "staged")


def _args(*argv: str):
    return build_parser().parse_args(["bench", *argv])


def test_flags_become_a_typed_request():
    assert pretrain_request(_args("pretrain", "--batches", "5", "--warmup", "1")) == PretrainBenchRequest(steps=5, warmup=1)
    assert pretrain_request(_args("pretrain", "--loader", "packed", "--images", "64")) == \
        PretrainBenchRequest(loader="packed", images=64)
    default = pretrain_request(_args("pretrain"))
    assert (default.steps, default.warmup, default.loader, default.images) == (20, 3, "staged", None)
    with pytest.raises(UserError, match="^--images 64: only `--loader packed`"):
        PretrainBenchRequest(images=64)


@pytest.mark.parametrize(("argv", "flag"), [
    (["pretrain", "--loader", "dali"], "--loader"),
    (["pretrain", "--batches", "0"], "--batches"),
    (["pretrain", "--warmup", "0"], "--warmup"),
    (["pretrain", "--workers", "2"], "--workers"),
    (["pretrain", "--size", "48/24"], "--size"),
    (["step", "--loader", "packed"], "--loader:"),
])
def test_bad_flags_fail_in_one_line_naming_the_flag(argv, flag, capsys):
    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {flag} ") and "\n" not in err
