"""How each rank logs: rank 0 at LOGLEVEL (INFO by default), every other rank only WARNING and up,
with its rank and host in each line; the ranks logger at LOGLEVEL on every rank.

Standard library only: the command line configures logging before it imports torch, and
training/distributed/groups.py logs to the ranks logger without importing the command line.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Mapping

from training.errors import UserError

RANKS_LOGGER = "training.ranks"
"""Messages every rank logs at LOGLEVEL (training/distributed/groups.py: a rank joining the job)."""


def launcher_rank(environ: Mapping[str, str] | None = None) -> int:
    """This process's rank as torchrun (RANK) or Slurm (SLURM_PROCID) numbers it; 0 outside both."""
    env = os.environ if environ is None else environ
    return int(env.get("RANK", env.get("SLURM_PROCID", "0")))


def configure_logging(environ: Mapping[str, str] | None = None) -> None:
    """Rank 0 logs at LOGLEVEL (INFO by default); every other rank only WARNING and up, with its rank
    and host in each line: a job log then shows each message once, and still says where a problem
    arose. The logger `training.ranks` (each rank joining) logs at LOGLEVEL on every rank.
    (Progress bars, too, are drawn by rank 0 only: training/metrics.py.)"""
    env = os.environ if environ is None else environ
    rank = launcher_rank(env)
    level = logging.getLevelName(env.get("LOGLEVEL", "INFO").upper())
    if not isinstance(level, int):
        raise UserError(f"LOGLEVEL must be one of DEBUG, INFO, WARNING, ERROR, got {env['LOGLEVEL']!r}")
    where = "" if rank == 0 else f"[rank {rank} {socket.gethostname()}] "
    logging.basicConfig(
        level=level if rank == 0 else max(level, logging.WARNING),
        format=f"%(asctime)s %(levelname)s {where}%(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    logging.getLogger(RANKS_LOGGER).setLevel(level)
