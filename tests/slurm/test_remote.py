"""`python -m training remote` from a "laptop": the demo's chain through the local cluster's slurmrestd
(Debian's Slurm 22.05, REST API v0.0.38, JWT authentication), followed to the end, fetched from moto's
S3 server on loopback.

What stands in for what, and why:
- The SSM port forward cannot run here (no AWS): the command reaches slurmrestd on 127.0.0.1:6820
  directly (--endpoint), as it reaches the tunnel's local end on a laptop.
- AWS is moto's server on loopback (S3, STS, Secrets Manager): the deployment record names its bucket and
  the token secret; the head node's own token writer (bootstrap/slurm-rest.sh token, with this cluster's
  real scontrol and the AWS CLI) puts a token of this cluster into it, as the head node's timer does.
- FSx's data repository association is this test: it copies the uploaded config from the bucket onto the
  "file system" (a folder playing /fsx/data) as the auto-import would, after submission, so the chain's
  arrival job really waits for it; and it copies the run folder into the bucket as the auto-export would
  once the jobs have ended, before `status` and `fetch` read it from there.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import boto3
import pytest
import yaml

from tests.support.local_slurm import REPO, TINY_PIPELINE
from tests.support.model_card import card_only_checkpoint
from training.cli import main

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

BUCKET = "scdino-remote-test"
ACCOUNT = "123456789012"
"""moto's account: STS answers it for any credentials."""
REST = "http://127.0.0.1:6820"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-west-2"}
TOKEN_LIFESPAN = 3600
"""Seconds the module's one token is valid: every test of the module reads it, the chain's `status --follow`
for as long as the chain runs on a busy machine (the head node renews its own every 30 min instead)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def aws(cluster, tmp_path_factory, moto_endpoint):
    """moto's server on loopback, the bucket, and the token secret holding a real token of this cluster."""
    endpoint = moto_endpoint
    saved = {key: os.environ.get(key) for key in [*CREDENTIALS, "AWS_ENDPOINT_URL"]}
    os.environ.update(CREDENTIALS, AWS_ENDPOINT_URL=endpoint)
    s3 = boto3.client("s3", region_name="us-west-2")
    s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    secrets = boto3.client("secretsmanager", region_name="us-west-2")
    arn = secrets.create_secret(Name="scdino-rest-token", SecretString="not a token yet")["ARN"]
    config = tmp_path_factory.mktemp("head-node-etc")
    (config / "rest.env").write_text(f"REST_SECRET={arn}\nREST_TOKEN_USER=root\nREST_LIFESPAN={TOKEN_LIFESPAN}\n"
                                     "REST_REGION=us-west-2\n")
    renewed = subprocess.run([str(REPO / "bootstrap" / "slurm-rest.sh"), "token"], capture_output=True, text=True,
                             env={**os.environ, "SCDINO_SLURM_ROOT": "/usr", "SCDINO_REST_CONFIG_DIR": str(config)})
    assert renewed.returncode == 0, renewed.stderr
    written = json.loads(secrets.get_secret_value(SecretId=arn)["SecretString"])
    assert written["user"] == "root" and TOKEN_LIFESPAN - 10 <= written["expires"] - time.time() <= TOKEN_LIFESPAN
    yield {"endpoint": endpoint, "s3": s3, "secret": arn}
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def write_record(path: Path, secret: str, account: str = ACCOUNT) -> None:
    from stacks.deployment import Deployment, resolve, save

    context = {"region": "us-west-2", "network.availability_zone": "us-west-2a"}
    record = Deployment.of(resolve(context), context, account).with_outputs({
        "scdino-storage": {"BucketName": BUCKET},
        "scdino-cluster": {"HeadNodeInstanceId": "i-0123456789abcdef0", "RestTokenSecretArn": secret}})
    save(record, path)


def export(fsx_data: Path, s3, prefix: str = "data") -> int:
    """The association's auto-export: every file under the file system's data folder into the bucket."""
    count = 0
    for path in sorted(fsx_data.rglob("*")):
        if path.is_file():
            s3.upload_file(str(path), BUCKET, f"{prefix}/{path.relative_to(fsx_data).as_posix()}")
            count += 1
    return count


def import_when_uploaded(s3, key: str, target: Path, timeout: float = 600) -> threading.Thread:
    """The association's auto-import of one object: copied onto the file system once it is in the bucket."""
    def run() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                s3.download_file(BUCKET, key, str(target))
                return
            except Exception:  # not uploaded yet
                time.sleep(0.5)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def laptop(record: Path, fsx_data: Path, *argv: str) -> list[str]:
    """The remote command's arguments as a laptop gives them, plus where this machine's "cluster" differs."""
    return ["remote", *argv, "--deployment", str(record), "--endpoint", REST, "--cluster-data", str(fsx_data)]


def test_the_demo_chain_through_slurmrestd_followed_and_fetched_from_the_bucket(cluster, aws, tmp_path, capsys):
    from training.data.synthetic.folders import write_dataset

    fsx_data = tmp_path / "fsx" / "data"
    write_dataset(fsx_data / "images", classes=4, per_class=40)
    run_dir = fsx_data / "runs" / "remote-test"
    config = {**TINY_PIPELINE, "run": {**TINY_PIPELINE["run"], "output_dir": str(run_dir)},
              "data": {**TINY_PIPELINE["data"], "source": str(fsx_data / "images")}}
    laptop_config = tmp_path / "laptop" / "run.yaml"
    laptop_config.parent.mkdir()
    laptop_config.write_text(yaml.safe_dump(config))
    record = tmp_path / "deployment.json"
    write_record(record, aws["secret"])
    # The local cluster's overrides of slurm/env.sh (.local-slurm/scdino-env.sh) and this machine's PATH and HOME,
    # where a cluster's jobs take the command's defaults (the bundle's paths, the image user's home).
    local_env = [f"--env={key}={cluster.env[key]}" for key in ("SCDINO_HOME", "SCDINO_VENV", "SCDINO_SCRATCH",
                                                                 "OMP_NUM_THREADS", "PATH", "HOME")]
    arrived = import_when_uploaded(aws["s3"], "data/runs/remote-test.yaml", fsx_data / "runs" / "remote-test.yaml")
    (fsx_data / "runs").mkdir()

    started = time.monotonic()
    assert main([*laptop(record, fsx_data, "submit", "--config", str(laptop_config), "--bundle", str(REPO),
                         "--prepare-tasks", "2"), *local_env]) == 0
    submitted = capsys.readouterr()
    jobs = dict(line.split() for line in submitted.out.splitlines())
    assert list(jobs) == ["arrival", "prepare-parts", "prepare", "mean-std", "pretrain", "features", "labels", "knn",
                          "linear", "export", "plots", "report"]
    assert "Slurm REST API v0.0.38 at http://127.0.0.1:6820 (the server offers v0.0.36, v0.0.37, v0.0.38)" \
        in submitted.err
    arrived.join()
    assert (fsx_data / "runs" / "remote-test.yaml").is_file(), "submit never uploaded the config: the arrival job " \
        "would wait for it in vain"
    parts = cluster.job(jobs["prepare-parts"])
    assert parts["JobName"] == "scdino-prepare-parts" and parts["Partition"] == "gpu-g4dn12xl"
    knn = cluster.job(jobs["knn"])
    assert knn["NumCPUs"] == "12" and knn["TimeLimit"] == "01:00:00", "the script's #SBATCH and the planner's options"
    assert knn["Dependency"] in (f"afterok:{jobs['labels']}(unfulfilled)", "(null)")

    assert main([*laptop(record, fsx_data, "status", "runs/remote-test", "--follow", "--interval", "3")]) == 0
    followed = capsys.readouterr().out
    print(f"chain through REST: {time.monotonic() - started:.0f} s")
    last = followed.strip().split("\n\n")[-1]
    for label, job_id in jobs.items():
        assert f"{job_id}  COMPLETED" in last and label in last, last

    assert export(fsx_data / "runs", aws["s3"], "data/runs") > 20
    assert main(laptop(record, fsx_data, "status", str(run_dir))) == 0
    status = capsys.readouterr().out
    assert "kNN" in status and "top-1" in status and "report.html" in status
    assert f"logs/scdino-knn_{jobs['knn']}.out" not in status  # log lines are shown, not their keys
    assert "| " in status, "the last lines of each job's log, read from the bucket"

    into = tmp_path / "fetched"
    args = laptop(record, fsx_data, "fetch", "runs/remote-test", "--what", "report,knn,profiles", "--into", str(into))
    assert main(args) == 0
    for relative in ("report.html", "knn/knn.json", "profiles/cells.h5ad"):
        assert (into / relative).read_bytes() == (run_dir / relative).read_bytes(), relative
    assert not (into / "plots").exists()
    assert main(args) == 0
    assert "0 file(s) downloaded" in capsys.readouterr().err, "a second fetch finds everything there"

    assert main(laptop(record, fsx_data, "cancel", "runs/remote-test")) == 0
    assert "cancelled 0 job(s)" in capsys.readouterr().err


def test_the_profile_chain_through_slurmrestd_runs_its_setup_with_the_model_and_stops_at_a_failed_step(
        cluster, aws, tmp_path, capsys):
    """`remote submit --profile RUN`: the chain submit_pipeline.sh --profile submits, after `arrival`; its setup
    job reads the model's card and writes the profile's config with the model's channels mapped by name. The
    screen's load table is missing, so ingest fails with its one line and Slurm cancels every job after it: the
    rest of the chain (features of the model, knn, export) is tests/training/steps/test_profile.py's, in-process."""
    from training.chain import PROFILE_STEPS
    from training.config import Config, dump_config, load_config
    from training.rundir import RunLayout

    fsx_data = tmp_path / "fsx" / "data"
    card_only_checkpoint(fsx_data / "runs" / "model")  # the setup reads a checkpoint's config and card, not weights
    assert export(fsx_data / "runs" / "model", aws["s3"], "data/runs/model") == 1
    screen = Config().replace({"run.output_dir": str(fsx_data / "runs" / "new-plates"), "data.channels": "012",
                               "data.channel_names": ["c", "a", "b"],
                               "ingest.table": str(fsx_data / "screen" / "load_data.csv")})
    laptop_config = tmp_path / "laptop" / "new-plates.yaml"
    laptop_config.parent.mkdir()
    dump_config(screen, laptop_config)
    record = tmp_path / "deployment.json"
    write_record(record, aws["secret"])
    local_env = [f"--env={key}={cluster.env[key]}" for key in ("SCDINO_HOME", "SCDINO_VENV", "SCDINO_SCRATCH",
                                                                 "OMP_NUM_THREADS", "PATH", "HOME")]
    arrived = import_when_uploaded(aws["s3"], "data/runs/new-plates.yaml", fsx_data / "runs" / "new-plates.yaml")

    started = time.monotonic()
    assert main([*laptop(record, fsx_data, "submit", "--config", str(laptop_config), "--bundle", str(REPO),
                         "--profile", "runs/model"), *local_env]) == 0
    jobs = dict(line.split() for line in capsys.readouterr().out.splitlines())
    assert list(jobs) == ["arrival", *PROFILE_STEPS]
    arrived.join()
    assert main([*laptop(record, fsx_data, "status", "runs/new-plates", "--follow", "--interval", "2")]) == 1
    last = capsys.readouterr().out.strip().split("\n\n")[-1]
    print(f"profile chain through REST, to its failed ingest: {time.monotonic() - started:.0f} s")
    for label in ("arrival", "profile-setup"):
        assert f"{jobs[label]}  COMPLETED" in last, last
    assert f"{jobs['ingest']}  FAILED" in last, last
    for label in PROFILE_STEPS[2:]:
        assert f"{jobs[label]}  CANCELLED" in last, last
    profile = load_config(RunLayout(fsx_data / "runs" / "new-plates").profile_config)
    assert profile.data.channels == "120" and profile.ingest.crop_size == 40, "the setup read the model's card"
    ingest_log = fsx_data / "runs" / "new-plates" / "logs" / f"scdino-ingest_{jobs['ingest']}.out"
    errors = [line for line in ingest_log.read_text().splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "load_data.csv" in errors[0], ingest_log.read_text()


def test_a_refused_token_and_a_closed_port_are_one_line_each(cluster, aws, tmp_path, capsys):
    """A token signed with another key is refused by the real controller (slurmrestd passes it on unread: its
    OpenAPI document answers anyone); a port with nothing behind it names the tunnel to open."""
    from training.remote.rest import SlurmRest, TokenRefused, Unreachable
    from training.remote.tokens import PosixUser, claims_for, sign_hs256

    forged = sign_hs256(b"not the cluster's key" * 2, claims_for(PosixUser("root", 0, 0)))
    forged_api = SlurmRest(REST, forged, user="root")
    assert forged_api.version == "v0.0.38"
    with pytest.raises(TokenRefused, match="could not ask slurmctld with this token .*the token is refused"):
        forged_api.check()
    with pytest.raises(Unreachable, match="open the tunnel"):
        SlurmRest(f"http://127.0.0.1:{free_port()}", forged, hint=": open the tunnel").offered()

    record = tmp_path / "deployment.json"
    write_record(record, aws["secret"])
    fsx_data = tmp_path / "fsx" / "data"
    args = ["remote", "status", "runs/nothing-here", "--deployment", str(record), "--cluster-data", str(fsx_data)]
    assert main(args) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "no run at s3://" in errors[0] and "runs/nothing-here" in errors[0]


def test_a_token_signed_here_with_the_cluster_key_is_what_pcs_clients_send(cluster):
    """PCS's path signs tokens on the laptop (training/remote/tokens.py): the same signer, with this cluster's
    key, is accepted by the real slurmctld behind slurmrestd."""
    from training.remote.rest import SlurmRest
    from training.remote.tokens import PosixUser, claims_for, sign_hs256

    key = (cluster.base / "etc" / "jwt_hs256.key").read_bytes()
    api = SlurmRest(REST, sign_hs256(key, claims_for(PosixUser("root", 0, 0))), user="root")
    api.check()
    assert api.version == "v0.0.38"
    assert api.jobs("999999") == [], "a job Slurm does not know is an empty list, not an error"


def test_cancel_ends_the_jobs_slurm_still_has_and_passes_over_the_rest(cluster, aws, tmp_path, capsys):
    """`remote cancel` against the real controller: of the record's jobs, the one still waiting is cancelled
    through slurmrestd, one Slurm has forgotten is passed over; a second cancel finds none left."""
    from training.remote.fields import JobRequest
    from training.remote.jobs import Submission, Submitted
    from training.remote.rest import JobUnknown, SlurmRest
    from training.remote.tokens import PosixUser, claims_for, sign_hs256

    key = (cluster.base / "etc" / "jwt_hs256.key").read_bytes()
    api = SlurmRest(REST, sign_hs256(key, claims_for(PosixUser("root", 0, 0))), user="root")
    sleeper = api.submit(JobRequest("#!/bin/bash\nsleep 600\n", (), {"PATH": "/usr/bin:/bin"}, str(tmp_path),
                                    {"job-name": "scdino-sleeper", "ntasks": "1", "cpus-per-task": "1",
                                     "output": str(tmp_path / "%x_%j.out")}))
    try:
        with pytest.raises(JobUnknown, match="job 999999: Slurm knows no such job"):
            api.cancel("999999")
        fsx_data = tmp_path / "fsx" / "data"
        submission = Submission(str(fsx_data / "runs" / "cancel-me"), str(fsx_data / "runs" / "cancel-me.yaml"),
                                "v0.0.38", REST, "2026-11-27T00:00:00Z",
                                (Submitted("forgotten", "999999", "scdino-forgotten"),
                                 Submitted("sleeper", sleeper, "scdino-sleeper", ("forgotten",))))
        aws["s3"].put_object(Bucket=BUCKET, Key="data/runs/cancel-me.jobs.json", Body=submission.to_json().encode())
        record = tmp_path / "deployment.json"
        write_record(record, aws["secret"])
        assert main(laptop(record, fsx_data, "cancel", "runs/cancel-me")) == 0
        assert f"cancelled 1 job(s) of {fsx_data}/runs/cancel-me: sleeper {sleeper}" in capsys.readouterr().err
        assert cluster.wait(sleeper, timeout=120)["JobState"] == "CANCELLED"
        assert main(laptop(record, fsx_data, "cancel", "runs/cancel-me")) == 0
        assert "cancelled 0 job(s)" in capsys.readouterr().err
    finally:
        subprocess.run(["scancel", sleeper], env=cluster.env, capture_output=True, timeout=60)
