"""The synthetic set carries its classes in specific channels, so that comparing channel
combinations (`compare`) means something: raw-pixel kNN per channel, as the raw_pixels baseline
computes it (scaled, standardised per channel, average-pooled to 16 x 16, L2-normalised).

Measured on the demo's set (5 classes x 400, 200 queries, through prepare/mean-std/features/knn):
top-1 marker (3) 65.0 %, cytoplasm (1) 30.5 %, membrane (0) 25.5 %, dna (2) 23.5 %, marker2 (4)
24.0 % (chance 20 %); all channels 66.5 %, all but the marker 26.5 %.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from training.data.dataset import to_scaled_tensor
from training.data.synthetic.folders import generate
from training.eval.knn import knn_classify, split_reference_query

CLASSES = 5
MARKER, NUISANCE = 3, 4


def raw_pixel_top1(images: np.ndarray, labels: np.ndarray, channels: tuple[int, ...]) -> float:
    """Weighted kNN top-1 (k=10, T=0.1) of the raw-pixel baseline on these channels."""
    x = torch.stack([to_scaled_tensor(image, channels) for image in images])
    x = (x - x.mean(dim=(0, 2, 3), keepdim=True)) / x.std(dim=(0, 2, 3), keepdim=True)
    features = F.normalize(F.adaptive_avg_pool2d(x, 16).flatten(1), dim=1).numpy()
    ref, query = split_reference_query(labels, 0.8, seed=0)
    result = knn_classify(features[ref], labels[ref], features[query], labels[query], ks=[10],
                          temperature=0.1, num_classes=CLASSES)
    return result.top1[10]


@pytest.mark.slow
def test_the_marker_channel_carries_the_classes_and_the_second_marker_does_not():
    images, labels, _ = generate(classes=CLASSES, per_class=200, channels=5, size=50, seed=0)
    top1 = {c: raw_pixel_top1(images, labels, (c,)) for c in range(5)}
    chance = 1 / CLASSES
    assert top1[MARKER] > 0.5, top1
    assert top1[NUISANCE] < chance + 0.12, top1
    assert top1[MARKER] > 2 * max(v for c, v in top1.items() if c != MARKER), top1
    without_marker = raw_pixel_top1(images, labels, (0, 1, 2, 4))
    assert without_marker < top1[MARKER] - 0.2, (without_marker, top1)
