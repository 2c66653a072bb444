"""`python -m training remote` without Slurm: the REST job descriptions of both API generations, the
one-line errors, status read from the bucket alone, and the resumable fetch, against moto's server on
loopback (S3, STS, Secrets Manager). tests/slurm/test_remote.py runs the chain through a real slurmrestd."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from dataclasses import replace
from pathlib import Path

import boto3
import pytest

from training.chain import ChainOptions, Site, plan
from training.cli import main
from training.errors import UserError
from training.remote.fields import JobRequest, job_description, minutes
from training.remote.jobs import job_options
from training.remote.rest import RestError, SlurmRest

REPO = Path(__file__).resolve().parents[3]
BUCKET = "scdino-remote-unit"
ACCOUNT = "123456789012"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-west-2"}
SITE = Site(partition="gpu-g4dn12xl", cpus_per_task=12, ingest_cpus_per_task=2)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("text, expected", [("90", 90), ("01:00:00", 60), ("12:00:00", 720), ("2-00:00:00", 2880),
                                            ("1-6", 1800), ("0:30", 1), ("10:30", 11)])
def test_slurm_times_are_whole_minutes_rounded_up(text, expected):
    assert minutes(text) == expected


def test_a_bad_time_is_one_line_with_the_forms():
    with pytest.raises(UserError, match="--time=soon: write a Slurm time"):
        minutes("soon")


@pytest.fixture
def chain(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(f"run: {{output_dir: {tmp_path / 'run'}}}\n")
    return list(plan(config, ChainOptions(prepare_tasks=2), SITE, exists=lambda path: False,
                     config_arg="/fsx/data/runs/x.yaml").jobs)


def test_pretraining_as_v0_0_38_and_as_the_data_parser_versions(chain):
    """The script's #SBATCH lines under the planner's options, mapped onto each generation's fields."""
    pretrain = next(job for job in chain if job.label == "pretrain")
    ids = {label: str(100 + i) for i, label in enumerate(job.label for job in chain)}
    options = job_options(pretrain, REPO, "/fsx/data/runs/x/logs", ids)
    request = JobRequest("#!/bin/bash\n", pretrain.args, {"PATH": "/usr/bin"}, "/fsx/data/runs/x", options)
    legacy = job_description(request, "v0.0.38")
    # Slurm 22.05's parser where it differs from its schema (measured against it): two tasks, one a node, for
    # the two nodes it would ignore; "exclusive", an integer, no batch-shell signal
    assert legacy["nodes"] == [2, 2] and (legacy["tasks"], legacy["tasks_per_node"]) == (2, 1)
    assert legacy["time_limit"] == 720 and legacy["exclusive"] == "exclusive" and legacy["wait_all_nodes"] == 1
    assert legacy["signal"] == "USR1@600" and legacy["requeue"] is True and legacy["open_mode"] == "append"
    assert legacy["dependency"] == f"afterok:{ids['mean-std']}" and legacy["kill_on_invalid_dependency"] is True
    assert legacy["standard_output"] == "/fsx/data/runs/x/logs/%x_%j.out" and legacy["environment"] == {"PATH": "/usr/bin"}
    assert legacy["script"].splitlines()[:2] == ["#!/bin/bash", "set -- /fsx/data/runs/x.yaml  # the job's arguments "
                                                                   "(python -m training remote)"]
    assert "argv" not in legacy and "argv" not in job_description(request, "v0.0.43")
    assert legacy["partition"] == "gpu-g4dn12xl"
    newer = job_description(request, "v0.0.43")
    assert newer["nodes"] == "2" and newer["time_limit"] == {"set": True, "infinite": False, "number": 720}
    assert newer["shared"] == ["none"] and newer["open_mode"] == ["APPEND"] and newer["environment"] == ["PATH=/usr/bin"]
    assert (newer["kill_warning_signal"], newer["kill_warning_delay"]["number"], newer["kill_warning_flags"]) == \
        ("USR1", 600, ["BATCH_JOB"])
    assert newer["flags"] == ["KILL_INVALID_DEPENDENCY"] and newer["wait_all_nodes"] is True


def test_the_prepare_array_keeps_its_array_and_whole_nodes(chain):
    parts = next(job for job in chain if job.label == "prepare-parts")
    assert parts.after == ()
    options = job_options(replace(parts, after=("arrival",)), REPO, "/fsx/data/runs/x/logs", {"arrival": "7"})
    assert options["array"] == "0-1" and "exclusive" in options and options["exclusive"] is None
    assert options["dependency"] == "afterok:7" and options["kill-on-invalid-dep"] == "yes"
    assert options["output"] == "/fsx/data/runs/x/logs/%x_%j.out"



def test_the_arrival_job_outlives_its_wait_and_the_chain_waits_for_it(chain):
    """submit_chain's own first job waits at most ARRIVAL_MINUTES for the config: its time limit is longer, or
    Slurm would end it before it could say that the config never came."""
    from training.remote.jobs import ARRIVAL_MINUTES, submit_chain

    class Recorder:
        def __init__(self) -> None:
            self.sent: list[JobRequest] = []

        def submit(self, request: JobRequest) -> str:
            self.sent.append(request)
            return str(len(self.sent))

    api = Recorder()
    done = submit_chain(api, chain[:2], bundle=REPO, slurm_dir="/apps/scdino/slurm", run="/fsx/data/runs/x",
                        config="/fsx/data/runs/x.yaml", environment={})
    arrival = api.sent[0].options
    assert arrival["job-name"] == "scdino-arrival" and arrival["partition"] == "gpu-g4dn12xl"
    assert minutes(arrival["time"]) > ARRIVAL_MINUTES
    assert [job.after for job in done] == [(), ("arrival",), ("prepare-parts",)]
    assert api.sent[1].options["dependency"] == "afterok:1"

def test_an_sbatch_option_without_a_rest_field_is_refused_naming_it():
    request = JobRequest("#!/bin/bash\n", options={"job-name": "scdino-x", "mail-user": "someone"})
    with pytest.raises(UserError, match="sbatch option --mail-user .*job scdino-x.* has no REST field"):
        job_description(request, "v0.0.43")


class _FakeSlurmrestd(http.server.BaseHTTPRequestHandler):
    """A stand-in for a Slurm >= 23.02 slurmrestd (none runs here: Debian 12 packages 22.05): it serves an
    OpenAPI document whose v0.0.43 job description lacks the fields of warning signals, and records what
    reaches /job/submit and which paths were asked with which token."""

    received: list[dict] = []
    asked: list[tuple[str, str]] = []
    document = {"paths": {f"/slurm/{v}/job/submit": {} for v in ("v0.0.41", "v0.0.42", "v0.0.43")}
                | {"/slurmdb/v0.0.43/jobs": {}},
                "components": {"schemas": {"v0.0.43_job_desc_msg": {"properties": {
                    name: {} for name in ("script", "argv", "environment", "current_working_directory", "name",
                                          "partition", "cpus_per_task", "standard_output", "time_limit")}}}}}

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.asked.append((self.path, self.headers.get("X-SLURM-USER-TOKEN", "")))
        self._answer(200, self.document)

    def do_POST(self):  # noqa: N802
        self.received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self._answer(200, {"job_id": 42})

    def _answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def newer_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeSlurmrestd)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _FakeSlurmrestd.received.clear()
    _FakeSlurmrestd.asked.clear()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_the_newest_known_version_is_used_and_a_field_the_server_lacks_is_refused(newer_server):
    api = SlurmRest(newer_server, "token")
    assert api.offered() == ["v0.0.41", "v0.0.42", "v0.0.43"] and api.version == "v0.0.43"
    simple = JobRequest("#!/bin/bash\n", ("a.yaml",), {"PATH": "/bin"}, "/tmp",
                        {"job-name": "scdino-knn", "cpus-per-task": "12", "time": "01:00:00"})
    assert api.submit(simple) == "42"
    sent = _FakeSlurmrestd.received[-1]
    assert set(sent) == {"job"} and sent["job"]["cpus_per_task"] == 12
    assert sent["job"]["script"].startswith("#!/bin/bash\nset -- a.yaml  #")
    warned = JobRequest("#!/bin/bash\n", options={"job-name": "scdino-pretrain", "signal": "B:USR1@600"})
    with pytest.raises(RestError, match="v0.0.43 .* has no job field kill_warning_signal, kill_warning_delay"):
        api.submit(warned)
    assert len(_FakeSlurmrestd.received) == 1, "nothing was sent"


@pytest.fixture
def aws(moto_endpoint, monkeypatch):
    for key, value in {**CREDENTIALS, "AWS_ENDPOINT_URL": moto_endpoint}.items():
        monkeypatch.setenv(key, value)
    s3 = boto3.client("s3", region_name="us-west-2")
    s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    yield s3
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        for item in page.get("Contents", []):
            s3.delete_object(Bucket=BUCKET, Key=item["Key"])
    s3.delete_bucket(Bucket=BUCKET)


def record_at(path: Path, *, account: str = ACCOUNT, secret: str = "arn:aws:secretsmanager:us-west-2:"
              "123456789012:secret:none") -> Path:
    from stacks.deployment import Deployment, resolve, save

    context = {"region": "us-west-2", "network.availability_zone": "us-west-2a"}
    outputs = {"scdino-storage": {"BucketName": BUCKET},
               "scdino-cluster": {"HeadNodeInstanceId": "i-0123456789abcdef0", "RestTokenSecretArn": secret}}
    save(Deployment.of(resolve(context), context, account).with_outputs(outputs), path)
    return path


def one_error(capsys) -> str:
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, errors
    return errors[0]


def test_no_deployment_recorded_is_one_line(tmp_path, capsys):
    assert main(["remote", "status", "runs/x", "--deployment", str(tmp_path / "none.json")]) == 2
    assert "no deployment recorded at" in one_error(capsys)


def test_credentials_of_another_account_or_another_region_are_one_line(aws, tmp_path, capsys):
    record = record_at(tmp_path / "deployment.json", account="210987654321")
    assert main(["remote", "status", "runs/x", "--deployment", str(record)]) == 2
    line = one_error(capsys)
    assert f"credentials are for account {ACCOUNT}" in line and "in account 210987654321 (us-west-2)" in line
    assert main(["remote", "status", "runs/x", "--deployment", str(record), "--region", "eu-west-1"]) == 2
    assert "--region eu-west-1" in one_error(capsys)


def test_status_reads_the_run_folder_when_the_rest_api_is_out_of_reach(aws, tmp_path, capsys):
    """A run whose jobs Slurm may have forgotten, with no tunnel open: each step from the bucket."""
    from training.remote.jobs import Submission, Submitted

    secret = boto3.client("secretsmanager", region_name="us-west-2").create_secret(
        Name="rest-token", SecretString=json.dumps({"token": "a.b.c"}))["ARN"]
    record = record_at(tmp_path / "deployment.json", secret=secret)
    jobs = (Submitted("arrival", "11", "scdino-arrival"), Submitted("prepare", "12", "scdino-prepare", ("arrival",)),
            Submitted("mean-std", "13", "scdino-mean-std", ("prepare",)),
            Submitted("pretrain", "14", "scdino-pretrain", ("mean-std",)))
    submission = Submission("/fsx/data/runs/r1", "/fsx/data/runs/r1.yaml", "v0.0.38", "http://127.0.0.1:6820",
                            "2026-11-27T00:00:00Z", jobs)
    aws.put_object(Bucket=BUCKET, Key="data/runs/r1.jobs.json", Body=submission.to_json().encode())
    aws.put_object(Bucket=BUCKET, Key="data/runs/r1/timings.json", Body=b'{"prepare": 4.2, "mean-std": 1.5}')
    aws.put_object(Bucket=BUCKET, Key="data/runs/r1/logs/scdino-pretrain_14.out",
                   Body=b"starting\nepoch 1/2 loss 9.1\nepoch 2/2 loss 8.7\n")
    closed = f"http://127.0.0.1:{free_port()}"
    assert main(["remote", "status", "runs/r1", "--deployment", str(record), "--endpoint", closed, "--lines", "2"]) == 0
    out = capsys.readouterr().out
    assert "prepare                12  COMPLETED (from the run folder)  4 s" in out
    assert "arrival                11  COMPLETED (from the run folder)" in out, "it came before a completed job"
    assert "pretrain               14  unknown" in out and "| epoch 2/2 loss 8.7" in out and "starting" not in out
    assert f"no Slurm REST API answers at {closed}" in out and "check that slurmrestd runs there" in out



def test_status_takes_a_forgotten_job_as_completed_only_when_a_job_that_waited_for_it_completed(aws):
    """Two channel combinations' chains side by side: one finished, the other's job failed and Slurm forgot it.
    The finished chain proves its own jobs and the shared ones (afterok), not the other chain's; a
    combination's step is not timed in the parent run's timings.json."""
    from training.remote.bucket import RunFolder
    from training.remote.commands import describe
    from training.remote.jobs import Submission, Submitted

    aws.put_object(Bucket=BUCKET, Key="data/runs/r4/timings.json", Body=b'{"mean-std": 1.5, "knn": 9.0}')
    folder = RunFolder(aws, BUCKET, "data", "/fsx/data", "/fsx/data/runs/r4")
    jobs = (Submitted("arrival", "21", "scdino-arrival"), Submitted("mean-std", "22", "scdino-mean-std", ("arrival",)),
            Submitted("knn:0", "23", "scdino-knn-0", ("mean-std",)), Submitted("knn:01", "24", "scdino-knn-01",
                                                                             ("mean-std",)))
    record = Submission("/fsx/data/runs/r4", "/fsx/data/runs/r4.yaml", "v0.0.38", "http://127.0.0.1:6820",
                        "2026-11-27T00:00:00Z", jobs)
    forgotten = "forgotten by Slurm"
    lines, ended, failed = describe(folder, record, {"arrival": forgotten, "mean-std": forgotten, "knn:0": forgotten,
                                                     "knn:01": "COMPLETED"}, {}, 0)
    assert "  arrival                21  COMPLETED (from the run folder)" in lines
    assert "  mean-std               22  COMPLETED (from the run folder)  2 s" in lines
    assert "  knn:0                  23  forgotten by Slurm" in lines, "knn:01 did not wait for it"
    assert "  knn:01                 24  COMPLETED" in lines
    assert ended and not failed


def test_each_look_of_status_reads_the_token_again_and_the_openapi_document_once(aws, newer_server, tmp_path):
    """status --follow looks every few seconds: the head node's renewed token each time, but not the server's
    OpenAPI document again (hundreds of kilobytes through the SSM tunnel)."""
    from training.remote.commands import job_states
    from training.remote.jobs import Submission, Submitted
    from training.remote.target import aws_session, load_target

    secrets = boto3.client("secretsmanager", region_name="us-west-2")
    secret = secrets.create_secret(Name="rest-token-looks", SecretString=json.dumps({"token": "first.b.c"}))["ARN"]
    target = load_target(record_at(tmp_path / "deployment.json", secret=secret), endpoint=newer_server,
                         cluster_data=None, bundle="/apps/scdino", region=None)
    session = aws_session(target)
    record = Submission("/fsx/data/runs/r5", "/fsx/data/runs/r5.yaml", "v0.0.43", newer_server,
                        "2026-11-27T00:00:00Z", (Submitted("knn", "42", "scdino-knn"),))
    states, note, api = job_states(target, session, record)
    assert (states, note) == ({"knn": "forgotten by Slurm"}, "")
    secrets.put_secret_value(SecretId=secret, SecretString=json.dumps({"token": "renewed.b.c"}))
    states, note, api = job_states(target, session, record, api)
    assert (states, note) == ({"knn": "forgotten by Slurm"}, "")
    asked = _FakeSlurmrestd.asked
    assert [path for path, _ in asked].count("/openapi/v3") == 1
    assert [token for path, token in asked if path.endswith("/ping")] == ["first.b.c", "renewed.b.c"]
    assert [token for path, token in asked if path.endswith("/job/42")] == ["first.b.c", "renewed.b.c"]

def test_profile_with_a_run_that_has_no_checkpoint_is_one_line_and_submits_nothing(aws, tmp_path, capsys):
    """`remote submit --profile RUN` looks for RUN's checkpoint in the bucket before it uploads or submits: a run
    that is not there, and one whose pretraining saved nothing yet, are each one line. The deployment's token
    secret does not exist, so a submission that went past the check stops at reading it instead."""
    record = record_at(tmp_path / "deployment.json")
    config = tmp_path / "new-plates.yaml"
    config.write_text("run: {output_dir: /fsx/data/runs/new-plates}\ningest: {table: /fsx/data/screen/load_data.csv}\n")
    aws.put_object(Bucket=BUCKET, Key="data/runs/half/metrics.jsonl", Body=b'{"epoch": 0}\n')
    submit = ["remote", "submit", "--config", str(config), "--deployment", str(record), "--endpoint",
              f"http://127.0.0.1:{free_port()}", "--profile"]
    assert main([*submit, "runs/never"]) == 2
    assert one_error(capsys) == (f"error: --profile runs/never: no checkpoint s3://{BUCKET}/data/runs/never/checkpoints/"
                                 "checkpoint.pth (on the cluster /fsx/data/runs/never/checkpoints/checkpoint.pth): "
                                 "name a finished run's folder (runs/NAME, under /fsx/data) or a checkpoint file (*.pth)")
    assert main([*submit, "/fsx/data/runs/half/"]) == 2
    assert "the run has no checkpoint s3://" in one_error(capsys)
    assert main([*submit, "runs/half/checkpoints/checkpoint_0005.pth"]) == 2
    assert f"no checkpoint s3://{BUCKET}/data/runs/half/checkpoints/checkpoint_0005.pth" in one_error(capsys)
    listed = aws.list_objects_v2(Bucket=BUCKET).get("Contents", [])
    assert [item["Key"] for item in listed] == ["data/runs/half/metrics.jsonl"], "nothing was uploaded"
    aws.put_object(Bucket=BUCKET, Key="data/runs/half/checkpoints/checkpoint.pth", Body=b"saved")
    assert main([*submit, "runs/half"]) == 2
    assert "cannot read the REST API's token" in one_error(capsys), "past the check, on to the REST API's token"


def test_a_run_that_does_not_exist_is_one_line(aws, tmp_path, capsys):
    record = record_at(tmp_path / "deployment.json")
    assert main(["remote", "fetch", "runs/never", "--deployment", str(record)]) == 2
    assert "no run at s3://scdino-remote-unit/data/runs/never/" in one_error(capsys)
    assert main(["remote", "cancel", "runs/never", "--deployment", str(record)]) == 2
    assert "no submission record" in one_error(capsys)


def test_fetch_continues_an_interrupted_download_and_skips_what_is_there(aws, tmp_path, capsys, monkeypatch):
    from training.remote import bucket

    monkeypatch.setattr(bucket, "PROGRESS_BYTES", 1024)
    record = record_at(tmp_path / "deployment.json")
    big = bytes(range(256)) * 4096  # 1 MiB
    aws.put_object(Bucket=BUCKET, Key="data/runs/r2/profiles/cells.h5ad", Body=big)
    aws.put_object(Bucket=BUCKET, Key="data/runs/r2/report.html", Body=b"<html>report</html>")
    aws.put_object(Bucket=BUCKET, Key="data/runs/r2/plots/umap.png", Body=b"png")
    into = tmp_path / "here"
    etag = aws.head_object(Bucket=BUCKET, Key="data/runs/r2/profiles/cells.h5ad")["ETag"].strip('"')
    (into / "profiles").mkdir(parents=True)
    (into / "profiles" / "cells.h5ad.part").write_bytes(big[:300_000])  # an interrupted download
    (into / "profiles" / "cells.h5ad.part-etag").write_text(etag)
    args = ["remote", "fetch", "runs/r2", "--deployment", str(record), "--what", "report,profiles", "--into", str(into)]
    assert main(args) == 0
    assert (into / "profiles" / "cells.h5ad").read_bytes() == big and not (into / "plots").exists()
    assert f"2 file(s) downloaded ({len(big) - 300_000 + 19} bytes)" in capsys.readouterr().err
    assert main(args) == 0
    assert "0 file(s) downloaded (0 bytes), 2 already here" in capsys.readouterr().err
    assert main([*args[:-4], "--what", "reports", "--into", str(into)]) == 2
    assert "--what reports: choose from report, knn, profiles" in one_error(capsys)



def test_fetch_skips_a_multipart_object_whose_stored_sha256_matches(aws, tmp_path, capsys):
    """A multipart upload's ETag is no MD5 of the content: a file already here is the object when its SHA-256 is
    the one the uploader stored (training/upload/s3.py); one without it (as FSx's export writes) comes again."""
    import hashlib

    from boto3.s3.transfer import TransferConfig

    record = record_at(tmp_path / "deployment.json")
    data = bytes(range(256)) * (6 * 4096)  # 6 MiB: two parts of 5 MiB and 1 MiB
    source = tmp_path / "upload.bin"
    source.write_bytes(data)
    parts = TransferConfig(multipart_threshold=5 * 2**20, multipart_chunksize=5 * 2**20)
    aws.upload_file(str(source), BUCKET, "data/runs/r3/profiles/cells.h5ad", Config=parts,
                    ExtraArgs={"Metadata": {"sha256": hashlib.sha256(data).hexdigest()}})
    aws.upload_file(str(source), BUCKET, "data/runs/r3/report.html", Config=parts)
    assert "-" in aws.head_object(Bucket=BUCKET, Key="data/runs/r3/profiles/cells.h5ad")["ETag"]
    into = tmp_path / "here"
    args = ["remote", "fetch", "runs/r3", "--deployment", str(record), "--what", "report,profiles", "--into", str(into)]
    assert main(args) == 0
    assert "2 file(s) downloaded" in capsys.readouterr().err
    assert (into / "profiles" / "cells.h5ad").read_bytes() == data
    assert main(args) == 0
    assert f"1 file(s) downloaded ({len(data)} bytes), 1 already here" in capsys.readouterr().err

def test_the_tunnel_is_an_ssm_port_forward_to_the_head_node(tmp_path, capsys):
    record = record_at(tmp_path / "deployment.json")
    assert main(["remote", "tunnel", "--print", "--deployment", str(record)]) == 0
    assert capsys.readouterr().out.split() == [
        "aws", "ssm", "start-session", "--region", "us-west-2", "--target", "i-0123456789abcdef0", "--document-name",
        "AWS-StartPortForwardingSession", "--parameters", "portNumber=6820,localPortNumber=6820"]
