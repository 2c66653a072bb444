"""The fast loader path computes what the plain one does: banded products against dense ones,
ring-buffered threads against the synchronous loader and the plain multi-crop, device-side
augmentation against the CPU path (crops and DINO loss), the ring's lifetime rule, and the
`bench loader` JSON with its three paths, --size and --warmup 0."""

import copy
import json
import time

import numpy as np
import pytest
import torch

from tests.support.augment_reference import blur_matrices
from training.cli import main
from training.config import dump_config
from training.data.loading.augment import BatchMultiCrop, banded_row_product, resize_matrices
from training.data.loading.loaders import build_pretrain_loader
from training.data.loading.torch_loader import RawBatch, crops_on_device
from training.dino.step import forward_loss
from training.distributed.groups import DistContext, DistEnv
from training.trainer import build_state, train

MEAN, STD = [0.3] * 5, [0.2] * 5
CPU = DistContext(env=DistEnv(), device=torch.device("cpu"), backend=None)


def test_banded_row_product_equals_the_dense_product():
    generator = torch.Generator().manual_seed(0)
    start = torch.randint(0, 20, (6,), generator=generator).double()
    length = torch.randint(8, 30, (6,), generator=generator).double()
    rows = resize_matrices(start, length, 64, 50, torch.tensor([True, False] * 3))
    rows = torch.bmm(blur_matrices(torch.full((6,), 1.2), 64), rows)
    source = torch.randn(6, 3, 50, 40, generator=generator)
    out = torch.empty(6, 3, 64, 40)
    banded_row_product(rows, source, out)
    torch.testing.assert_close(out, torch.matmul(rows[:, None], source), atol=1e-5, rtol=1e-5)


def _batches(loader, count):
    """Clones of the first `count` batches: ring buffers are reused, so a kept batch must be copied."""
    out = []
    for k, (crops, labels) in enumerate(loader):
        out.append(([c.clone() for c in crops], labels))
        if k + 1 == count:
            break
    return out


def test_threaded_ring_loader_gives_the_synchronous_loaders_crops(make_config):
    threaded = make_config({"data.num_workers": 2})
    loader, _ = build_pretrain_loader(threaded, rank=0, world_size=1, mean=MEAN, std=STD)
    assert loader.threads == 2 and loader.ring == 4
    inline, _ = build_pretrain_loader(make_config(), rank=0, world_size=1, mean=MEAN, std=STD)
    for (a, la), (b, lb) in zip(_batches(loader, 5), _batches(inline, 5), strict=True):
        assert torch.equal(la, lb) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_ring_output_is_the_plain_multicrop_of_the_batch(make_config):
    config = make_config()
    loader, sampler = build_pretrain_loader(config, rank=0, world_size=1, mean=MEAN, std=STD)
    seed, indices = next(iter(sampler))
    crops, _ = next(iter(loader))
    images, _ = loader.dataset._read(np.asarray(indices))
    plain = BatchMultiCrop(config.dino, MEAN, STD)(images, torch.Generator().manual_seed(seed))
    assert all(torch.equal(a, b) for a, b in zip(crops, plain))


def test_a_batch_stays_valid_until_the_next_is_asked_for(make_config):
    loader, _ = build_pretrain_loader(make_config({"data.num_workers": 2}), rank=0, world_size=1,
                                      mean=MEAN, std=STD)
    reference = _batches(loader, len(loader))
    iterator = iter(loader)
    storages = []
    for k in range(len(loader)):
        crops, _ = next(iterator)
        time.sleep(0.05)  # let the threads run ahead as far as the ring allows
        assert all(torch.equal(c, r) for c, r in zip(crops, reference[k][0]))
        storages.append(crops[0].untyped_storage().data_ptr())
    assert len(set(storages)) == min(loader.ring, len(loader))  # a few buffers, reused in turn


def test_device_augmentation_under_per_image_normalisation_gives_the_same_crops(make_config):
    config = make_config({"model.out_dim": 64, "data.normalization": "per_image"})
    crops, _ = next(iter(build_pretrain_loader(config, rank=0, world_size=1, mean=MEAN, std=STD)[0]))
    raw, _ = next(iter(build_pretrain_loader(config.replace({"data.gpu_augment": True}), rank=0, world_size=1,
                                             mean=MEAN, std=STD)[0]))
    plain, _ = next(iter(build_pretrain_loader(config.replace({"data.normalization": "dataset"}), rank=0,
                                               world_size=1, mean=MEAN, std=STD)[0]))
    for a, b, c in zip(crops, crops_on_device(raw, torch.device("cpu")), plain, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
        assert not torch.allclose(a, c, atol=1e-2)


def test_device_augmentation_gives_the_same_crops_and_loss(make_config):
    config = make_config({"model.out_dim": 64})
    cpu_loader, _ = build_pretrain_loader(config, rank=0, world_size=1, mean=MEAN, std=STD)
    raw_loader, _ = build_pretrain_loader(config.replace({"data.gpu_augment": True}), rank=0, world_size=1,
                                          mean=MEAN, std=STD)
    crops, labels = next(iter(cpu_loader))
    raw, raw_labels = next(iter(raw_loader))
    assert isinstance(raw, RawBatch) and raw.images.dtype == torch.uint16 and len(raw) == 8
    on_device = crops_on_device(raw, torch.device("cpu"))
    assert torch.equal(labels, raw_labels)
    for a, b in zip(crops, on_device):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    state = build_state(config, CPU, steps_per_epoch=1)
    centre = copy.deepcopy(state.loss_fn.state_dict())
    losses = []
    for batch in (crops, on_device):
        state.loss_fn.load_state_dict(centre)  # the loss updates its centre on every call
        torch.manual_seed(0)  # the same stochastic-depth draws
        with torch.no_grad():
            losses.append(forward_loss(state, batch, 0))
    torch.testing.assert_close(losses[0], losses[1], atol=1e-5, rtol=1e-5)


def test_bench_loader_reports_three_paths_at_native_size(make_config, tmp_path, capsys):
    config = make_config({"data.source": str(tmp_path / "absent"), "optim.batch_size_per_gpu": 4})
    path = tmp_path / "bench.yaml"
    dump_config(config, path)
    assert main(["bench", "loader", "--config", str(path), "--images", "25", "--batches", "2",
                 "--warmup", "0", "--workers", "1", "--size", "24/12"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["settings"]["crops"] == "2x24 + 2x12"
    assert result["settings"]["warmup_batches"] == 0 and result["settings"]["timed_batches"] == 2
    device = result["device_augment"]
    assert device["device"] == "cpu" and device["images_per_s"] > 0 and device["cpu_ms_per_image"] > 0
    assert device["ratio"] == pytest.approx(device["images_per_s"] / result["baseline_scdino_style_images_per_s"],
                                            rel=0.02)
    assert main(["bench", "loader", "--config", str(path), "--size", "24x12"]) == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("normalization", ["dataset", "per_image"])
def test_cuda_augmentation_matches_the_cpu_path(make_config, normalization):
    config = make_config({"model.out_dim": 64, "data.normalization": normalization})
    crops, _ = next(iter(build_pretrain_loader(config, rank=0, world_size=1, mean=MEAN, std=STD)[0]))
    raw, _ = next(iter(build_pretrain_loader(config.replace({"data.gpu_augment": True}), rank=0, world_size=1,
                                             mean=MEAN, std=STD)[0]))
    on_gpu = crops_on_device(raw, torch.device("cuda"))
    assert all(c.is_cuda for c in on_gpu)
    for a, b in zip(crops, on_gpu):
        torch.testing.assert_close(a, b.cpu(), atol=1e-4, rtol=1e-4)


def test_training_with_device_augmentation_matches_cpu_augmentation(make_config, tmp_path):
    def factory(config, ctx):
        return build_pretrain_loader(config, rank=0, world_size=1, mean=MEAN, std=STD)

    losses = []
    for gpu_augment in (False, True):
        config = make_config({"run.output_dir": str(tmp_path / f"run-{gpu_augment}"), "model.out_dim": 64,
                              "train.max_steps_per_epoch": 2, "data.gpu_augment": gpu_augment})
        losses.append(train(config, CPU, loader_factory=factory).last_loss)
    assert losses[0] is not None and losses[0] == pytest.approx(losses[1], rel=1e-4)


@pytest.mark.parametrize("side", [40, 43, 32])
def test_centre_crop_is_torchvisions_center_crop_at_the_images_own_resolution(side):
    """eval.resize=centre_crop against torchvision's CenterCrop, DINO's evaluation crop, on a batch and on
    a list of images; no pixel is resampled."""
    from torchvision.transforms.functional import center_crop

    from training.data.loading.augment import centre_crop

    images = torch.rand(3, 5, side, side + 3, generator=torch.Generator().manual_seed(side))
    expected = center_crop(images, [32, 32])
    assert torch.equal(centre_crop(images, 32), expected)
    assert torch.equal(centre_crop(list(images), 32), expected)


def test_centre_crop_brings_a_small_image_up_to_the_window_first():
    from torchvision.transforms.functional import InterpolationMode, center_crop, resize

    from training.data.loading.augment import centre_crop

    image = torch.rand(2, 24, 30, generator=torch.Generator().manual_seed(0))
    expected = center_crop(resize(image[None], [32], interpolation=InterpolationMode.BILINEAR, antialias=False), [32, 32])
    torch.testing.assert_close(centre_crop([image], 32), expected, rtol=0, atol=1e-6)
