#!/usr/bin/env python3
"""Writes the cluster's shape for slurm/env.sh from the deploy's pointer: the node bootstrap
(on-node-configured.sh) runs it with the system's python3, before the bundle's environment exists,
so it uses the standard library only.

    python3 cluster-env.py POINTER_JSON OUTPUT

The pointer's "cluster" entry (stacks/shared/presets.py, node_shape) lists the enabled presets in
`cluster.presets` order, the cluster's default partition first:

    {"presets": [{"instance_type": "p5.48xlarge", "queue": "gpu-p548xl", "gpus_per_node": 8, "cpus_per_gpu": 24}]}

OUTPUT, a shell file that slurm/env.sh sources, sets SCDINO_CLUSTER_PRESETS: one line per preset,
"instance-type partition GPUs-per-node vCPUs-per-GPU". It is written whole and then renamed, readable
by every user. Exit status: 0 written; 3 the pointer has no "cluster" entry (a deploy older than
this script: nothing written); 2 a malformed entry, named in one line on stderr.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

NO_SHAPE = 3
BAD_INPUT = 2
NAMES = {"instance_type": re.compile(r"[a-z][a-z0-9-]*\.[a-z0-9]+"), "queue": re.compile(r"[A-Za-z][A-Za-z0-9-]*")}
COUNTS = ("gpus_per_node", "cpus_per_gpu")
HEADER = """\
# The cluster's shape, written by the node bootstrap (bootstrap/cluster-env.py) from the pointer of the
# deploy that made this cluster; slurm/env.sh reads it. One line per enabled preset: instance type,
# Slurm partition, GPUs per node, vCPUs per GPU. The first is the cluster's default partition.
"""


class ShapeError(ValueError):
    """The pointer's "cluster" entry is malformed; the message names the entry and the field."""


def preset_line(index: int, preset: object) -> str:
    """One preset as "instance-type partition GPUs vCPUs-per-GPU", each field checked (they end up in shell)."""
    where = f'"cluster" preset {index}'
    if not isinstance(preset, dict):
        raise ShapeError(f"{where}: expected an object, got {preset!r}")
    for key, pattern in NAMES.items():
        if not isinstance(preset.get(key), str) or not pattern.fullmatch(preset[key]):
            raise ShapeError(f"{where}: {key} must match {pattern.pattern}, got {preset.get(key)!r}")
    for key in COUNTS:
        value = preset.get(key)
        if type(value) is not int or value < 1:
            raise ShapeError(f"{where} ({preset['instance_type']}): {key} must be a positive integer, got {value!r}")
    return " ".join(str(preset[key]) for key in (*NAMES, *COUNTS))


def render(cluster: object) -> str:
    """The site file for the pointer's "cluster" entry."""
    presets = cluster.get("presets") if isinstance(cluster, dict) else None
    if not isinstance(presets, list) or not presets:
        raise ShapeError(f'"cluster" must hold a non-empty "presets" list, got {cluster!r}')
    lines = [preset_line(index, preset) for index, preset in enumerate(presets)]
    return HEADER + "SCDINO_CLUSTER_PRESETS='" + "\n".join(lines) + "'\n"


def write(path: Path, text: str) -> None:
    """Whole or not at all (a job may source the old file meanwhile), mode 0644: every user reads it."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text, encoding="utf-8")
    temporary.chmod(0o644)
    os.replace(temporary, path)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: cluster-env.py POINTER_JSON OUTPUT", file=sys.stderr)
        return BAD_INPUT
    pointer_file, output = Path(argv[0]), Path(argv[1])
    try:
        pointer = json.loads(pointer_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        print(f"cluster-env.py: cannot read the pointer {pointer_file}: {error}", file=sys.stderr)
        return BAD_INPUT
    if not isinstance(pointer, dict) or "cluster" not in pointer:
        print(f'cluster-env.py: the pointer {pointer_file} has no "cluster" entry (written by an older deploy)',
              file=sys.stderr)
        return NO_SHAPE
    try:
        text = render(pointer["cluster"])
    except ShapeError as error:
        print(f"cluster-env.py: {pointer_file}: {error}", file=sys.stderr)
        return BAD_INPUT
    write(output, text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
