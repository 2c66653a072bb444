"""A job of the chain as sbatch's command line, and the #SBATCH defaults a batch script carries.

sbatch reads a script's #SBATCH lines itself and lets its command line win over them; a client that
submits through slurmrestd sends the job's properties itself, so it merges the two:
`{**script_options(bundle / job.script), **job.sbatch}`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from training.chain.graph import JobSpec, SbatchValue
from training.errors import UserError

BUNDLE = Path(__file__).resolve().parents[2]
"""The folder holding training/ and slurm/ that this code runs from: a checkout, or the bundle installed on
the cluster."""
_DIRECTIVE = re.compile(r"#SBATCH\s+--([a-z][a-z0-9-]*)(?:=(\S+))?(?:\s+#.*)?\s*")


def placeholder(label: str) -> str:
    """How a command line names a job of the chain before it has an id: <LABEL>."""
    return f"<{label}>"


def command_line(job: JobSpec, bundle: str | Path, ids: Mapping[str, str] | None = None) -> list[str]:
    """sbatch's arguments for JOB, its script under BUNDLE (the folder holding slurm/): --parsable (the
    job id alone on stdout), its options, its dependency, the script and its arguments. The jobs of the
    chain it waits for are their IDS, or placeholders where IDS lacks them (a dry run)."""
    ids = ids or {}
    words = ["--parsable", *(_option(name, value) for name, value in job.sbatch.items() if value is not False)]
    waits = [ids.get(label, placeholder(label)) for label in job.after] + list(job.after_ids)
    if waits:
        words += [f"--dependency=afterok:{':'.join(waits)}", "--kill-on-invalid-dep=yes"]
    return [*words, str(Path(bundle) / job.script), *job.args]


def _option(name: str, value: SbatchValue) -> str:
    return f"--{name}" if value is True else f"--{name}={value}"


def script_options(script: str | Path) -> dict[str, str | bool]:
    """The #SBATCH options at the top of a batch script, by long name (a flag as True), as sbatch reads
    them: up to the first line that is neither a comment nor blank."""
    options: dict[str, str | bool] = {}
    for number, line in enumerate(Path(script).read_text().splitlines(), start=1):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        if not stripped.startswith("#SBATCH"):
            continue
        match = _DIRECTIVE.fullmatch(stripped)
        if not match:
            raise UserError(f"{script} line {number}: {stripped!r}: write #SBATCH options as --name or --name=value")
        options[match[1]] = match[2] if match[2] is not None else True
    return options
