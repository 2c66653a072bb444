"""data.normalization=per_image: each channel of each image z-scored with its own statistics, as
CHAMMI-75's channel-adaptive DINO does (torch's instance norm before cropping), checked against
that reference in pretraining crops and evaluation images, and refused where it cannot apply."""

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from training.config import Config, ConfigError, DinoConfig
from training.data.loading.augment import PER_IMAGE_EPS, BatchMultiCrop, pad_to_batch, per_image_stats, resize_full
from training.data.loading.torch_loader import EvalTransform

PLAIN = DinoConfig(global_crop_size=24, local_crop_size=12, local_crops_number=3, photometric_augment=False)
SCDINO = DinoConfig(global_crop_size=24, local_crop_size=12, local_crops_number=3)


def _images(seed: int, batch: int = 4, channels: int = 3, size: int = 40) -> torch.Tensor:
    """Images whose channels differ in level and spread from one image to the next."""
    generator = torch.Generator().manual_seed(seed)
    base = torch.rand(batch, channels, size, size, generator=generator)
    gain = 0.1 + 0.9 * torch.rand(batch, channels, 1, 1, generator=generator)
    return base * gain


def _instance_norm(images: torch.Tensor) -> torch.Tensor:
    """CHAMMI-75's PerImageNormalize: InstanceNorm2d without affine or running stats, eps 1e-7."""
    return F.instance_norm(images, eps=1e-7)


def test_crops_equal_the_crops_of_instance_normalised_images():
    images = _images(0)
    ours = BatchMultiCrop(PLAIN, [0.3] * 3, [0.2] * 3, per_image=True)(images, torch.Generator().manual_seed(5))
    identity = BatchMultiCrop(PLAIN, [0.0] * 3, [1.0] * 3)
    reference = identity(_instance_norm(images), torch.Generator().manual_seed(5))
    for crop, expected in zip(ours, reference, strict=True):
        torch.testing.assert_close(crop, expected, atol=2e-4, rtol=0)
    dataset = BatchMultiCrop(PLAIN, [0.3] * 3, [0.2] * 3)(images, torch.Generator().manual_seed(5))
    assert not torch.allclose(dataset[0], ours[0], atol=1e-2)


def test_crops_do_not_change_with_an_image_channel_gain_and_offset():
    images = torch.rand(4, 3, 40, 40, generator=torch.Generator().manual_seed(1))
    gain = torch.tensor([3.0, 0.5, 1.7, 0.8])[:, None, None, None] * torch.tensor([1.0, 2.0, 0.6])[None, :, None, None]
    multicrop = BatchMultiCrop(PLAIN, [0.5] * 3, [0.25] * 3, per_image=True)
    before = multicrop(images, torch.Generator().manual_seed(2))
    after = multicrop(images * gain + 0.25, torch.Generator().manual_seed(2))
    for a, b in zip(before, after, strict=True):
        torch.testing.assert_close(a, b, atol=2e-4, rtol=0)


@pytest.mark.parametrize("seed", range(6))
def test_photometric_views_are_normalised_with_the_images_own_statistics(seed):
    """Brightness, its clamp to [0, 1] and solarisation act on the [0, 1] image as before; only the
    final mean and std become the image's own (numpy's, over its pixels)."""
    image = _images(seed, batch=1)
    array = image[0].double().numpy()
    mean = array.mean(axis=(1, 2))
    std = np.sqrt(array.var(axis=(1, 2)) + PER_IMAGE_EPS)
    ours = BatchMultiCrop(SCDINO, [0.5] * 3, [0.25] * 3, per_image=True)(image, torch.Generator().manual_seed(seed))
    own = BatchMultiCrop(SCDINO, mean.tolist(), std.tolist())(image, torch.Generator().manual_seed(seed))
    for crop, expected in zip(ours, own, strict=True):
        torch.testing.assert_close(crop, expected, atol=2e-4, rtol=0)


def test_statistics_of_a_padded_batch_cover_each_images_own_pixels():
    images = [torch.rand(2, 30, 20) * 0.5, torch.rand(2, 50, 44) + 2.0, torch.rand(2, 12, 50)]
    mean, std = per_image_stats(*pad_to_batch(images))
    for i, image in enumerate(images):
        array = image.double().numpy()
        np.testing.assert_allclose(mean[i].numpy(), array.mean(axis=(1, 2)), rtol=1e-5)
        np.testing.assert_allclose(std[i].numpy(), np.sqrt(array.var(axis=(1, 2)) + PER_IMAGE_EPS), rtol=1e-5)
    crops = BatchMultiCrop(PLAIN, [0.0] * 2, [1.0] * 2, per_image=True)(images, torch.Generator().manual_seed(0))
    assert all(torch.isfinite(c).all() for c in crops)


def test_a_constant_channel_becomes_zero_not_nan():
    images = _images(3, batch=2)
    images[1, 2] = 0.6
    crops = BatchMultiCrop(PLAIN, [0.5] * 3, [0.25] * 3, per_image=True)(images, torch.Generator().manual_seed(0))
    for crop in crops:
        assert torch.isfinite(crop).all()
        # float32 rounding of 0.6 x 1/sqrt(eps) against the shift: ~1e-4, against unit-variance signals
        torch.testing.assert_close(crop[1, 2], torch.zeros_like(crop[1, 2]), atol=1e-3, rtol=0)


def test_evaluation_images_are_the_resized_instance_normalised_images():
    images = _images(4)
    ours, _, _ = EvalTransform(32, [0.5] * 3, [0.25] * 3, per_image=True)(images, torch.arange(4), torch.arange(4), None)
    torch.testing.assert_close(ours, resize_full(_instance_norm(images), 32), atol=2e-4, rtol=0)
    dataset, _, _ = EvalTransform(32, [0.5] * 3, [0.25] * 3)(images, torch.arange(4), torch.arange(4), None)
    torch.testing.assert_close(dataset, (resize_full(images, 32) - 0.5) / 0.25, atol=2e-5, rtol=0)


def test_settings_that_cannot_follow_it_are_refused_with_the_fix():
    with pytest.raises(ConfigError, match="data.loader=dali.*use data.loader=packed"):
        Config().replace({"data.normalization": "per_image", "data.loader": "dali"})
    with pytest.raises(ConfigError, match="eval.normalize=false.*set eval.normalize=true"):
        Config().replace({"data.normalization": "per_image", "eval.normalize": False})
    with pytest.raises(ConfigError, match="normalization"):
        Config().replace({"data.normalization": "per_channel"})
    assert Config().replace({"data.normalization": "per_image"}).data.per_image_normalization
