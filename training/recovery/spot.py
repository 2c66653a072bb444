"""EC2 Spot interruption notice -> the pre-emption protocol (save, PREEMPTED marker, requeue).

Two minutes before EC2 reclaims a Spot instance, its instance metadata answers
GET /latest/meta-data/spot/instance-action with {"action": "terminate"|"stop"|"hibernate", "time"};
until then it answers 404. IMDSv2 asks for a session token first (PUT /latest/api/token with a TTL
header) and for that token on every GET. One thread per node (local rank 0) polls every few
seconds; on a notice it sends SIGUSR1 to its own process, exactly what Slurm sends before a time
limit: training/trainer.py's StopSignals sees it, every rank stops after the same step, rank 0
saves and leaves the marker, and the batch script requeues the job onto other instances.

train.spot_watch: auto (default) watches where the firmware says EC2 or SCDINO_IMDS_ENDPOINT names
another metadata server (tests use one on loopback); on always; off never.
SCDINO_SPOT_POLL_SECONDS sets the polling period (default 5 s: the notice leaves 120 s, enough
for the current step and a save).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
import urllib.error
import urllib.request
from typing import Callable, Mapping

from training.errors import UserError

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "http://169.254.169.254"
TOKEN_PATH, NOTICE_PATH = "/latest/api/token", "/latest/meta-data/spot/instance-action"
TOKEN_TTL_S = 21600
REQUEST_TIMEOUT_S = 2.0
"""The metadata service answers in milliseconds; off EC2 the address does not answer at all."""


class MetadataClient:
    """IMDSv2: a session token, then GETs that carry it (a new token when one is refused)."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint.rstrip("/")
        self._token: str | None = None

    def token(self) -> str:
        request = urllib.request.Request(self.endpoint + TOKEN_PATH, method="PUT",
                                         headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)})
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            return response.read().decode()

    def notice(self) -> dict | None:
        """The interruption notice, or None while there is none (404)."""
        for _ in range(2):
            self._token = self._token or self.token()
            request = urllib.request.Request(self.endpoint + NOTICE_PATH,
                                             headers={"X-aws-ec2-metadata-token": self._token})
            try:
                with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
                    return json.loads(response.read().decode() or "{}")
            except urllib.error.HTTPError as error:
                if error.code == 404:
                    return None
                if error.code != 401:
                    raise
                self._token = None  # expired: fetch a new one once
        raise PermissionError("the metadata service refused a fresh IMDSv2 token")


def resolve(mode: str, environ: Mapping[str, str] | None = None,
            on_ec2: Callable[[], bool] | None = None) -> str | None:
    """The endpoint to watch, or None: off never; on always; auto where SCDINO_IMDS_ENDPOINT is set or
    this machine is an EC2 instance."""
    env = os.environ if environ is None else environ
    endpoint = env.get("SCDINO_IMDS_ENDPOINT") or DEFAULT_ENDPOINT
    if mode == "off":
        return None
    if mode == "on" or env.get("SCDINO_IMDS_ENDPOINT"):
        return endpoint
    return endpoint if (on_ec2 or is_ec2_instance)() else None


def poll_seconds(environ: Mapping[str, str]) -> float:
    text = environ.get("SCDINO_SPOT_POLL_SECONDS", "5")
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise UserError(f"SCDINO_SPOT_POLL_SECONDS must be a number of seconds > 0, got {text!r}")
    return value


def is_ec2_instance() -> bool:
    """Whether the firmware says EC2, read from files (no request leaves a machine that is not):
    the DMI vendor of Nitro instances (every current GPU type), the hypervisor id of Xen ones."""
    for path, prefix in (("/sys/class/dmi/id/sys_vendor", "Amazon EC2"), ("/sys/hypervisor/uuid", "ec2")):
        try:
            with open(path) as handle:
                if handle.read().strip().lower().startswith(prefix.lower()):
                    return True
        except OSError:
            continue
    return False


class SpotWatcher:
    """Around the training loop (inside StopSignals, which must catch the SIGUSR1): in one process
    per node, a daemon thread that finds the endpoint, then polls it until a notice or the end."""

    def __init__(self, mode: str, *, enabled: bool, environ: Mapping[str, str] | None = None,
                 on_ec2: Callable[[], bool] | None = None) -> None:
        self.mode, self.enabled = mode, enabled
        self.environ = os.environ if environ is None else environ
        self.on_ec2 = on_ec2
        self.poll_s = poll_seconds(self.environ)
        self.notice: dict | None = None
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "SpotWatcher":
        if self.enabled and self.mode != "off":
            self._thread = threading.Thread(target=self._watch, name="spot-watcher", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=3 * REQUEST_TIMEOUT_S)  # at most one request in flight

    def _watch(self) -> None:
        endpoint = resolve(self.mode, self.environ, self.on_ec2)
        if endpoint is None:
            log.debug("train.spot_watch=auto: no instance metadata service here; not watching")
            return
        log.info("watching %s for a Spot interruption notice every %g s", endpoint, self.poll_s)
        client, failing = MetadataClient(endpoint), False
        while not self._stopped.is_set():
            try:
                self.notice = client.notice()
                failing = False
            except (OSError, ValueError) as error:
                if not failing:
                    log.warning("Spot notice check at %s failed (%s); will keep trying", endpoint, error)
                failing = True
            if self.notice is not None:
                self._act()
                return
            self._stopped.wait(self.poll_s)

    def _act(self) -> None:
        log.warning("Spot interruption notice on %s (%s at %s): saving a checkpoint and stopping for a requeue",
                    socket.gethostname(), self.notice.get("action"), self.notice.get("time"))
        os.kill(os.getpid(), signal.SIGUSR1)
