"""Tokens for the Slurm REST API (JSON Web Tokens signed with HS256, the one algorithm Slurm takes).

On AWS PCS the laptop signs its own token with the cluster's JWT key, which PCS keeps in Secrets Manager
(PCS takes no `scontrol token` tokens and wants the user's POSIX identity among the claims). On
ParallelCluster the head node's bootstrap writes a token of the cluster's default user into the
deployment's secret every half hour (bootstrap/on-node-configured.sh): the laptop reads it, never a key.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from dataclasses import dataclass

LIFESPAN = 3600
"""Seconds a token this module signs is valid: long enough for a submission and a status, short enough
that a leaked one soon stops working."""


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def sign_hs256(key: bytes, claims: dict) -> str:
    """The compact JWT of `claims`, signed with HMAC-SHA256 (RFC 7519, RFC 7518's HS256)."""
    header = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    payload = _b64url(json.dumps(claims, separators=(",", ":")).encode())
    signature = hmac.new(key, f"{header}.{payload}".encode("ascii"), hashlib.sha256).digest()
    return f"{header}.{payload}.{_b64url(signature)}"


@dataclass(frozen=True)
class PosixUser:
    """Who the jobs run as: a user that exists on the cluster's nodes."""

    name: str
    uid: int
    gid: int


def claims_for(user: PosixUser, *, lifespan: int = LIFESPAN, now: float | None = None) -> dict:
    """Slurm's claims (iat, exp, sun) and the POSIX identity PCS requires (uid, gid, id)."""
    issued = int(time.time() if now is None else now)
    return {"iat": issued, "exp": issued + lifespan, "sun": user.name, "uid": user.uid, "gid": user.gid,
            "id": {"gecos": user.name, "dir": f"/home/{user.name}", "shell": "/bin/bash", "gids": [user.gid]}}


def token_expiry(token: str) -> int | None:
    """The `exp` claim of a token (unverified: for saying when it lapses), None when it has none."""
    try:
        payload = token.split(".")[1]
        return int(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["exp"])
    except (IndexError, ValueError, KeyError, TypeError):
        return None
