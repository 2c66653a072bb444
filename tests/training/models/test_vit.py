"""The ViT backbone, the DINO head and the multi-crop wrapper: shapes, parameter names, attention."""

import pytest
import torch

from tests.support.tiny import tiny_config
from training.config import Config, ModelConfig
from training.models import build_backbone, build_model
from training.models.head import DINOHead

torch.set_num_threads(1)

TINY = ModelConfig(arch="vit_tiny", patch_size=8, out_dim=256, drop_path_rate=0.0)


def vit_config(**overrides) -> Config:
    return tiny_config({"dino.local_crops_number": 3, **overrides})


@pytest.mark.parametrize("channels", ["0", "012", "01234"])
def test_shapes_for_any_channel_count_and_crop_size(channels):
    config = vit_config(**{"data.channels": channels})
    in_chans = config.data.in_chans
    student, teacher = build_model(config, in_chans)
    crops = [torch.randn(2, in_chans, 32, 32) for _ in range(2)] + [torch.randn(2, in_chans, 16, 16) for _ in range(3)]
    assert student.backbone(crops[0]).shape == (2, 192)
    assert student.backbone(crops[-1]).shape == (2, 192)
    assert student(crops).shape == (5 * 2, 256)
    assert teacher(crops[:2]).shape == (2 * 2, 256)
    assert student.backbone.patch_embed.proj.weight.shape == (192, in_chans, 8, 8)


def test_state_dict_keys_follow_facebookresearch_dino():
    backbone = build_backbone(TINY, in_chans=5, img_size=32)
    block = ["norm1.weight", "norm1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
             "attn.proj.bias", "norm2.weight", "norm2.bias", "mlp.fc1.weight", "mlp.fc1.bias",
             "mlp.fc2.weight", "mlp.fc2.bias"]
    expected = {"cls_token", "pos_embed", "patch_embed.proj.weight", "patch_embed.proj.bias",
                "norm.weight", "norm.bias"} | {f"blocks.{i}.{name}" for i in range(12) for name in block}
    state = backbone.state_dict()
    assert set(state) == expected
    assert state["pos_embed"].shape == (1, (32 // 8) ** 2 + 1, 192)
    head = DINOHead(192, 256).state_dict()
    assert set(head) == {"mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias", "mlp.4.weight",
                         "mlp.4.bias", "last_layer.weight_g", "last_layer.weight_v"}
    assert set(DINOHead(192, 256, use_bn=True).state_dict()) >= {"mlp.1.running_mean", "mlp.3.weight", "mlp.6.weight"}


def test_forward_is_the_normalised_cls_token():
    backbone = build_backbone(TINY, in_chans=3, img_size=32).eval()
    x = torch.randn(2, 3, 24, 24)
    tokens = backbone.forward_features(x)
    assert torch.allclose(backbone(x), tokens[:, 0], atol=1e-6)


def test_last_selfattention_matches_the_fused_attention():
    backbone = build_backbone(TINY, in_chans=5, img_size=32).eval()
    x = torch.randn(2, 5, 32, 32)
    weights = backbone.get_last_selfattention(x)
    assert weights.shape == (2, 3, 17, 17)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 3, 17), atol=1e-5)
    tokens = backbone._tokens(x)
    for block in backbone.blocks[:-1]:
        tokens = block(tokens)
    last = backbone.blocks[-1]
    normed = last.norm1(tokens)
    v = last.attn.qkv(normed).reshape(2, 17, 3, 3, 64).permute(2, 0, 3, 1, 4)[2]
    by_hand = last.attn.proj((weights @ v).transpose(1, 2).reshape(2, 17, 192))
    assert torch.allclose(by_hand, last.attn(normed), atol=1e-5)


def test_head_last_layer_is_weight_normalised_and_frozen_norm():
    head = DINOHead(192, 256, norm_last_layer=True)
    assert not head.last_layer.weight_g.requires_grad
    out = head(torch.randn(4, 192))
    # inputs to the last layer are unit vectors and its rows have norm g = 1: |logit| <= 1
    assert out.shape == (4, 256) and out.abs().max() <= 1 + 1e-5
    assert DINOHead(192, 256, norm_last_layer=False).last_layer.weight_g.requires_grad


def test_student_and_teacher_start_identical_and_teacher_is_frozen():
    student, teacher = build_model(vit_config(), 5)
    for (name, s), t in zip(student.state_dict().items(), teacher.state_dict().values()):
        assert torch.equal(s, t), name
    assert not any(p.requires_grad for p in teacher.parameters())
    assert student.backbone.blocks[-1].drop_path1.drop_prob == pytest.approx(0.1)
