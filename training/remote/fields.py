"""sbatch's options as the fields of the Slurm REST API's job description, in either generation.

A REST client sends what sbatch would: the script's text, its arguments, and the job's options, which
sbatch takes from the script's #SBATCH lines and its command line. `job_description` maps sbatch's long
options onto the fields of the API version in use: v0.0.38's `job_properties` (Slurm 22.05: the
environment a dict, times in minutes, flags as booleans) or the data_parser versions' `job_desc_msg`
(v0.0.39 on, PCS's: the environment a list of KEY=VALUE, numbers as {set, infinite, number}, flags as
lists, a warning signal in three fields). An option with no mapping is refused in one line naming it:
nothing is dropped silently.
"""

from __future__ import annotations

import logging
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from training.errors import UserError

log = logging.getLogger(__name__)

LEGACY = "v0.0.38"
"""The last version before data_parser (Slurm 22.05): its job description differs."""
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
_SIGNAL = re.compile(r"^(?:(R|B|RB|BR):)?([A-Z0-9]+)(?:@(\d+))?$")
IGNORED = {"parsable"}
"""sbatch options about sbatch's own output, which a REST submission has no use for."""


def minutes(value: str) -> int:
    """A Slurm time (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) in whole minutes, rounded up."""
    match = _TIME.match(str(value))
    if not match:
        raise UserError(f"--time={value}: write a Slurm time, e.g. 90, 01:30:00 or 2-00:00:00")
    days, first, second, third = match.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        seconds = int(days) * 86400 + int(first) * 3600 + int(second or 0) * 60 + int(third or 0)
    elif third is not None:  # HH:MM:SS
        seconds = int(first) * 3600 + int(second) * 60 + int(third)
    else:  # MM or MM:SS
        seconds = int(first) * 60 + int(second or 0)
    return -(-seconds // 60)


def node_range(value: str) -> tuple[int, int]:
    low, _, high = str(value).partition("-")
    if not low.isdigit() or (high and not high.isdigit()):
        raise UserError(f"--nodes={value}: give a node count or a range, e.g. 2 or 1-4")
    return int(low), int(high or low)


def _no_val(number: int) -> dict[str, Any]:
    return {"set": True, "infinite": False, "number": number}


def _flag(value: str | bool | None) -> bool:
    return value in (None, True) or str(value).lower() in ("1", "yes", "true")


def legacy_fields(name: str, value: str | bool | None) -> dict[str, Any]:
    """One sbatch option as v0.0.38's job properties (Slurm 22.05's slurmrestd, whose parser differs from its
    published schema in places, each measured against it: `legacy_node_count` has the node count)."""
    if name == "nodes":
        return {"nodes": list(node_range(value))}
    if name == "time":
        return {"time_limit": minutes(value)}
    if name == "exclusive":  # its "true" reads as a boolean, which the parser refuses
        return {"exclusive": "exclusive" if value in (None, True) else str(value)}
    if name == "wait-all-nodes":  # an integer, though the schema says boolean
        return {"wait_all_nodes": int(_flag(value))}
    if name == "signal":  # [B:] is refused: the signal goes to the job's steps, not its batch shell
        where, _, signal = str(value).rpartition(":")
        if where:
            log.warning("--signal=%s: Slurm 22.05's REST API takes no B: (batch shell only); %s goes to the "
                        "job's steps", value, signal)
        return {"signal": signal}
    if name == "open-mode":
        return {"open_mode": str(value)}
    if name == "kill-on-invalid-dep":
        return {"kill_on_invalid_dependency": _flag(value)}
    return {}


def parser_fields(name: str, value: str | bool | None) -> dict[str, Any]:
    """One sbatch option as the data_parser versions' job_desc_msg (v0.0.39 on; PCS's)."""
    if name == "nodes":
        return {"nodes": str(value)}
    if name == "time":
        return {"time_limit": _no_val(minutes(value))}
    if name == "exclusive":
        return {"shared": ["none"]} if value in (None, True) else {"shared": [str(value)]}
    if name == "signal":
        match = _SIGNAL.match(str(value).upper().removeprefix("SIG"))
        if not match:
            raise UserError(f"--signal={value}: write [B:]SIGNAL[@SECONDS], e.g. B:USR1@600")
        where, signal, delay = match.groups()
        flags = ["BATCH_JOB"] if where and "B" in where else []
        return {"kill_warning_signal": signal, "kill_warning_delay": _no_val(int(delay or 60)),
                "kill_warning_flags": flags}
    if name == "open-mode":
        return {"open_mode": [str(value).upper()]}
    if name == "wait-all-nodes":
        return {"wait_all_nodes": _flag(value)}
    if name == "kill-on-invalid-dep":
        return {"flags": ["KILL_INVALID_DEPENDENCY"]} if _flag(value) else {}
    return {}


COMMON = {"job-name": ("name", str), "partition": ("partition", str), "ntasks": ("tasks", int),
          "ntasks-per-node": ("tasks_per_node", int), "cpus-per-task": ("cpus_per_task", int),
          "output": ("standard_output", str), "error": ("standard_error", str), "dependency": ("dependency", str),
          "array": ("array", str), "comment": ("comment", str), "requeue": ("requeue", _flag)}
"""sbatch options whose field has the same name and form in every version: option -> (field, conversion)."""
SPECIAL = {"nodes", "time", "exclusive", "signal", "open-mode", "kill-on-invalid-dep", "wait-all-nodes"}


def with_arguments(script: str, argv: tuple[str, ...]) -> str:
    """The script with its arguments set as its positional parameters, below its first line: the job description's
    argv field crashes Slurm 22.05's slurmrestd (v0.0.38; a segmentation fault, measured here), so no version
    gets it."""
    if not argv:
        return script
    first, newline, rest = script.partition("\n")
    if not first.startswith("#!"):
        first, rest = "#!/bin/bash", script
    line = f"set -- {shlex.join(argv)}  # the job's arguments (python -m training remote)"
    return f"{first}\n{line}\n{rest}"


def job_description(job: JobRequest, version: str) -> dict[str, Any]:
    """The job description (with its script) of the API version, from sbatch's options."""
    legacy = version == LEGACY
    description: dict[str, Any] = {
        "script": with_arguments(job.script, job.argv), "current_working_directory": job.cwd,
        "environment": dict(job.environment) if legacy else [f"{k}={v}" for k, v in job.environment.items()]}
    for name, value in job.options.items():
        if name in IGNORED or value is False:
            continue
        if name in COMMON:
            field_name, convert = COMMON[name]
            description[field_name] = convert(value)
        elif name in SPECIAL:
            fields = legacy_fields(name, value) if legacy else parser_fields(name, value)
            if "flags" in fields and "flags" in description:
                fields["flags"] = description["flags"] + fields["flags"]
            description.update(fields)
        else:
            raise UserError(f"sbatch option --{name} (job {job.options.get('job-name', '?')}) has no REST field "
                            f"here (training/remote/fields.py): submit this chain with slurm/submit_pipeline.sh")
    if legacy and "nodes" in job.options:
        description.update(legacy_node_count(job.options))
    return description


def legacy_node_count(options: dict[str, str | None]) -> dict[str, int]:
    """v0.0.38 accepts `nodes` and ignores it (a job asking [2, 2] gets one node, measured): the count goes as
    tasks, `ntasks-per-node` (else one) on each of the fewest nodes asked, unless --ntasks names the tasks."""
    low, _ = node_range(options["nodes"])
    per_node = int(options.get("ntasks-per-node") or 1)
    tasks = int(options["ntasks"]) if options.get("ntasks") else low * per_node
    return {"tasks": tasks, "tasks_per_node": per_node}


@dataclass(frozen=True)
class JobRequest:
    """One batch job as sbatch would submit it: the script's text, its arguments, the job's environment
    and working folder, and sbatch's long options without dashes (a flag's value is None)."""

    script: str
    argv: tuple[str, ...] = ()
    """The script's arguments, as on sbatch's command line after the script."""
    environment: dict[str, str] = field(default_factory=dict)
    cwd: str = "/tmp"
    options: dict[str, str | None] = field(default_factory=dict)
