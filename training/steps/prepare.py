"""prepare: pack the TIFF folder into a few flat pixel files + the per-cell table, and fix the split.

    python -m training prepare --config run.yaml

    python -m training prepare --config run.yaml --part 3 --parts 8     (one task of a Slurm array)
    python -m training prepare --config run.yaml --merge --parts 8      (after every task)

    python -m training prepare --config run.yaml --verify

Reads data.source (class folders), writes <run>/packed (or data.packed_dir) atomically, the
seeded train/hold-out split (<run>/split.json, split.npy) and, if any image is unusable, the report
<run>/bad_images.json (path and reason of each). data.on_bad_image=fail stops at the first one.

With --parts N, task K packs the K-th of N slices of the sorted image list into
<packed>.parts/part-K-of-N/ (a finished part is kept and skipped when the task runs again), and
--merge lists the parts' bad images, joins the finished parts into <packed> (linking their pixel
files, copying no pixel), then writes the split (training/data/store/merge.py, the same merge as
`ingest`'s): `sbatch --array=0-7 slurm/prepare.slurm CONFIG` does both.

--verify writes nothing: it checks what `prepare` wrote, every byte of the pixel files and the
table against the CRC-32s in packed/index.json included, and says "intact" or names the damaged
file (exit 2).
"""

from __future__ import annotations

import argparse

from training.config import Config
from training.rundir import RunLayout


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--verify", action="store_true",
                        help="check the packed dataset (every byte against its checksum), the split and the "
                             "bad-image report instead of writing them")
    parser.add_argument("--part", type=int, metavar="K", help="pack only the K-th slice (0-based) of --parts")
    parser.add_argument("--parts", type=int, default=1, metavar="N",
                        help="how many slices the images are packed in (one per task of a Slurm array)")
    parser.add_argument("--merge", action="store_true", help="join the finished parts into the packed dataset")


def run(config: Config, layout: RunLayout, args: argparse.Namespace) -> int:
    if getattr(args, "verify", False):
        from training.data.store.merge import verify_packed

        return verify_packed(config, layout, "prepare")
    from training.data.folders.prepare import prepare

    prepare(config, layout, part=getattr(args, "part", None), parts=getattr(args, "parts", 1),
            merge=getattr(args, "merge", False))
    return 0
