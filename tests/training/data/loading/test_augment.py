"""Batched multi-crop: exact crop/resize/blur against torchvision, shapes for any channel count,
seeded determinism, and output statistics matching a per-sample scDINO-style pipeline."""

import random
import re
from dataclasses import replace

import numpy as np
import pytest
import torch
import torchvision.transforms.functional as TF
from torchvision.transforms import InterpolationMode

from tests.support.augment_reference import blur_matrices
from training.benchmarks.data.loader import BENCH_MEAN, BENCH_STD, ScdinoStyleAugmentation
from training.config import Config, DinoConfig
from training.data.dataset import open_dataset
from training.data.loading.augment import BatchMultiCrop, crop_resize, resize_full, sample_crop_boxes


def test_crop_resize_and_flips_match_torchvision():
    images = torch.rand(4, 3, 50, 44)
    boxes = torch.tensor([[3.0, 7.0, 20.0, 31.0], [0, 0, 50, 44], [10, 2, 7, 9], [1, 1, 48, 40]])
    hflip, vflip = torch.tensor([True, False, True, False]), torch.tensor([False, True, True, False])
    out = crop_resize(images, boxes, 37, hflip, vflip)
    for i in range(4):
        top, left, h, w = (int(v) for v in boxes[i])
        ref = TF.resized_crop(images[i], top, left, h, w, [37, 37], InterpolationMode.BICUBIC, antialias=True)
        ref = ref.flip(-1) if hflip[i] else ref
        ref = ref.flip(-2) if vflip[i] else ref
        torch.testing.assert_close(out[i], ref, atol=2e-5, rtol=0)


def test_downscaling_is_antialiased_like_torchvision():
    images = torch.rand(1, 2, 120, 90)
    torch.testing.assert_close(
        resize_full(images, 30)[0],
        TF.resize(images[0], [30, 30], InterpolationMode.BICUBIC, antialias=True), atol=2e-5, rtol=0)


def test_blur_matches_torchvision_gaussian_blur():
    images, sigma = torch.rand(3, 2, 30, 30), torch.tensor([0.1, 0.8, 1.5])
    rows = blur_matrices(sigma, 30)
    folded = torch.matmul(torch.matmul(rows[:, None], images), rows.transpose(1, 2)[:, None])
    for i in range(3):
        ref = TF.gaussian_blur(images[i], [5, 5], [float(sigma[i])] * 2)
        torch.testing.assert_close(folded[i], ref, atol=1e-5, rtol=0)


def test_crop_boxes_respect_scale_ratio_and_bounds():
    n = 2000
    heights, widths = torch.full((n,), 50), torch.full((n,), 50)
    boxes = sample_crop_boxes(heights, widths, (0.05, 0.4), torch.Generator().manual_seed(0))
    top, left, h, w = boxes.T
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= 50).all() and (left + w <= 50).all()
    area = h * w / 2500
    assert area.min() > 0.03 and area.max() < 0.45
    assert (w / h).min() > 0.6 and (w / h).max() < 1.6
    assert 0.15 < area.mean() < 0.3


@pytest.mark.parametrize("channels", [1, 3, 5])
def test_multicrop_shapes_for_any_channel_count(channels):
    dino = DinoConfig(global_crop_size=32, local_crop_size=16, local_crops_number=3)
    crops = BatchMultiCrop(dino, [0.5] * channels, [0.2] * channels)(torch.rand(4, channels, 50, 50))
    assert [tuple(c.shape) for c in crops] == [(4, channels, 32, 32)] * 2 + [(4, channels, 16, 16)] * 3
    assert all(c.dtype == torch.float32 and torch.isfinite(c).all() for c in crops)
    single = [crop[0] for crop in BatchMultiCrop(dino, [0.5] * channels, [0.2] * channels)(torch.rand(1, channels, 40, 30))]
    assert [tuple(c.shape) for c in single] == [(channels, 32, 32)] * 2 + [(channels, 16, 16)] * 3


def test_multicrop_is_seeded_and_handles_mixed_sizes():
    dino = DinoConfig(global_crop_size=24, local_crop_size=12, local_crops_number=2)
    augment = BatchMultiCrop(dino, [0.0] * 2, [1.0] * 2)
    images = torch.rand(3, 2, 40, 40)
    first = augment(images, torch.Generator().manual_seed(1))
    again = augment(images, torch.Generator().manual_seed(1))
    other = augment(images, torch.Generator().manual_seed(2))
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[0], other[0])
    mixed = augment([torch.rand(2, 30, 20), torch.rand(2, 50, 50)], torch.Generator().manual_seed(0))
    assert [tuple(c.shape) for c in mixed] == [(2, 2, 24, 24)] * 2 + [(2, 2, 12, 12)] * 2
    assert all(0 <= float(c.min()) and float(c.max()) <= 1.05 for c in mixed)


def _view_stats(crops: list[torch.Tensor]) -> np.ndarray:
    """Mean, std and saturated fraction of global 1, global 2 and the local views."""
    groups = [crops[0], crops[1], torch.cat(crops[2:])]
    saturated = (1 - BENCH_MEAN) / BENCH_STD - 1e-4
    return np.array([[float(g.mean()), float(g.std()), float((g >= saturated).float().mean())] for g in groups])


def test_statistics_match_a_per_sample_scdino_pipeline(synth_root):
    config = Config().replace({"data.source": str(synth_root), "dino.global_crop_size": 64,
                               "dino.local_crop_size": 32, "dino.local_crops_number": 4})
    dataset = open_dataset(config)
    images = torch.stack([dataset[i][0] for i in range(0, 96, 3)])
    torch.manual_seed(0)
    random.seed(0)
    reference = ScdinoStyleAugmentation(config)
    batched = BatchMultiCrop(config.dino, [BENCH_MEAN] * 5, [BENCH_STD] * 5)
    ours, theirs = [], []
    for draw in range(6):
        ours.append(_view_stats(batched(images, torch.Generator().manual_seed(draw))))
        per_image = [reference(image.clone()) for image in images]
        theirs.append(_view_stats([torch.stack(view) for view in zip(*per_image)]))
    ours, theirs = np.mean(ours, axis=0), np.mean(theirs, axis=0)
    np.testing.assert_allclose(ours[:, :2], theirs[:, :2], atol=0.04, rtol=0.03)
    np.testing.assert_allclose(ours[:, 2], theirs[:, 2], atol=0.002)


def test_crop_falls_back_to_a_centre_crop_like_torchvision():
    boxes = sample_crop_boxes(torch.tensor([10]), torch.tensor([60]), (0.9, 1.0), torch.Generator().manual_seed(0))
    assert boxes[0].tolist() == [0.0, 23.0, 10.0, 13.0]


def test_without_photometric_augmentation_crops_and_flips_keep_every_intensity():
    """A channel of constant value survives crop, resize and flip unchanged; brightness (p = 0.8),
    blur (which keeps a constant) and solarisation would change it. dino.photometric_augment=false
    (CHAMMI-75's recipe) must leave only the normalisation."""
    values = torch.tensor([0.2, 0.7, 0.9])
    images = values[None, :, None, None].expand(6, 3, 40, 40).clone()
    mean, std = [0.5] * 3, [0.25] * 3
    expected = ((values - 0.5) / 0.25)[None, :, None, None]
    plain = DinoConfig(global_crop_size=24, local_crop_size=12, local_crops_number=2, photometric_augment=False)
    for crop in BatchMultiCrop(plain, mean, std)(images, torch.Generator().manual_seed(0)):
        torch.testing.assert_close(crop, expected.expand_as(crop), atol=1e-5, rtol=0)
    scdino = DinoConfig(global_crop_size=24, local_crop_size=12, local_crops_number=2)
    changed = [crop for crop in BatchMultiCrop(scdino, mean, std)(images, torch.Generator().manual_seed(0))
               if not torch.allclose(crop, expected.expand_as(crop), atol=1e-5)]
    assert changed


def test_solarisation_turns_the_bright_pixels_of_the_chosen_crops_over():
    """Every global crop solarised against none, same draws otherwise: a solarised crop is the plain
    one with each pixel above 0.5 (in [0, 1] units, before normalisation) mapped to 1 - x, as
    torchvision's solarize does; the local crops, never solarised, are equal."""
    dino = DinoConfig(global_crop_size=24, local_crop_size=12, local_crops_number=2)
    mean, std = torch.tensor([0.3, 0.6]), torch.tensor([0.2, 0.25])
    plain, solarised = BatchMultiCrop(dino, mean.tolist(), std.tolist()), BatchMultiCrop(dino, mean.tolist(), std.tolist())
    plain.global_views = [replace(v, solarize_p=0.0) for v in plain.global_views]
    solarised.global_views = [replace(v, solarize_p=1.0) for v in solarised.global_views]
    images = torch.rand(6, 2, 40, 40)
    before = plain(images, torch.Generator().manual_seed(3))
    after = solarised(images, torch.Generator().manual_seed(3))
    m, s = mean[None, :, None, None], std[None, :, None, None]
    for crop, turned in zip(before[:2], after[:2]):
        x = crop * s + m
        assert float((x > 0.5).float().mean()) > 0.1  # enough bright pixels to tell
        torch.testing.assert_close(turned, (torch.where(x > 0.5, 1 - x, x) - m) / s, atol=1e-5, rtol=0)
    assert all(torch.equal(a, b) for a, b in zip(before[2:], after[2:]))


def test_a_plan_made_ahead_in_one_chunk_gives_the_crops_made_in_chunks():
    """data.gpu_augment: a loader thread plans a batch's crops (one chunk per group, as for a GPU) and
    the training process applies the plan; the crops equal those the CPU path makes in chunks."""
    dino = DinoConfig(global_crop_size=96, local_crop_size=16, local_crops_number=3)
    augment = BatchMultiCrop(dino, [0.4, 0.5, 0.6], [0.2, 0.25, 0.3])
    images = torch.rand(48, 3, 50, 50)
    heights, widths = torch.full((48,), 50), torch.full((48,), 50)
    plans = augment.plan(heights, widths, torch.Generator().manual_seed(5), chunked=False)
    chunked = augment.plan(heights, widths, torch.Generator().manual_seed(5), chunked=True)
    assert [len(p.chunks) for p in plans] == [1, 1] and len(chunked[0].chunks) > 1  # the test splits
    ahead = augment(images, plans=plans)
    at_once = augment(images, torch.Generator().manual_seed(5))
    assert len(ahead) == len(at_once) == 5
    for a, b in zip(ahead, at_once):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def _noise_pair(noise_p: float, noise_std: float, images: torch.Tensor, seed: int, black_level_p: float = 0.0,
                black_level_max: float = 0.0, black_level_min: float = 0.0, **view_changes):
    """The crops of `images` (in [0, 1] pixel units) without and with the imaging step, every other
    draw the same."""
    mean, std = [0.4, 0.6], [0.2, 0.25]
    plain_config = DinoConfig(global_crop_size=32, local_crop_size=12, local_crops_number=2)
    noisy_config = replace(plain_config, noise_p=noise_p, noise_std=noise_std, black_level_p=black_level_p,
                           black_level_max=black_level_max, black_level_min=black_level_min)
    plain, noisy = BatchMultiCrop(plain_config, mean, std), BatchMultiCrop(noisy_config, mean, std)
    for augment in (plain, noisy):
        augment.global_views = [replace(v, **view_changes) for v in augment.global_views]
        augment.local_view = replace(augment.local_view, **view_changes)
    m, s = torch.tensor(mean)[None, :, None, None], torch.tensor(std)[None, :, None, None]
    to_pixels = lambda crops: [c * s + m for c in crops]  # noqa: E731
    return (to_pixels(plain(images, torch.Generator().manual_seed(seed))),
            to_pixels(noisy(images, torch.Generator().manual_seed(seed))))


def test_imaging_noise_is_gaussian_with_a_uniform_sigma_per_channel():
    """dino.noise_p / noise_std: each chosen crop's channel gets N(0, sigma^2) with sigma ~ U(0, noise_std)
    in [0, 1] pixel units. Against that law, computed here from the definition: with brightness and
    solarisation off and pixels far from the clamp, noisy minus plain crop (same seed) has mean ~0 per
    crop, a per-channel spread whose distribution over crops is U(0, noise_std) (Kolmogorov-Smirnov),
    Gaussian tails (kurtosis ~3); with noise_p 1 every crop is noisy."""
    from scipy import stats

    images = 0.35 + 0.3 * torch.rand(64, 2, 40, 40)  # within 0.35..0.65: 3.5 sigma from either bound
    plain, noisy = _noise_pair(1.0, 0.08, images, seed=11, brightness_p=0.0, solarize_p=0.0)
    residual = (noisy[0] - plain[0]).double()  # global crops of 32 x 32: 1,024 pixels a channel
    spread = residual.std(dim=(-2, -1)).flatten().numpy()
    means = residual.mean(dim=(-2, -1)).flatten().numpy()
    assert (np.abs(means) < 5 * np.maximum(spread, 1e-9) / 32 + 1e-6).all()
    assert stats.kstest(spread / 0.08, "uniform").pvalue > 1e-3
    assert spread.max() < 0.08 * 1.1 and spread.min() >= 0
    wide = residual[spread.reshape(residual.shape[:2]) > 0.04]
    kurtosis = float(((wide / wide.std(dim=(-2, -1), keepdim=True)) ** 4).mean())
    assert 2.8 < kurtosis < 3.2


def test_imaging_noise_touches_its_share_of_crops_only_and_stays_in_range():
    """With noise_p 0.5 about half the crops differ from the noiseless ones (binomial, 4 standard
    errors) and the others are equal to the bit; a noisy crop is clamped to [0, 1] where the noise
    would leave it (a plain one may overshoot a little: bicubic resizing);
    noise_p 0 (the default, scDINO's) leaves every crop as it was."""
    images = torch.rand(48, 2, 40, 40)
    plain, noisy = _noise_pair(0.5, 0.2, images, seed=3)
    changed = torch.cat([(a != b).flatten(1).any(1) for a, b in zip(plain, noisy)])
    n = changed.numel()
    assert abs(float(changed.float().mean()) - 0.5) < 4 * (0.25 / n) ** 0.5
    for a, b in zip(plain, noisy):
        same = ~(a != b).flatten(1).any(1)
        assert torch.equal(a[same], b[same])
        assert float(b[~same].min()) >= -1e-5 and float(b[~same].max()) <= 1 + 1e-5
    assert any(float((b <= 1e-5).float().mean()) > float((a <= 1e-5).float().mean()) for a, b in zip(plain, noisy))
    unchanged, again = _noise_pair(0.0, 0.2, images, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(unchanged, again))
    assert all(torch.equal(a, b) for a, b in zip(unchanged, plain))


def test_imaging_noise_does_not_depend_on_how_a_batch_is_cut_into_chunks():
    """The CPU finishes a group in chunks, a GPU (and data.gpu_augment's plan) in one: each crop's noise
    comes from its own seed, so both give the same crops."""
    dino = DinoConfig(global_crop_size=96, local_crop_size=16, local_crops_number=3, noise_p=0.7, noise_std=0.1)
    augment = BatchMultiCrop(dino, [0.4, 0.5, 0.6], [0.2, 0.25, 0.3])
    images = torch.rand(48, 3, 50, 50)
    heights, widths = torch.full((48,), 50), torch.full((48,), 50)
    plans = augment.plan(heights, widths, torch.Generator().manual_seed(5), chunked=False)
    assert len(augment.plan(heights, widths, torch.Generator().manual_seed(5), chunked=True)[0].chunks) > 1
    ahead = augment(images, plans=plans)
    for a, b in zip(ahead, augment(images, torch.Generator().manual_seed(5))):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    plain = BatchMultiCrop(replace(dino, noise_p=0.0), [0.4, 0.5, 0.6], [0.2, 0.25, 0.3])
    noiseless = plain(images, plans=plain.plan(heights, widths, torch.Generator().manual_seed(5), chunked=False))
    assert all(not torch.equal(a, b) for a, b in zip(ahead, noiseless))  # the noise was there to agree on


def test_black_level_cuts_the_floor_and_stretches_the_rest():
    """dino.black_level_p / black_level_max: each chosen crop's channel becomes max(x - t, 0) / (1 - t)
    with t ~ U(0, black_level_max), every other draw the same. Against that map, computed here from
    the definition: for every crop, the t that maps the plain crop's pixels above the floor onto the
    dark one's is one value per channel, within [0, black_level_max), and the pixels under it are 0."""
    images = 0.35 + 0.3 * torch.rand(32, 2, 40, 40)
    dark_config = {"black_level_p": 1.0, "black_level_max": 0.5, "brightness_p": 0.0, "solarize_p": 0.0}
    plain, dark = _noise_pair(0.0, 0.0, images, seed=7, **dark_config)
    levels, floored = [], 0
    for a, b in zip(plain, dark):
        a, b = a.double(), b.double()
        above = b > 1e-6
        t = torch.where(above, (a - b) / (1 - b), torch.nan)  # x - t = y (1 - t)  =>  t = (x - y) / (1 - y)
        per_channel = t.flatten(2).nanmedian(dim=2).values
        spread = (t - per_channel[..., None, None]).abs().nan_to_num(0).flatten(2).amax(2)
        assert float(spread.max()) < 1e-4
        floor = a <= per_channel[..., None, None] - 1e-4
        assert bool((b[floor].abs() < 1e-6).all())
        floored += int(floor.sum())
        levels.append(per_channel.flatten())
    assert floored > 1000  # the floor was cut somewhere: the check above is not empty
    levels = torch.cat(levels)
    assert float(levels.min()) >= 0 and float(levels.max()) < 0.5
    assert 0.2 < float(levels.mean()) < 0.3  # U(0, 0.5) over 384 crop channels: mean 0.25, s.e. 0.007


def test_a_black_level_below_zero_lifts_the_floor_onto_a_pedestal():
    """dino.black_level_min < 0: a chosen crop's channel becomes (x + u) / (1 + u), u = -t ~ U(0,
    -black_level_min) where black_level_max is 0. Against that map, computed here from the definition:
    the u that maps each plain crop's pixels onto the lifted one's is one value per channel, in
    [0, 0.5), every pixel at least u / (1 + u) (the pedestal), the levels' mean that of U(0, 0.5); with
    the range across 0 (-0.2 to 0.2) about half the channels are lifted and half cut."""
    images = 0.35 + 0.3 * torch.rand(32, 2, 40, 40)
    lift = {"black_level_p": 1.0, "black_level_min": -0.5, "black_level_max": 0.0, "brightness_p": 0.0,
            "solarize_p": 0.0}
    plain, lifted = _noise_pair(0.0, 0.0, images, seed=7, **lift)
    pedestals = []
    for a, b in zip(plain, lifted):
        a, b = a.double(), b.double()
        u = (b - a) / (1 - b)  # (x + u) = y (1 + u)  =>  u = (y - x) / (1 - y)
        per_channel = u.flatten(2).median(dim=2).values
        assert float((u - per_channel[..., None, None]).abs().flatten(2).amax(2).max()) < 1e-4
        floor = per_channel / (1 + per_channel)
        assert bool((b >= floor[..., None, None] - 1e-6).all())
        pedestals.append(per_channel.flatten())
    pedestals = torch.cat(pedestals)
    assert float(pedestals.min()) >= 0 and float(pedestals.max()) < 0.5
    assert 0.2 < float(pedestals.mean()) < 0.3  # U(0, 0.5) over 384 crop channels: mean 0.25, s.e. 0.007
    both = {**lift, "black_level_min": -0.2, "black_level_max": 0.2}
    plain, changed = _noise_pair(0.0, 0.0, images, seed=8, **both)
    lifted_share = torch.cat([((b - a).flatten(2).mean(2) > 0).flatten() for a, b in zip(plain, changed)]).double()
    assert abs(float(lifted_share.mean()) - 0.5) < 4 * (0.25 / lifted_share.numel()) ** 0.5


@pytest.mark.parametrize(("key", "value", "message"), [
    ("dino.black_level_min", -1.0, "dino.black_level_min must be in (-1, dino.black_level_max=0.1]"),
    ("dino.black_level_min", 0.2, "dino.black_level_min must be in (-1, dino.black_level_max=0.1]"),
    ("dino.noise_p", 1.5, "dino.noise_p must be a probability between 0 and 1, got 1.5"),
    ("dino.black_level_p", -0.5, "dino.black_level_p must be a probability between 0 and 1, got -0.5"),
    ("dino.noise_std", -0.1, "dino.noise_std must be between 0 and 1"),
    ("dino.black_level_max", 1.0, "dino.black_level_max must be in [0, 1)"),
])
def test_imaging_settings_out_of_range_name_the_key(key, value, message):
    from training.config import ConfigError

    with pytest.raises(ConfigError, match=re.escape(message)):
        Config().replace({key: value})


def test_the_imaging_step_with_the_dali_loader_is_refused_with_the_way_out():
    from training.config import ConfigError

    with pytest.raises(ConfigError, match="dino.black_level_p, dino.noise_p .* not supported by data.loader=dali: "
                                          "use data.loader=packed"):
        Config().replace({"dino.noise_p": 0.5, "dino.black_level_p": 0.5, "data.loader": "dali"})
