"""The Slurm REST API (slurmrestd): the versions a server offers, job submission, job states, cancel.

    api = SlurmRest("http://127.0.0.1:6820", token)
    api.version                      # the newest version both sides know, e.g. v0.0.38 or v0.0.43
    job_id = api.submit(JobRequest(...))
    api.jobs(job_id)                 # [JobState, ...] (one per array task), [] once Slurm forgot it
    api.cancel(job_id)

Slurm's REST API is versioned by plugin: Debian 12's Slurm 22.05 serves v0.0.36 to v0.0.38, whose job
description is `v0.0.38_job_properties`; Slurm 23.02 and later serve the data_parser versions (v0.0.39
on; PCS's Slurm 25.05 serves v0.0.41 to v0.0.43), whose description is `v0.0.4x_job_desc_msg`, with the
script inside the job, the environment as a list and numbers as {set, infinite, number}. The client reads
the server's OpenAPI document (/openapi/v3), takes the newest version it knows of those offered, and
checks every field it is about to send against that version's own schema, so a field a server lacks is
one line naming the sbatch option, not a job that silently ignores it.

The token goes in X-SLURM-USER-TOKEN, which every version reads; the user it was issued for, where known,
in X-SLURM-USER-NAME, which Slurm 22.05 requires beside it (PCS's tokens carry their user in their claims and
go without: PCS takes no user name header).
Standard library only: the laptop needs no HTTP client package.
"""

from __future__ import annotations

import json
import re
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable

from training.errors import UserError
from training.remote.fields import LEGACY, JobRequest, job_description

KNOWN = ("v0.0.38", "v0.0.39", "v0.0.40", "v0.0.41", "v0.0.42", "v0.0.43", "v0.0.44")
"""Versions this client can write job descriptions for, oldest first."""
_VERSION = re.compile(r"^/slurm/(v\d+\.\d+\.\d+)/")
INVALID_JOB_ID = 2017
"""Slurm's ESLURM_INVALID_JOB_ID: a job the controller does not (or no longer) know."""


class RestError(UserError):
    """The REST API could not do what was asked; the message is one line with the fix."""


class Unreachable(RestError):
    """No server answers at the endpoint (no tunnel, a stopped slurmrestd)."""


class TokenRefused(RestError):
    """The server refused the token (expired, signed with another key, unknown user)."""


class JobUnknown(RestError):
    """The controller knows no such job."""


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.lstrip("v").split("."))


@dataclass(frozen=True)
class JobState:
    """What the controller says of one job (or one array task)."""

    job_id: str
    name: str
    state: str
    """PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, ... (the first of the newer versions' flags)."""
    reason: str = ""
    start: int = 0
    end: int = 0
    exit_code: int = 0
    array_task: str = ""


def _number(value: Any) -> int:
    """An integer of either generation: 5, or {"set": true, "infinite": false, "number": 5}."""
    if isinstance(value, dict):
        return int(value.get("number") or 0) if value.get("set", True) else 0
    return int(value or 0)


def _exit_code(value: Any) -> int:
    if isinstance(value, dict):  # v0.0.40 on: {"status": [...], "return_code": {...}, "signal": {...}}
        return _number(value.get("return_code"))
    return int(value or 0)


def job_state(job: dict) -> JobState:
    """A job of a GET /job/{id} answer, of either generation."""
    state = job.get("job_state", "")
    if isinstance(state, list):
        state = state[0] if state else ""
    task = job.get("array_task_id")
    task = "" if task in (None, "") or (isinstance(task, dict) and not task.get("set", True)) else _number(task)
    return JobState(job_id=str(job.get("job_id", "")), name=str(job.get("name", "")), state=str(state),
                    reason=str(job.get("state_reason", "") or ""), start=_number(job.get("start_time")),
                    end=_number(job.get("end_time")), exit_code=_exit_code(job.get("exit_code")),
                    array_task=str(task))


class SlurmRest:
    """A slurmrestd endpoint with a token. `hint` ends the unreachable message (which tunnel to open); `openapi`
    is the server's document when an earlier client of the same server read it."""

    def __init__(self, url: str, token: str, *, user: str = "", hint: str = "", timeout: float = 30,
                 opener: Callable[..., Any] = urllib.request.urlopen, openapi: dict | None = None) -> None:
        self.url = url.rstrip("/")
        self._headers = {"X-SLURM-USER-TOKEN": token, **({"X-SLURM-USER-NAME": user} if user else {}),
                         "Content-Type": "application/json", "Accept": "application/json"}
        self._hint = hint
        self._timeout = timeout
        self._open = opener
        self._openapi = openapi

    # --- HTTP ----------------------------------------------------------------------------------------

    def _call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method, headers=self._headers)
        try:
            with self._open(request, timeout=self._timeout) as response:
                return response.status, _json(response.read())
        except urllib.error.HTTPError as error:
            status, payload = error.code, _json(error.read())
        except (urllib.error.URLError, ConnectionError, socket.timeout, TimeoutError) as error:
            reason = getattr(error, "reason", error)
            raise Unreachable(f"no Slurm REST API answers at {self.url} ({reason}){self._hint}") from None
        if status in (401, 403):
            raise TokenRefused(f"the Slurm REST API at {self.url} refused the token (HTTP {status}: "
                               f"{_first_error(payload) or 'authentication failure'}): it is expired or signed "
                               "with another key; get a new one (the head node renews its token every 30 min)")
        return status, payload

    # --- versions ------------------------------------------------------------------------------------

    def openapi(self) -> dict:
        if self._openapi is None:
            status, document = self._call("GET", "/openapi/v3")
            if status != 200 or "paths" not in document:
                raise RestError(f"{self.url}/openapi/v3 answered HTTP {status} without an OpenAPI document: is "
                                "this slurmrestd?")
            self._openapi = document
        return self._openapi

    def offered(self) -> list[str]:
        """The slurmctld API versions the server offers, oldest first (the slurmdbd ones, dbv*, aside)."""
        found = {match.group(1) for path in self.openapi()["paths"] if (match := _VERSION.match(path))}
        return sorted(found, key=version_key)

    @property
    def version(self) -> str:
        """The newest version both the server and this client know."""
        offered = self.offered()
        common = [version for version in offered if version in KNOWN]
        if not common:
            raise RestError(f"the Slurm REST API at {self.url} offers {', '.join(offered) or 'no slurm version'}; "
                            f"this client writes {KNOWN[0]} to {KNOWN[-1]}: update the code or the cluster's Slurm")
        return common[-1]

    def check(self) -> None:
        """Ask slurmctld through the API (ping): slurmrestd passes the token on to slurmctld unread, so a refused
        token shows only in an answer from slurmctld (Slurm 22.05: HTTP 500, "slurmctld config is unable to
        load"), never at /openapi."""
        status, answer = self._call("GET", f"/slurm/{self.version}/ping")
        if status != 200:
            raise TokenRefused(f"the Slurm REST API at {self.url} could not ask slurmctld with this token (HTTP "
                               f"{status}: {_first_error(answer) or 'no answer'}): the token is refused (expired or "
                               "signed with another key: get a new one; the head node renews its token every 30 min) "
                               "or slurmctld is down")

    def job_schema(self) -> dict:
        """The properties of the chosen version's job description, from the server's own document."""
        version = self.version
        schemas = self.openapi().get("components", {}).get("schemas", {})
        name = f"{version}_job_properties" if version == LEGACY else f"{version}_job_desc_msg"
        return schemas.get(name, {}).get("properties", {})

    # --- jobs ----------------------------------------------------------------------------------------

    def submit(self, job: JobRequest) -> str:
        """Submit one batch job; its id. A field the server's schema lacks is refused before sending."""
        version = self.version
        description = job_description(job, version)
        known = self.job_schema()
        missing = [name for name in description if known and name not in known and name != "script"]
        if missing:
            raise RestError(f"the Slurm REST API {version} at {self.url} has no job field {', '.join(missing)} "
                            f"(job {job.options.get('job-name', '?')}): this Slurm cannot take those sbatch options")
        body = {"script": description.pop("script"), "job": description} if version == LEGACY else {"job": description}
        status, answer = self._call("POST", f"/slurm/{version}/job/submit", body)
        job_id = answer.get("job_id")
        if status != 200 or not job_id:
            raise RestError(f"Slurm refused job {job.options.get('job-name', '?')} (HTTP {status}): "
                            f"{_first_error(answer) or 'no job id in the answer'}")
        return str(job_id)

    def jobs(self, job_id: str) -> list[JobState]:
        """The job (every task of an array), or [] once the controller has forgotten it (MinJobAge)."""
        status, answer = self._call("GET", f"/slurm/{self.version}/job/{job_id}")
        if _unknown_job(answer):
            return []
        if status != 200 and not answer.get("jobs"):
            raise RestError(f"job {job_id}: HTTP {status} {_first_error(answer)}")
        return [job_state(job) for job in answer.get("jobs", [])]

    def cancel(self, job_id: str) -> None:
        """Cancel a job (every task of an array); a job that already ended is left as it is."""
        status, answer = self._call("DELETE", f"/slurm/{self.version}/job/{job_id}")
        if _unknown_job(answer):
            raise JobUnknown(f"job {job_id}: Slurm knows no such job (it ended more than MinJobAge ago, or never was)")
        if status != 200 and _errno(answer) not in (0, 2021):  # 2021: ESLURM_ALREADY_DONE
            raise RestError(f"cancelling job {job_id}: HTTP {status} {_first_error(answer)}")


def _json(raw: bytes) -> dict:
    try:
        value = json.loads(raw or b"{}")
    except json.JSONDecodeError:
        return {"errors": [{"error": raw.decode(errors="replace").strip()[:200]}]}
    return value if isinstance(value, dict) else {}


def _errors(answer: dict) -> list[dict]:
    return [error for error in answer.get("errors", []) if isinstance(error, dict)]


def _first_error(answer: dict) -> str:
    for error in _errors(answer):
        text = error.get("description") or error.get("error") or ""
        if text:
            return str(text)
    return ""


def _unknown_job(answer: dict) -> bool:
    """Whether the answer says the controller knows no such job: by its error number, or by its words where a
    version gives none."""
    return _errno(answer) == INVALID_JOB_ID or "invalid job id" in _first_error(answer).lower()


def _errno(answer: dict) -> int:
    for error in _errors(answer):
        number = error.get("error_number", error.get("errno"))
        if number:
            return int(number)
    return 0
