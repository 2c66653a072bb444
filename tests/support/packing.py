"""Packed datasets for tests, written by the product's own part writer and merge, and a v1 pack
(before the per-cell table) written the way `prepare` wrote it then, for the conversion tests."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np

from training.data.store.format import FORMAT_V1
from training.data.store.merge import merge_parts
from training.data.store.write import PartWriter


def write_packed(folder: Path, images, classes: list[str], metadata: dict[str, list] | None = None,
                 shard_bytes: int | None = None) -> None:
    """A packed dataset of (C, H, W) `images`, cell i of class `classes[i]` with path c/<i>.tif."""
    folder = Path(folder)
    part = folder.with_name(folder.name + ".part")
    options = {"shard_bytes": shard_bytes} if shard_bytes else {}
    writer = PartWriter(part, channels=images[0].shape[0], dtype=images[0].dtype, **options)
    for i, image in enumerate(images):
        extra = {name: values[i] for name, values in (metadata or {}).items()}
        writer.append(np.asarray(image), f"c/{i}.tif", {"Metadata_Class": classes[i], **extra})
    writer.finish()
    merge_parts([part], folder, source="test")


def write_v1_pack(folder: Path, images, labels: list[int], class_names: list[str], *, checksum: bool = True) -> dict:
    """A scdino-packed-v1 folder: images.bin and an index.json listing every path, label, shape and offset."""
    folder = Path(folder)
    folder.mkdir(parents=True)
    data = b"".join(np.ascontiguousarray(image).tobytes() for image in images)
    (folder / "images.bin").write_bytes(data)
    shapes = [list(image.shape) for image in images]
    offsets = np.concatenate([[0], np.cumsum([image.size for image in images])[:-1]]).tolist() if images else []
    meta = {"format": FORMAT_V1, "dtype": images[0].dtype.str, "channels": images[0].shape[0],
            "paths": [f"{class_names[label]}/{i}.tif" for i, label in enumerate(labels)], "labels": list(labels),
            "class_names": class_names, "shapes": shapes, "offsets": offsets,
            "total_elements": int(sum(image.size for image in images)), "source": "old", "folder_depth_for_labels": 0}
    if checksum:
        meta.update(data_bytes=len(data), data_crc32=f"{zlib.crc32(data) & 0xFFFFFFFF:08x}")
    (folder / "index.json").write_text(json.dumps(meta))
    return meta
