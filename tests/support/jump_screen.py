"""A JUMP-style screen whose table points elsewhere, written into a test's folder.

    screen = write_jump_screen(tmp_path)      load_data_with_illum.csv and the files it names

The table has the columns of the Cell Painting Gallery's load_data_with_illum.csv (cpg0016-jump):
Metadata_Source/_Batch/_Plate/_Well/_Site, FileName_Orig<Channel> + PathName_Orig<Channel> per
channel (one 16-bit plane per file, named as the Phenix writes them, r01c01f01p01-ch5sk1fk1fl1.tiff),
their PathName_ the s3://cellpainting-gallery/... folders, and FileName_Illum<Channel> +
PathName_Illum<Channel> (illumination functions, .npy, which no test has); plus the compound
(Metadata_JCP2022, as JUMP's well.csv gives it) and a lab's own segmentation,
ObjectsFileName_Cells + ObjectsPathName_Cells under an absolute folder of another machine
(/lab/segmentation/...). The pixels live in the test's folder instead: the images under
mirror/cellpainting-gallery/... (a local copy of the bucket) and the masks under segmentation/, so
ingest.path_map (PATH_MAP) is what finds them.

Each field is a quarter of the real field of tests/data/real-nuclei (DSB 2018, 256 x 256 px, 29 to
40 nuclei with its real labels): DNA is the image itself and the other four channels are fixed,
distinct transforms of it, so a crop taken from the wrong channel or field cannot pass.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tifffile

REAL = Path(__file__).resolve().parents[1] / "data" / "real-nuclei"
CHANNELS = ("OrigDNA", "OrigER", "OrigRNA", "OrigAGP", "OrigMito")
"""ingest.channels, in the order the crops stack them."""
PHENIX_CHANNEL = {"OrigMito": 1, "OrigAGP": 2, "OrigRNA": 3, "OrigER": 4, "OrigDNA": 5}
SOURCE, BATCH = "source_4", "2021_04_26_Batch1"
GALLERY = "s3://cellpainting-gallery/"
FOREIGN_MASKS = "/lab/segmentation/"
FIELDS = (("BR00117035", "A01", 1), ("BR00117035", "A01", 2), ("BR00117035", "B02", 1), ("BR00117036", "A01", 1))
"""(plate, well, site) of each row; each takes the next quarter of the real field."""
COMPOUNDS = {"A01": "JCP2022_033924", "B02": "JCP2022_085227"}


@dataclass(frozen=True)
class JumpScreen:
    table: Path
    path_map: list[list[str]]
    """ingest.path_map that finds the files in the test's folder."""
    images: list[np.ndarray]
    """Each row's channels stacked in CHANNELS order, (5, 256, 256) uint16."""
    masks: list[np.ndarray]


def channel_planes(quarter: np.ndarray) -> np.ndarray:
    """Five distinct uint16 planes of one quarter, DNA first."""
    wide = quarter.astype(np.int64)
    planes = [wide, wide[::-1] * 3, wide[:, ::-1] + 1000, (wide * 7 + 13) % 4096, wide.T * 2 + 5]
    return np.stack(planes).astype(np.uint16)


def plate_folder(plate: str) -> str:
    return f"cellpainting-gallery/cpg0016-jump/{SOURCE}/images/{BATCH}/images/{plate}__2021-05-02T16_02_51-Measurement1/Images"


def write_jump_screen(root: Path) -> JumpScreen:
    image = tifffile.imread(REAL / "img2d.tif")
    mask = tifffile.imread(REAL / "mask2d.tif")
    quarters = [(slice(r, r + 256), slice(c, c + 256)) for r in (0, 256) for c in (0, 256)]
    rows, images, masks = [], [], []
    for (plate, well, site), quarter in zip(FIELDS, quarters):
        planes, labels = channel_planes(image[quarter]), mask[quarter].copy()
        phenix = f"r{ord(well[0]) - 64:02d}c{int(well[1:]):02d}f{site:02d}p01"
        row = {"Metadata_Source": SOURCE, "Metadata_Batch": BATCH, "Metadata_Plate": plate, "Metadata_Well": well,
               "Metadata_Site": str(site), "Metadata_JCP2022": COMPOUNDS[well]}
        images_folder = root / "mirror" / plate_folder(plate)
        images_folder.mkdir(parents=True, exist_ok=True)
        for channel, plane in zip(CHANNELS, planes):
            name = f"{phenix}-ch{PHENIX_CHANNEL[channel]}sk1fk1fl1.tiff"
            tifffile.imwrite(images_folder / name, plane)
            row[f"FileName_{channel}"] = name
            row[f"PathName_{channel}"] = f"s3://{plate_folder(plate)}/"
        for channel in CHANNELS:
            row[f"FileName_{channel.replace('Orig', 'Illum')}"] = f"{plate}_{channel.replace('Orig', 'Illum')}.npy"
            row[f"PathName_{channel.replace('Orig', 'Illum')}"] = (
                f"{GALLERY}cpg0016-jump/{SOURCE}/images/{BATCH}/illum/{plate}")
        masks_folder = root / "segmentation" / BATCH / plate
        masks_folder.mkdir(parents=True, exist_ok=True)
        tifffile.imwrite(masks_folder / f"{well}_s{site}_cells.tiff", labels)
        row["ObjectsFileName_Cells"] = f"{well}_s{site}_cells.tiff"
        row["ObjectsPathName_Cells"] = f"{FOREIGN_MASKS}{BATCH}/{plate}"
        rows.append(row)
        images.append(planes)
        masks.append(labels)
    table = root / "load_data_csv" / "load_data_with_illum.csv"
    table.parent.mkdir(parents=True, exist_ok=True)
    with open(table, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    path_map = [[GALLERY, f"{root / 'mirror' / 'cellpainting-gallery'}/"], [FOREIGN_MASKS, f"{root / 'segmentation'}"]]
    return JumpScreen(table, path_map, images, masks)


def expected_crops(images: np.ndarray, mask: np.ndarray, size: int) -> dict[int, np.ndarray]:
    """Each object's crop whose window lies inside the field: the NumPy slice of side `size` whose
    pixel (size // 2, size // 2) is nearest the object's centroid (halves up), from np.nonzero."""
    crops = {}
    height, width = mask.shape
    for label in np.unique(mask)[1:]:
        rows, cols = np.nonzero(mask == label)
        top = int(np.floor(rows.mean() + 0.5)) - size // 2
        left = int(np.floor(cols.mean() + 0.5)) - size // 2
        if top >= 0 and left >= 0 and top + size <= height and left + size <= width:
            crops[int(label)] = images[:, top:top + size, left:left + size]
    return crops
