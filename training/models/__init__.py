"""Models: the ViT backbone, the DINO head and the multi-crop wrapper that joins them.

Model code knows nothing about distribution or checkpoints; `training.parallel` wraps it and
`training.models.pretrained` loads weights into it.
"""

from __future__ import annotations

from torch import nn

from training.config import Config, ModelConfig
from training.models.channel_vit import ChannelVisionTransformer
from training.models.head import DINOHead, MultiCropWrapper
from training.models.vit import ARCHS, DinoVisionTransformer, vit, vit_kwargs

__all__ = [
    "ARCHS",
    "ChannelVisionTransformer",
    "DINOHead",
    "DinoVisionTransformer",
    "MultiCropWrapper",
    "build_backbone",
    "build_model",
]


def build_backbone(
    model_config: ModelConfig, in_chans: int, img_size: int = 224, *, drop_path_rate: float = 0.0,
    channel_ids: tuple[int, ...] | None = None,
) -> DinoVisionTransformer:
    """A ViT for `in_chans` channels; forward(x) gives CLS features (B, embed_dim) for any crop size.

    Under model.kind "channel_vit", `channel_ids` are the original ids the model embeds (default
    0..in_chans-1; the trainer passes data.channels) and `in_chans` is only their count.
    """
    if model_config.kind == "channel_vit":
        ids = tuple(range(in_chans)) if channel_ids is None else tuple(channel_ids)
        return channel_vit(model_config, ids, img_size, drop_path_rate=drop_path_rate)
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
    return ChannelVisionTransformer(channel_ids=channel_ids, **vit_kwargs(
        model_config.arch, patch_size=model_config.patch_size, img_size=img_size, drop_path_rate=drop_path_rate,
        pos_embed_interpolation=model_config.pos_embed_interpolation))


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
