"""model.channel_adaptation: RGB (or other) weights on another channel count, as scDINO does it.

scDINO's compute_CLS_features (`use_mean_patch_embedding`) builds the ViT with the checkpoint's
channel count, loads it, then replaces the patch-embedding weight by its mean over the input
channels, repeated once per image channel. The reference below follows those steps on a model of
the source channel count; ours must give the same weights and the same features.
"""

import pytest
import torch

from training.config import ModelConfig
from training.errors import UserError
from training.models import build_backbone, pretrained

torch.set_num_threads(1)


def _rgb_checkpoint(tmp_path):
    torch.manual_seed(3)
    rgb = build_backbone(ModelConfig(arch="vit_tiny", patch_size=16), in_chans=3, img_size=32)
    path = tmp_path / "rgb.pth"
    torch.save({"teacher": {"backbone." + k: v for k, v in rgb.state_dict().items()}}, path)
    return rgb, path


def _scdino_mean_patch_embedding(rgb, in_chans: int) -> torch.nn.Module:
    """scDINO's steps: the source model, its conv weight averaged over dim 1 and repeated."""
    model = build_backbone(ModelConfig(arch="vit_tiny", patch_size=16), in_chans=3, img_size=32)
    model.load_state_dict(rgb.state_dict())
    weight = model.patch_embed.proj.weight.detach()
    per_channel = (weight[:, 0:1] + weight[:, 1:2] + weight[:, 2:3]) / 3
    model.patch_embed.proj.weight = torch.nn.Parameter(torch.cat([per_channel] * in_chans, dim=1))
    model.patch_embed.proj.in_channels = in_chans
    return model


def test_mean_is_scdinos_mean_patch_embedding_and_gives_its_features(tmp_path):
    rgb, path = _rgb_checkpoint(tmp_path)
    loaded = pretrained.load_backbone(path, ModelConfig(arch="vit_tiny", patch_size=16), in_chans=5).eval()
    reference = _scdino_mean_patch_embedding(rgb, 5).eval()
    assert torch.allclose(loaded.patch_embed.proj.weight, reference.patch_embed.proj.weight, atol=1e-7)
    x = torch.randn(2, 5, 32, 32)
    with torch.no_grad():
        assert torch.allclose(loaded(x), reference(x), atol=1e-5)


@pytest.mark.parametrize("in_chans", [1, 5])
def test_mean_rescaled_scales_by_source_over_target_channels(tmp_path, in_chans):
    rgb, path = _rgb_checkpoint(tmp_path)
    config = ModelConfig(arch="vit_tiny", patch_size=16, channel_adaptation="mean_rescaled")
    loaded = pretrained.load_backbone(path, config, in_chans=in_chans)
    mean = rgb.patch_embed.proj.weight.detach().sum(dim=1) / 3
    for c in range(in_chans):
        assert torch.allclose(loaded.patch_embed.proj.weight[:, c], mean * 3 / in_chans, atol=1e-7)
    # an image whose channels are all equal keeps the RGB embedding
    assert torch.allclose(loaded.patch_embed.proj(torch.ones(1, in_chans, 16, 16)),
                          rgb.patch_embed.proj(torch.ones(1, 3, 16, 16)), atol=1e-5)


@pytest.mark.parametrize("method,scale", [("mean", 1.0), ("mean_rescaled", 3 / 4)])
def test_model_pretrained_initialisation_follows_the_same_key(tmp_path, method, scale):
    rgb, path = _rgb_checkpoint(tmp_path)
    config = ModelConfig(arch="vit_tiny", patch_size=16, channel_adaptation=method)
    target = build_backbone(config, in_chans=4, img_size=32)
    pretrained.load_pretrained_into(target, path, config)
    mean = rgb.patch_embed.proj.weight.detach().sum(dim=1) / 3
    assert torch.allclose(target.patch_embed.proj.weight[:, 2], mean * scale, atol=1e-7)


def test_same_channel_count_is_untouched_and_unknown_method_names_the_key(tmp_path):
    weight = torch.randn(8, 3, 16, 16)
    assert pretrained.adapt_patch_embedding(weight, 3, "mean_rescaled") is weight
    with pytest.raises(UserError, match="model.channel_adaptation must be one of mean, mean_rescaled"):
        pretrained.adapt_patch_embedding(weight, 5, "sum")
