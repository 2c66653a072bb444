"""The deployment as a laptop reaches it: from the deployment record (stacks/deployment.py) alone, with AWS
credentials for its account.

- The REST API: an SSM port forward (no SSH, no open port, no public address) from 127.0.0.1:6820 here to
  slurmrestd: on ParallelCluster to port 6820 of the head node, where its bootstrap runs slurmrestd; on
  PCS from a login node to the cluster's SLURMRESTD endpoint (`pcs get-cluster`), a private address of
  the managed controller. `tunnel_command` says which; `python -m training remote tunnel` runs it.
- The token: on PCS signed here with the cluster's JWT key, which PCS keeps in Secrets Manager (the
  cluster stack's RestClientPolicy grants reading it); on ParallelCluster the one the head node writes
  into the cluster stack's RestToken secret every 30 minutes (for the cluster's default user). A
  Secrets Manager secret rather than an SSM SecureString: CloudFormation creates and deletes it with the
  stack, its resource policy and KMS key are the stack's, and the laptop reads both back ends' the same way.
- The data: the bucket's data prefix, which the file system imports at /fsx/<prefix> and exports back.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

from training.errors import UserError
from training.remote.tokens import PosixUser, claims_for, sign_hs256, token_expiry

REST_PORT = 6820
"""slurmrestd's port on the head node and PCS's SLURMRESTD endpoint; the tunnel's local end too."""
DEFAULT_ENDPOINT = f"http://127.0.0.1:{REST_PORT}"
PATHS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


@dataclass(frozen=True)
class Target:
    """Where a remote command goes: the recorded deployment and how this laptop reaches it."""

    record: object
    """stacks.deployment.Deployment (imported lazily: the package must not need the CDK)."""
    record_path: Path
    endpoint: str
    cluster_data: str
    """The folder the bucket's data prefix is imported to, on the cluster (/fsx/data)."""
    bundle: str
    """The bundle's root on the cluster (/apps/scdino): its slurm/ holds the scripts the jobs run."""

    @property
    def region(self) -> str:
        return self.record.region

    @property
    def bucket(self) -> str:
        bucket = self.record.resources.get("bucket")
        if not bucket:
            raise UserError(f"{self.record_path.name} holds no bucket of {self.record.prefix}: deploy the storage "
                            "stack (`python -m stacks.deployment deploy storage`)")
        return bucket

    @property
    def user(self) -> PosixUser:
        """Who the jobs run as on PCS: the image's default user (stacks/shared/constants.py)."""
        from stacks.shared.constants import DEFAULT_USERS

        return PosixUser(DEFAULT_USERS.get(self.settings().image.os, "ec2-user"), 1000, 1000)

    def settings(self):
        from stacks.deployment import resolve

        return resolve(self.record.context)


def load_target(path: Path | None, *, endpoint: str, cluster_data: str | None, bundle: str,
                region: str | None) -> Target:
    """The recorded deployment; one line when there is none, or when --region names another."""
    try:
        from stacks.deployment import DEFAULT_RECORD, DeploymentError, load
    except ImportError:
        raise UserError("the remote commands read the deployment record with stacks/deployment.py: run them "
                        "from the repository's checkout") from None
    path = path or DEFAULT_RECORD
    try:
        record = load(path)
    except DeploymentError as error:
        raise UserError(str(error)) from None
    if record is None:
        raise UserError(f"no deployment recorded at {path}: deploy with `python -m stacks.deployment deploy` (it "
                        "records the region, bucket and cluster), or name another record with --deployment FILE")
    if region and region != record.region:
        raise UserError(f"--region {region}: {path.name} records the deployment {record.prefix} in {record.region}; "
                        "leave --region out, or give that deployment's record (--deployment FILE)")
    return Target(record, path, endpoint, cluster_data or f"/fsx/{record.data_prefix.strip('/')}", bundle)


def aws_session(target: Target):
    """A boto3 session in the deployment's region whose credentials are for the deployment's account."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    session = boto3.session.Session(region_name=target.region)
    try:
        account = session.client("sts").get_caller_identity()["Account"]
    except NoCredentialsError:
        raise UserError("no AWS credentials: run `aws configure sso` or `aws configure` (or set AWS_PROFILE) for "
                        f"the account of {target.record.prefix}") from None
    except (BotoCoreError, ClientError) as error:
        raise UserError(f"the AWS credentials do not work in {target.region}: {str(error).splitlines()[0]}") from None
    expected = target.record.account
    if expected and account != expected:
        raise UserError(f"these AWS credentials are for account {account}, the deployment {target.record.prefix} is "
                        f"in account {expected} ({target.region}): use that account's profile (AWS_PROFILE=...)")
    return session


def token(target: Target, session) -> tuple[str, str]:
    """A token for the REST API (see the module's docstring) and the user it names for X-SLURM-USER-NAME: PCS's
    signed here (no name: PCS takes the token's claims alone), ParallelCluster's read with its user."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        if target.record.backend == "pcs":
            return _pcs_token(target, session), ""
        return _head_node_token(target, session)
    except ClientError as error:
        code = error.response.get("Error", {}).get("Code", "")
        raise UserError(f"cannot read the REST API's {'key' if target.record.backend == 'pcs' else 'token'} "
                        f"({code}: {error.response.get('Error', {}).get('Message', '')}): attach the cluster "
                        "stack's RestClientPolicy to your role (docs/deploy.md, From a laptop)") from None
    except BotoCoreError as error:
        raise UserError(f"cannot reach AWS in {target.region}: {error}") from None


def _pcs_token(target: Target, session) -> str:
    import base64
    import binascii

    cluster_id = target.record.resources.get("pcs_cluster_id")
    if not cluster_id:
        raise UserError(f"{target.record_path.name} has no PCS cluster of {target.record.prefix} yet: deploy the "
                        "cluster stack (`python -m stacks.deployment deploy cluster`)")
    cluster = session.client("pcs").get_cluster(clusterIdentifier=cluster_id)["cluster"]
    key = cluster.get("slurmConfiguration", {}).get("jwtAuth", {}).get("jwtKey", {})
    if not key.get("secretArn"):
        raise UserError(f"PCS cluster {cluster_id} has no JWT key: its Slurm REST API is off (Slurm 25.05 or later "
                        "and cluster.slurm_rest turn it on; `python -m stacks.deployment update`)")
    secret = session.client("secretsmanager").get_secret_value(
        SecretId=key["secretArn"], **({"VersionId": key["secretVersion"]} if key.get("secretVersion") else {}))
    try:  # PCS keeps the key's bytes base64-encoded in the secret's string
        signing_key = base64.b64decode(secret["SecretString"], validate=True)
    except (binascii.Error, KeyError):
        raise UserError(f"the JWT key secret of PCS cluster {cluster_id} is not base64 text: check "
                        f"{key['secretArn']}") from None
    return sign_hs256(signing_key, claims_for(target.user))


def _head_node_token(target: Target, session) -> tuple[str, str]:
    arn = target.record.resources.get("rest_token_secret")
    if not arn:
        raise UserError(f"{target.record_path.name} names no REST token secret of {target.record.prefix}: deploy "
                        "the cluster stack again (`python -m stacks.deployment update`), which creates it")
    value = session.client("secretsmanager").get_secret_value(SecretId=arn)["SecretString"]
    try:
        written = json.loads(value)
        found, user = written["token"], str(written.get("user", ""))
    except (json.JSONDecodeError, KeyError, TypeError):
        raise UserError(f"no token in {arn} yet: the head node writes one once slurmrestd runs (its bootstrap log, "
                        "/var/log/scdino-bootstrap.log; systemctl status scdino-slurmrestd)") from None
    expiry = token_expiry(found)
    if expiry is not None and expiry < time.time():
        raise UserError(f"the head node's REST token expired at {time.strftime('%F %T UTC', time.gmtime(expiry))}: "
                        "it renews it every 30 min while up (systemctl status scdino-rest-token.timer there)")
    return found, user


def tunnel_command(target: Target, session=None) -> list[str]:
    """The `aws ssm start-session` port forward that makes the REST API answer at 127.0.0.1:6820 here."""
    record = target.record
    base = ["aws", "ssm", "start-session", "--region", record.region]
    if record.backend == "pcs":
        from stacks.deployment import login_node_finder

        host, port = _pcs_endpoint(target, session) if session is not None else ("<SLURMRESTD address>", REST_PORT)
        finder = "$(" + shlex.join(login_node_finder(record)) + ")"
        return [*base, "--target", finder, "--document-name", "AWS-StartPortForwardingSessionToRemoteHost",
                "--parameters", f"host={host},portNumber={port},localPortNumber={REST_PORT}"]
    head = record.resources.get("head_node_instance_id") or "<head node instance id>"
    return [*base, "--target", head, "--document-name", "AWS-StartPortForwardingSession",
            "--parameters", f"portNumber={REST_PORT},localPortNumber={REST_PORT}"]


def _pcs_endpoint(target: Target, session) -> tuple[str, int]:
    cluster_id = target.record.resources.get("pcs_cluster_id", "")
    cluster = session.client("pcs").get_cluster(clusterIdentifier=cluster_id)["cluster"]
    for endpoint in cluster.get("endpoints", []):
        if endpoint.get("type") == "SLURMRESTD":
            return endpoint["privateIpAddress"], int(endpoint.get("port", REST_PORT))
    raise UserError(f"PCS cluster {cluster_id} lists no SLURMRESTD endpoint: its Slurm REST API is off "
                    "(cluster.slurm_rest; `python -m stacks.deployment update`)")


def tunnel_hint(target: Target) -> str:
    """What the REST API's unreachable message ends with: the tunnel to open."""
    if target.endpoint != DEFAULT_ENDPOINT:
        return ": check that slurmrestd runs there"
    return (f": open the SSM port forward in another terminal with `python -m training remote tunnel` "
            f"({' '.join(tunnel_command(target)[:3])} ... {target.record.backend}) and keep it open")


def job_environment(target: Target, extra: dict[str, str]) -> dict[str, str]:
    """What the jobs start with (a REST job gets no submitter's environment): the cluster's PATH, with
    ParallelCluster's and PCS's Slurm commands, the user's home; then --env."""
    settings = target.settings()
    slurm_bins = ["/opt/slurm/bin", f"/opt/aws/pcs/scheduler/slurm-{settings.image.pcs_slurm_version}/bin"]
    user = target.user
    return {"PATH": ":".join([*slurm_bins, *PATHS]), "HOME": f"/home/{user.name}", "USER": user.name,
            "LANG": "C.UTF-8", **extra}
