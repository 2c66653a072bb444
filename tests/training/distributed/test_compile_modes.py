"""train.compile_mode: checked with the config, handed to torch.compile for both backbones, and under
a mode with CUDA graphs every step starts a new graph generation. (Compiling itself takes minutes on
a CPU; `scripts/gpu-bench.sh` compiles and times each mode on a GPU.)"""

import pytest
import torch
from torch import nn

from tests.support.tiny import tiny_config
from training.config import ConfigError
from training.dino.step import forward_loss
from training.distributed.groups import DistContext, DistEnv
from training.trainer import build_state

torch.set_num_threads(1)

CPU = DistContext(env=DistEnv(), device=torch.device("cpu"), backend=None)


def test_a_compile_mode_needs_compiling_and_a_known_name():
    with pytest.raises(ConfigError, match=r"train.compile_mode=reduce-overhead applies to compiled models"):
        tiny_config({"train.compile_mode": "reduce-overhead"})
    with pytest.raises(ConfigError, match="train.compile_mode"):
        tiny_config({"train.compile": True, "train.compile_mode": "fastest"})


@pytest.mark.parametrize(("mode", "marks"), [("default", 0), ("reduce-overhead", 1), ("max-autotune", 1),
                                             ("max-autotune-no-cudagraphs", 0)])
def test_the_mode_reaches_torch_compile_and_graph_modes_mark_each_step(monkeypatch, mode, marks):
    compiled, marked = [], []
    monkeypatch.setattr(nn.Module, "compile", lambda module, **kwargs: compiled.append(kwargs))
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marked.append(True))
    config = tiny_config({"train.compile": True, "train.compile_mode": mode, "data.channels": "01",
                          "optim.batch_size_per_gpu": 2})
    state = build_state(config, CPU, steps_per_epoch=1)
    assert compiled == [{"dynamic": False, "mode": mode}] * 2  # teacher and student backbones
    sizes = [32, 32, 16, 16]
    forward_loss(state, [torch.randn(2, 2, s, s) for s in sizes], epoch=0)
    assert len(marked) == marks
