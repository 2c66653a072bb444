"""Models: the ViT backbone, the DINO head and the multi-crop wrapper that joins them.

Model code knows nothing about distribution or checkpoints; `training.distributed.parallel` wraps it and
`training.models.pretrained` loads weights into it.
"""

from __future__ import annotations

from torch import nn

from training.config import Config, ModelConfig
from training.models.channel_bag import ChannelBagViT, combined_dim
from training.models.channel_vit import ChannelVisionTransformer
from training.models.head import DINOHead, MultiCropWrapper
from training.models.vit import ARCHS, DinoVisionTransformer, vit, vit_kwargs

__all__ = [
    "ARCHS",
    "ChannelBagViT",
    "ChannelVisionTransformer",
    "DINOHead",
    "DinoVisionTransformer",
    "MultiCropWrapper",
    "build_backbone",
    "build_model",
    "feature_dim",
]


def build_backbone(
    model_config: ModelConfig, in_chans: int, img_size: int = 224, *, drop_path_rate: float = 0.0,
    channel_ids: tuple[int, ...] | None = None,
) -> DinoVisionTransformer:
    """A ViT for `in_chans` channels; forward(x) gives CLS features (B, embed_dim) for any crop size.

    Under model.kind "channel_vit" and "bag_of_channels", `channel_ids` are the original ids the
    model is trained on (default 0..in_chans-1; the trainer passes data.channels) and `in_chans` is
    only their count.
    """
    ids = tuple(range(in_chans)) if channel_ids is None else tuple(channel_ids)
    if model_config.kind == "channel_vit":
        return channel_vit(model_config, ids, img_size, drop_path_rate=drop_path_rate)
    if model_config.kind == "bag_of_channels":
        return channel_bag(model_config, ids, img_size, drop_path_rate=drop_path_rate)
    return vit(
        model_config.arch,
        patch_size=model_config.patch_size,
        in_chans=in_chans,
        img_size=img_size,
        drop_path_rate=drop_path_rate,
        pos_embed_interpolation=model_config.pos_embed_interpolation,
    )


def channel_vit(model_config: ModelConfig, channel_ids: tuple[int, ...], img_size: int, *,
                drop_path_rate: float = 0.0) -> ChannelVisionTransformer:
    """The channel-adaptive ViT of `model_config.arch` for these original channel ids."""
    return ChannelVisionTransformer(channel_ids=channel_ids, channel_embed_init=model_config.channel_embed_init, **vit_kwargs(
        model_config.arch, patch_size=model_config.patch_size, img_size=img_size, drop_path_rate=drop_path_rate,
        pos_embed_interpolation=model_config.pos_embed_interpolation))


def channel_bag(model_config: ModelConfig, channel_ids: tuple[int, ...], img_size: int, *,
                drop_path_rate: float = 0.0) -> ChannelBagViT:
    """The bag-of-channels ViT of `model_config.arch`, trained on these original channel ids."""
    return ChannelBagViT(channel_ids=channel_ids, combine=model_config.bag_combine, **vit_kwargs(
        model_config.arch, patch_size=model_config.patch_size, img_size=img_size, drop_path_rate=drop_path_rate,
        pos_embed_interpolation=model_config.pos_embed_interpolation))


def feature_dim(model_config: ModelConfig, channels: int) -> int:
    """Width of the backbone's feature for an input of `channels` channels (the evaluated CLS
    feature): the embedding width, or for a bag of channels the channels' features combined."""
    embed_dim = ARCHS[model_config.arch][0]
    if model_config.kind == "bag_of_channels":
        return combined_dim(embed_dim, channels, model_config.bag_combine)
    return embed_dim


def build_model(config: Config, in_chans: int) -> tuple[MultiCropWrapper, MultiCropWrapper]:
    """Student and teacher, identical at the start; the teacher has no drop path and no gradients."""
    model = config.model
    img_size = config.dino.global_crop_size

    def head(embed_dim: int) -> DINOHead:
        return DINOHead(
            embed_dim, model.out_dim, use_bn=model.use_bn_in_head, norm_last_layer=model.norm_last_layer
        )

    channel_ids = config.data.channel_indices
    student_backbone = build_backbone(model, in_chans, img_size, drop_path_rate=model.drop_path_rate,
                                      channel_ids=channel_ids)
    student = MultiCropWrapper(student_backbone, head(student_backbone.embed_dim))
    teacher = MultiCropWrapper(build_backbone(model, in_chans, img_size, channel_ids=channel_ids),
                               head(student_backbone.embed_dim))
    teacher.load_state_dict(student.state_dict())
    for param in teacher.parameters():
        param.requires_grad = False
    return student, teacher


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
