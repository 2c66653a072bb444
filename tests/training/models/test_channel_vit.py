"""The channel-adaptive ViT (model.kind: channel_vit): tokens per present channel, embeddings by
original channel id, any subset and any channel count, checkpoints evaluated on a subset."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from tests.support.tiny import tiny_config
from training.errors import UserError
from training.models import ChannelVisionTransformer, DinoVisionTransformer, build_backbone, build_model
from training.models.pretrained import load_backbone
from training.models.vit import attention_weights, dino_resample_pos_embed

PATCH = 8


def channel_model(channel_ids: tuple[int, ...], seed: int = 0) -> ChannelVisionTransformer:
    torch.manual_seed(seed)
    config = tiny_config({"model.kind": "channel_vit"})
    model = build_backbone(config.model, len(channel_ids), img_size=32, channel_ids=channel_ids).eval()
    with torch.no_grad():  # trunc_normal(0.02) embeddings barely matter; make them matter
        model.channel_embed.normal_(0, 1.0)
        model.pos_embed.normal_(0, 0.5)
    return model


def reference_cls(model: ChannelVisionTransformer, x: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """The CLS feature computed from the definition: per-channel strided convolution with the shared
    single-channel filter, plus the position embedding of the patch and the embedding row of the
    channel, CLS with position 0 first, then the transformer blocks and the norm."""
    weight, bias = model.patch_embed.proj.weight, model.patch_embed.proj.bias
    batch, _, height, width = x.shape
    grid = (height // PATCH, width // PATCH)
    pos = dino_resample_pos_embed(model.pos_embed, grid, height == width)
    tokens = [model.cls_token.expand(batch, -1, -1) + pos[:, :1]]
    for position, row in enumerate(rows):
        patches = F.conv2d(x[:, position : position + 1], weight, bias, stride=PATCH)  # (B, D, gh, gw)
        patches = patches.flatten(2).transpose(1, 2)
        tokens.append(patches + pos[:, 1:] + model.channel_embed[0, row])
    out = torch.cat(tokens, dim=1)
    for block in model.blocks:
        out = block(out)
    return model.norm(out)[:, 0]


def test_the_option_is_off_by_default_and_builds_the_plain_vit():
    assert type(build_backbone(tiny_config().model, 5, img_size=32)) is DinoVisionTransformer


@pytest.mark.parametrize("channel_ids", [(0,), (0, 1, 2), (0, 1, 2, 3, 4), (1, 3, 6, 7)])
def test_every_subset_gives_one_token_per_present_channel_and_patch(channel_ids):
    model = channel_model(channel_ids)
    for k in range(1, len(channel_ids) + 1):
        for subset in itertools.combinations(channel_ids, k):
            for side in (32, 16, 24):  # the stored grid, a local crop, a resampled grid
                x = torch.randn(2, k, side, side)
                tokens = model._tokens(x, subset)
                assert tokens.shape == (2, 1 + k * (side // PATCH) ** 2, model.embed_dim)
                assert model(x, channels=subset).shape == (2, model.embed_dim)


def test_a_subset_meets_the_embeddings_of_its_original_channel_ids():
    model = channel_model((0, 1, 2, 3, 4))
    x = torch.randn(3, 5, 32, 32)
    with torch.no_grad():
        subset = model(x[:, [0, 2]], channels=(0, 2))
        torch.testing.assert_close(subset, reference_cls(model, x[:, [0, 2]], rows=[0, 2]), atol=1e-5, rtol=1e-5)
        # Channels 1, 3, 4 absent is not channels 0 and 1: the embedding follows the id, not the slot.
        assert (subset - model(x[:, [0, 2]], channels=(0, 1))).abs().max() > 1e-3
        full = model(x)
        torch.testing.assert_close(full, reference_cls(model, x, rows=[0, 1, 2, 3, 4]), atol=1e-5, rtol=1e-5)
        # pixels beyond the last whole patch are ignored, as by the strided convolution (a 5 x 4 grid)
        ragged = torch.randn(2, 2, 43, 37)
        torch.testing.assert_close(model(ragged, channels=(1, 3)), reference_cls(model, ragged, rows=[1, 3]),
                                   atol=1e-5, rtol=1e-5)


def test_ids_need_not_be_contiguous_and_order_of_channels_does_not_matter():
    model = channel_model((1, 3, 6))
    x = torch.randn(2, 2, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x, channels=(6, 1)), reference_cls(model, x, rows=[2, 0]),
                                   atol=1e-5, rtol=1e-5)
        # The CLS token attends to a set of tokens: swapping the channels (with their ids) changes nothing.
        torch.testing.assert_close(model(x.flip(1), channels=(1, 6)), model(x, channels=(6, 1)),
                                   atol=1e-5, rtol=1e-5)


def test_a_model_built_for_the_subset_with_the_same_weights_agrees():
    """Channels 0 and 2 of a 5-channel model = a 2-channel model holding those two embedding rows."""
    full = channel_model((0, 1, 2, 3, 4))
    state = full.state_dict()
    state["channel_embed"] = state["channel_embed"][:, [0, 2]]
    state["channel_ids"] = torch.tensor([0, 2])
    small = channel_model((0, 2), seed=1)
    small.load_state_dict(state)
    x = torch.randn(2, 2, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(small(x), full(x, channels=(0, 2)), atol=1e-6, rtol=1e-6)


def test_unknown_or_mismatched_channels_are_refused_with_the_allowed_ones():
    model = channel_model((0, 1, 2))
    with pytest.raises(ValueError, match="trained on channels '012'"):
        model(torch.randn(1, 1, 32, 32), channels=(4,))
    with pytest.raises(ValueError, match="2 channels but 1 channel ids"):
        model(torch.randn(1, 2, 32, 32), channels=(1,))
    with pytest.raises(ValueError, match="without repeats"):
        model.select_input_channels((1, 1))


def test_attention_folds_to_patch_positions_and_rows_sum_to_one():
    model = channel_model((0, 1, 2))
    x = torch.randn(2, 3, 32, 24)
    attention = model.get_last_selfattention(x)
    assert attention.shape == (2, model.blocks[-1].attn.num_heads, 1 + 4 * 3, 1 + 4 * 3)
    torch.testing.assert_close(attention.sum(-1), torch.ones(attention.shape[:-1]))
    # Against the unfolded attention over CLS + 3 channels x 12 positions, folded element by element:
    # a key position sums its 3 channel tokens, a query position averages its 3 channel tokens.
    with torch.no_grad():
        tokens = model._tokens(x)
        for block in model.blocks[:-1]:
            tokens = block(tokens)
        last = model.blocks[-1]
        full = attention_weights(last.attn, last.norm1(tokens))
    positions, n_chans = 12, 3

    def key(row: torch.Tensor, p: int) -> torch.Tensor:  # row (..., 1 + C x P) -> weight of position p
        return sum(row[..., 1 + c * positions + p] for c in range(n_chans))

    for p in range(positions):
        torch.testing.assert_close(attention[:, :, 0, 1 + p], key(full[:, :, 0], p))
        for q in (0, 5, 11):
            expected = sum(key(full[:, :, 1 + c * positions + q], p) for c in range(n_chans)) / n_chans
            torch.testing.assert_close(attention[:, :, 1 + q, 1 + p], expected)
    torch.testing.assert_close(attention[:, :, 0, 0], full[:, :, 0, 0])


def test_the_dino_pair_embeds_the_configured_channel_ids():
    config = tiny_config({"model.kind": "channel_vit", "data.channels": "134"})
    student, teacher = build_model(config, config.data.in_chans)
    for model in (student, teacher):
        assert model.backbone.trained_channels == (1, 3, 4)
        assert model.backbone.channel_embed.shape == (1, 3, model.backbone.embed_dim)
        assert model.backbone.patch_embed.proj.weight.shape[1] == 1
    crops = [torch.randn(2, 2, 32, 32)] * 2 + [torch.randn(2, 2, 16, 16)] * 2
    assert student(crops, channels=(1, 4)).shape == (8, config.model.out_dim)


def test_loaded_channel_ids_are_the_ones_the_forward_uses():
    """The ids live in a buffer (checkpoints carry it) and, for the forward, on the host: loading a
    state dict updates both."""
    source, target = channel_model((2, 3, 4), seed=1), channel_model((0, 1, 2))
    target.load_state_dict(source.state_dict())
    assert target.trained_channels == (2, 3, 4)
    x = torch.randn(2, 2, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(target(x, channels=(2, 4)), source(x, channels=(2, 4)))


def save_teacher(tmp_path, model: torch.nn.Module):
    path = tmp_path / "checkpoint.pth"
    torch.save({"teacher": {f"backbone.{k}": v for k, v in model.state_dict().items()}}, path)
    return path


def test_a_checkpoint_trained_on_all_channels_loads_for_a_subset(tmp_path):
    model = channel_model((0, 1, 2, 3, 4))
    path = save_teacher(tmp_path, model)
    config = tiny_config()  # model.kind=vit: the checkpoint says what it is
    loaded = load_backbone(path, config.model, 2, channels=(0, 2)).eval()
    assert isinstance(loaded, ChannelVisionTransformer) and loaded.input_channels == (0, 2)
    x = torch.randn(2, 2, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x, channels=(0, 2)))
    everything = load_backbone(path, config.model, 5).eval()
    assert everything.input_channels == (0, 1, 2, 3, 4)
    with pytest.raises(UserError, match="data.channels='05'"):
        load_backbone(path, config.model, 2, channels=(0, 5))
    with pytest.raises(UserError, match="say which 2 of them"):
        load_backbone(path, config.model, 2)


def test_a_plain_checkpoint_is_not_taken_for_a_channel_adaptive_one(tmp_path):
    path = save_teacher(tmp_path, build_backbone(tiny_config().model, 5, img_size=32))
    with pytest.raises(UserError, match="set model.kind=vit"):
        load_backbone(path, tiny_config({"model.kind": "channel_vit"}).model, 5)


def test_config_names_the_allowed_kinds():
    from training.config import ConfigError

    with pytest.raises(ConfigError, match="model.kind must be one of 'vit', 'channel_vit'"):
        tiny_config({"model.kind": "chanvit"})
