"""Models: the ViT backbone, the DINO head and the multi-crop wrapper that joins them.

Model code knows nothing about distribution or checkpoints; `training.parallel` wraps it and
`training.models.pretrained` loads weights into it.
"""

from __future__ import annotations

from torch import nn

from training.config import Config, ModelConfig
from training.models.head import DINOHead, MultiCropWrapper
from training.models.vit import ARCHS, DinoVisionTransformer, vit

__all__ = [
    "ARCHS",
    "DINOHead",
    "DinoVisionTransformer",
    "MultiCropWrapper",
    "build_backbone",
    "build_model",
]


def build_backbone(
    model_config: ModelConfig, in_chans: int, img_size: int = 224, *, drop_path_rate: float = 0.0
) -> DinoVisionTransformer:
    """A ViT for `in_chans` channels; forward(x) gives CLS features (B, embed_dim) for any crop size."""
    return vit(
        model_config.arch,
        patch_size=model_config.patch_size,
        in_chans=in_chans,
        img_size=img_size,
        drop_path_rate=drop_path_rate,
        pos_embed_interpolation=model_config.pos_embed_interpolation,
    )


def build_model(config: Config, in_chans: int) -> tuple[MultiCropWrapper, MultiCropWrapper]:
    """Student and teacher, identical at the start; the teacher has no drop path and no gradients."""
    model = config.model
    img_size = config.dino.global_crop_size

    def head(embed_dim: int) -> DINOHead:
        return DINOHead(
            embed_dim, model.out_dim, use_bn=model.use_bn_in_head, norm_last_layer=model.norm_last_layer
        )

    student_backbone = build_backbone(model, in_chans, img_size, drop_path_rate=model.drop_path_rate)
    student = MultiCropWrapper(student_backbone, head(student_backbone.embed_dim))
    teacher = MultiCropWrapper(build_backbone(model, in_chans, img_size), head(student_backbone.embed_dim))
    teacher.load_state_dict(student.state_dict())
    for param in teacher.parameters():
        param.requires_grad = False
    return student, teacher


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
