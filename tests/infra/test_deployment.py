"""One deployment, one region: `python -m stacks.deployment` records a deploy and every later command reads it.

No AWS call is made. The records are built from outputs files in the CDK CLI's `--outputs-file` format
(tests/infra/data/, the outputs each stack declares); the command lines are those the code builds
(`--print`); the deploy and destroy runs go through a stand-in for `npx` (a real deploy needs an AWS
account); the recorded context is handed to the real, pinned CDK CLI offline (`cdk ls`).
"""

from __future__ import annotations

import io
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from stacks import deployment
from stacks.deployment import Deployment, main, resolve

DATA = Path(__file__).resolve().parent / "data"
TEAM_A = {"region": "us-west-2", "network.availability_zone": "us-west-2a", "prefix": "team-a"}
DEPLOY = ["-c", "region=us-west-2", "-c", "network.availability_zone=us-west-2a", "-c", "prefix=team-a"]


def outputs(backend: str) -> dict[str, dict[str, str]]:
    return json.loads((DATA / f"cdk-outputs-{backend}.json").read_text())


def write_record(path: Path, backend: str = "parallelcluster") -> Deployment:
    context = {**TEAM_A, "backend": backend} if backend == "pcs" else dict(TEAM_A)
    record = Deployment.of(resolve(context), context).with_outputs(outputs(backend))
    deployment.save(record, path)
    return record


@pytest.fixture(autouse=True)
def no_real_cli(tmp_path, monkeypatch):
    """Guards: no test writes the repository's record, and none reaches the real `npx` or `aws` (they would
    call AWS): both are, on PATH, scripts that fail (tests that run a command put their stand-in first)."""
    monkeypatch.setattr(deployment, "DEFAULT_RECORD", tmp_path / "default-deployment.json")
    guard = tmp_path / "guard"
    guard.mkdir()
    for name in ("npx", "aws"):
        (guard / name).write_text(f"#!/bin/sh\necho 'a test reached the real {name}' >&2\nexit 99\n")
        (guard / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{guard}{os.pathsep}{os.environ['PATH']}")


def run_main(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0]


def test_the_record_holds_region_names_account_and_the_outputs_of_a_deploy(tmp_path):
    path = tmp_path / "deployment.json"
    record = write_record(path)
    saved = json.loads(path.read_text())
    assert (saved["format"], saved["region"], saved["prefix"], saved["backend"]) == (1, "us-west-2", "team-a",
                                                                                     "parallelcluster")
    assert saved["account"] == "111122223333"  # read from an ARN among the outputs (no account setting)
    assert saved["stacks"] == {"network": "team-a-network", "storage": "team-a-storage", "image": "team-a-image",
                               "cluster": "team-a-cluster"}
    assert (saved["cluster_name"], saved["ami_parameter"], saved["login_node_tag"]) == ("team-a-hpc",
                                                                                        "/team-a/ami/gpu", "")
    assert saved["resources"] == {
        "bucket": "team-a-storage-databuckete3889a50-x7k2m9p4q1r8", "file_system_id": "fs-0123456789abcdef0",
        "image_project": "ImageBuild30B7C98D-Zr4Xk8Lm2Np6", "head_node_instance_id": "i-0fedcba9876543210",
        "dashboard": "team-a-hpc-gpus-and-training",
        "alarm_topic_arn": "arn:aws:sns:us-west-2:111122223333:team-a-cluster-AlarmsTopic1A2B3C4D-U8I9O0P1A2S3"}
    assert list(saved["context"].items())[:2] == [("region", "us-west-2"), ("prefix", "team-a")]
    assert saved["outputs"] == outputs("parallelcluster")
    assert deployment.load(path) == record


def test_a_pcs_record_finds_its_login_nodes_by_tag_and_keeps_earlier_outputs(tmp_path):
    """PCS deploys the image before the cluster: the second deploy's outputs join the first's."""
    context = {**TEAM_A, "backend": "pcs"}
    first = {name: values for name, values in outputs("parallelcluster").items() if "storage" in name}
    record = Deployment.of(resolve(context), context).with_outputs(first).with_outputs(outputs("pcs"))
    assert record.backend == "pcs" and record.ami_parameter == "/team-a/ami/gpu-pcs"
    assert record.login_node_tag == "scdino:node-group=team-a-hpc/login"
    assert record.resources["pcs_cluster_id"] == "pcs_0a1b2c3d4e"
    assert record.resources["bucket"].startswith("team-a-storage-databucket")
    assert "head_node_instance_id" not in record.resources


@pytest.mark.parametrize("argv, expected", [
    (["destroy"], "npx cdk destroy --all -c region=us-west-2 -c prefix=team-a "
                  "-c network.availability_zone=us-west-2a --force"),
    (["destroy", "cluster", "team-a-image"], "npx cdk destroy team-a-cluster team-a-image -c region=us-west-2 "
                                            "-c prefix=team-a -c network.availability_zone=us-west-2a --force"),
    (["update", "-c", "cluster.custom_ami=ssm", "--force"],
     "npx cdk deploy team-a-cluster --outputs-file {outputs} -c region=us-west-2 -c prefix=team-a "
     "-c network.availability_zone=us-west-2a -c cluster.custom_ami=ssm --force"),
    (["deploy", "--no-rollback", "--", "--require-approval", "never"],
     "npx cdk deploy --all --outputs-file {outputs} -c region=us-west-2 -c prefix=team-a "
     "-c network.availability_zone=us-west-2a --no-rollback --require-approval never"),
    (["image"], "aws codebuild start-build --region us-west-2 --project-name ImageBuild30B7C98D-Zr4Xk8Lm2Np6"),
    (["image", "--published"], "aws ssm get-parameter --region us-west-2 --name /team-a/ami/gpu "
                               "--query Parameter.Value --output text"),
    (["ssm"], "aws ssm start-session --region us-west-2 --target i-0fedcba9876543210"),
    (["ssm", "--region", "us-west-2", "--target", "i-0123456789abcdef0"],
     "aws ssm start-session --region us-west-2 --target i-0123456789abcdef0"),
])
def test_later_command_lines_carry_the_recorded_region_and_context(tmp_path, capsys, argv, expected):
    path = tmp_path / "deployment.json"
    write_record(path)
    before = path.read_text()
    code, out, _ = run_main(capsys, argv[0], "--print", "--deployment", str(path), *argv[1:])
    assert code == 0
    assert out.strip() == expected.format(outputs=tmp_path / ".deployment-outputs.json")
    assert path.read_text() == before, "--print records nothing"


def test_a_pcs_session_finds_a_running_login_node_in_the_recorded_region(tmp_path, capsys):
    path = tmp_path / "deployment.json"
    write_record(path, "pcs")
    code, out, _ = run_main(capsys, "ssm", "--print", "--deployment", str(path))
    assert code == 0
    session, _, finder = out.strip().partition(' "$(')
    assert session == "aws ssm start-session --region us-west-2 --target"
    words = shlex.split(finder.removesuffix(')"'))
    assert words[:5] == ["aws", "ec2", "describe-instances", "--region", "us-west-2"]
    assert "Name=tag:scdino:node-group,Values=team-a-hpc/login" in words


def test_recorded_values_print_one_by_one_for_the_shell(tmp_path, capsys):
    path = tmp_path / "deployment.json"
    write_record(path)
    for name, value in (("region", "us-west-2"), ("bucket", "team-a-storage-databuckete3889a50-x7k2m9p4q1r8"),
                        ("cluster_name", "team-a-hpc"), ("account", "111122223333")):
        assert run_main(capsys, "show", name, "--deployment", str(path))[:2] == (0, f"{value}\n")
    code, _, err = run_main(capsys, "show", "pcs_cluster_id", "--deployment", str(path))
    assert code == 2 and "holds no pcs_cluster_id" in one_error_line(err)
    code, _, err = run_main(capsys, "show", "buckett", "--deployment", str(path))
    assert code == 2 and "no value 'buckett'" in one_error_line(err) and "bucket" in err


@pytest.mark.parametrize("argv, named", [
    (["destroy", "-c", "region=us-east-1"], "region us-east-1 (as given)"),
    (["update", "-c", "region=eu-west-1", "-c", "network.availability_zone=eu-west-1a"], "region eu-west-1"),
    (["deploy", "-c", "prefix=team-b"], "prefix team-b (as given)"),
    (["image", "--region", "us-east-1"], "region us-east-1"),
    (["ssm", "--region", "us-east-1"], "region us-east-1"),
])
def test_a_region_or_prefix_other_than_the_records_is_refused_in_one_line(tmp_path, capsys, argv, named):
    path = tmp_path / "deployment.json"
    write_record(path)
    code, out, err = run_main(capsys, *argv, "--print", "--deployment", str(path))
    line = one_error_line(err)
    assert code == 2 and out == ""
    assert "records the deployment team-a in us-west-2" in line and named in line
    assert "leave" in line and "--deployment FILE" in line


def test_a_settings_file_naming_another_region_is_refused_too(tmp_path, capsys):
    path = tmp_path / "deployment.json"
    write_record(path)
    settings = tmp_path / "moved.yaml"
    settings.write_text("region: eu-central-1\nnetwork:\n  availability_zone: eu-central-1a\n")
    code, _, err = run_main(capsys, "update", "-c", f"settings={settings}", "--print", "--deployment", str(path))
    assert code == 2 and f"region eu-central-1 (in {settings})" in one_error_line(err)


def test_destroy_without_a_record_names_the_region_it_would_use_and_asks_for_one(tmp_path, capsys):
    path = tmp_path / "deployment.json"
    code, out, err = run_main(capsys, "destroy", "--print", "--deployment", str(path))
    line = one_error_line(err)
    assert code == 2 and out == ""
    assert "would fall back to cdk.json's region us-east-1" in line and "pass -c region=" in line
    code, out, _ = run_main(capsys, "destroy", "--print", "--deployment", str(path), *DEPLOY)
    assert code == 0 and out.startswith("npx cdk destroy --all -c region=us-west-2 -c prefix=team-a")


@pytest.mark.parametrize("argv", [["update"], ["image"], ["ssm"], ["show"]])
def test_a_later_command_without_a_record_is_one_line(tmp_path, capsys, argv):
    code, _, err = run_main(capsys, *argv, "--print", "--deployment", str(tmp_path / "deployment.json")) \
        if argv != ["show"] else run_main(capsys, "show", "--deployment", str(tmp_path / "deployment.json"))
    assert code == 2
    assert "no deployment record" in one_error_line(err) and "python -m stacks.deployment deploy" in err


@pytest.mark.parametrize("text, named", [("{not json", "is not a deployment record"),
                                         ('{"format": 1, "region": "us-west-2"}', "is not a deployment record"),
                                         ('{"format": 7}', "record format 7")])
def test_a_damaged_record_is_one_line(tmp_path, capsys, text, named):
    path = tmp_path / "deployment.json"
    path.write_text(text)
    code, _, err = run_main(capsys, "destroy", "--print", "--deployment", str(path))
    assert code == 2 and named in one_error_line(err)


def test_a_bad_setting_or_stack_name_is_one_line(tmp_path, capsys):
    path = tmp_path / "deployment.json"
    code, _, err = run_main(capsys, "deploy", "--print", "--deployment", str(path), "-c", "cluster.max_nodes=lots")
    assert code == 2 and "setting cluster.max_nodes" in one_error_line(err)
    code, _, err = run_main(capsys, "deploy", "--print", "--deployment", str(path), "-c", "region")
    assert code == 2 and "-c 'region': give KEY=VALUE, e.g. -c region=us-west-2" in one_error_line(err)
    write_record(path)
    code, _, err = run_main(capsys, "destroy", "clustr", "--print", "--deployment", str(path))
    assert code == 2 and "no stack 'clustr'" in one_error_line(err)


FAKE_NPX = """#!{python}
# Stands in for `npx cdk` because a real deploy or destroy needs an AWS account: it logs its arguments
# and, for a deploy, writes the outputs of the stacks it was given as `cdk deploy --outputs-file` does.
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_CDK_LOG"], "a") as log:
    log.write(json.dumps({{"cwd": os.getcwd(), "args": args}}) + "\\n")
if args[1] == "deploy":
    known = json.load(open(os.environ["FAKE_CDK_OUTPUTS"]))
    chosen = known if "--all" in args else {{name: known[name] for name in args if name in known}}
    only = os.environ.get("FAKE_CDK_ONLY")
    chosen = {{name: values for name, values in chosen.items() if not only or name == only}}
    json.dump(chosen, open(args[args.index("--outputs-file") + 1], "w"))
sys.exit(int(os.environ.get("FAKE_CDK_EXIT", "0")))
"""


@pytest.fixture
def fake_cdk(tmp_path, monkeypatch):
    """`npx` on PATH is the stand-in above; returns the argument lists it was called with."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    npx = bin_dir / "npx"
    npx.write_text(FAKE_NPX.format(python=sys.executable))
    npx.chmod(0o755)
    log = tmp_path / "cdk.log"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_CDK_LOG", str(log))
    monkeypatch.setenv("FAKE_CDK_OUTPUTS", str(DATA / "cdk-outputs-parallelcluster.json"))
    return lambda: [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_a_deploy_that_fails_half_way_is_recorded_and_an_update_keeps_what_it_adds(tmp_path, capsys, monkeypatch,
                                                                                     fake_cdk):
    path = tmp_path / "deployment.json"
    monkeypatch.setenv("FAKE_CDK_ONLY", "team-a-network")
    monkeypatch.setenv("FAKE_CDK_EXIT", "1")
    code, _, err = run_main(capsys, "deploy", "--no-rollback", "--deployment", str(path), *DEPLOY)
    assert code == 1, err
    call = fake_cdk()[-1]
    assert Path(call["cwd"]) == deployment.REPO_ROOT  # where cdk.json is
    assert call["args"][:3] == ["cdk", "deploy", "--all"] and "--no-rollback" in call["args"]
    record = deployment.load(path)
    assert (record.region, record.prefix) == ("us-west-2", "team-a")
    assert list(record.outputs) == ["team-a-network"] and record.resources == {}
    assert not (tmp_path / ".deployment-outputs.json").exists()

    monkeypatch.delenv("FAKE_CDK_ONLY")
    monkeypatch.setenv("FAKE_CDK_EXIT", "0")
    assert run_main(capsys, "deploy", "--deployment", str(path))[0] == 0
    assert deployment.load(path).resources["head_node_instance_id"] == "i-0fedcba9876543210"
    assert run_main(capsys, "update", "-c", "cluster.custom_ami=ssm", "--force", "--deployment", str(path))[0] == 0
    assert run_main(capsys, "update", "--deployment", str(path))[0] == 0
    last = fake_cdk()[-1]["args"]
    assert last[:3] == ["cdk", "deploy", "team-a-cluster"]
    assert "cluster.custom_ami=ssm" in last, "a setting given to update stays for every later deploy"
    assert "region=us-west-2" in last and "prefix=team-a" in last
    assert deployment.load(path).context["cluster.custom_ami"] == "ssm"


@pytest.fixture
def sts(moto_endpoint, monkeypatch):
    """moto's server on loopback answers STS for AWS (destroy asks it whose credentials these are): its first
    credentials are for its default account, MOTO_ACCOUNT; the fixture's function switches to a role's
    credentials in another account, as moto's AssumeRole hands them out."""
    import boto3

    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-west-2", "AWS_ENDPOINT_URL": moto_endpoint}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)

    def as_account(account: str) -> None:
        given = boto3.client("sts", region_name="us-west-2").assume_role(
            RoleArn=f"arn:aws:iam::{account}:role/deployer", RoleSessionName="destroy-test")["Credentials"]
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", given["AccessKeyId"])
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", given["SecretAccessKey"])
        monkeypatch.setenv("AWS_SESSION_TOKEN", given["SessionToken"])

    return as_account


MOTO_ACCOUNT = "123456789012"
RECORDED_ACCOUNT = "111122223333"
"""The account in the ARNs of tests/infra/data's outputs, which the record takes."""


def test_destroy_refuses_credentials_of_another_account_in_one_line_and_runs_nothing(tmp_path, capsys, monkeypatch,
                                                                                   sts, fake_cdk):
    path = tmp_path / "deployment.json"
    record = write_record(path)
    assert record.account == RECORDED_ACCOUNT
    code, _, err = run_main(capsys, "destroy", "--yes", "--deployment", str(path))
    assert code == 2 and fake_cdk() == [] and deployment.load(path) == record
    assert one_error_line(err) == (
        f"error: these AWS credentials are for account {MOTO_ACCOUNT}, but deployment.json records team-a in account "
        f"{RECORDED_ACCOUNT} (us-west-2): nothing was deleted; destroy again with credentials of account "
        f"{RECORDED_ACCOUNT} (AWS_PROFILE, `aws sso login`), or name that account's record (--deployment FILE)")
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    code, _, err = run_main(capsys, "destroy", "--yes", "--deployment", str(path))
    assert code == 2 and fake_cdk() == []
    assert one_error_line(err).startswith("error: no AWS credentials: log in to the account of team-a")


def test_destroy_asks_then_forgets_destroyed_stacks_and_the_record_once_all_are_gone(tmp_path, capsys, monkeypatch,
                                                                                     sts, fake_cdk):
    path = tmp_path / "deployment.json"
    write_record(path)
    sts(RECORDED_ACCOUNT)
    monkeypatch.setattr("sys.stdin", io.StringIO("n\n"))
    code, _, err = run_main(capsys, "destroy", "--deployment", str(path))
    assert code == 1 and "nothing deleted" in err and fake_cdk() == []
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))
    code, out, _ = run_main(capsys, "destroy", "cluster", "image", "--deployment", str(path))
    assert code == 0 and "Delete team-a-cluster, team-a-image in us-west-2 (account 111122223333)?" in out
    assert fake_cdk()[-1]["args"][:4] == ["cdk", "destroy", "team-a-cluster", "team-a-image"]
    record = deployment.load(path)
    assert set(record.outputs) == {"team-a-network", "team-a-storage"} and "bucket" in record.resources
    monkeypatch.setenv("FAKE_CDK_EXIT", "1")  # the storage stack's termination protection stops it
    assert run_main(capsys, "destroy", "--yes", "--deployment", str(path))[0] == 1
    assert deployment.load(path) == record
    monkeypatch.setenv("FAKE_CDK_EXIT", "0")
    code, _, err = run_main(capsys, "destroy", "--yes", "--deployment", str(path))
    assert code == 0 and not path.exists() and "gone from us-west-2" in err


def test_the_record_file_is_ignored_by_git():
    ignored = subprocess.run(["git", "check-ignore", "deployment.json", ".deployment-outputs.json",
                              ".deployment.json.tmp"], cwd=deployment.REPO_ROOT, capture_output=True, text=True)
    assert ignored.stdout.split() == ["deployment.json", ".deployment-outputs.json", ".deployment.json.tmp"]


@pytest.mark.slow
def test_the_recorded_context_takes_the_pinned_cdk_cli_to_the_recorded_region(tmp_path, capsys):
    """The context a later command passes, given to the real CLI offline: every stack in the recorded region
    and named with the recorded prefix, though cdk.json's region is us-east-1."""
    path = tmp_path / "deployment.json"
    write_record(path)
    words = shlex.split(run_main(capsys, "destroy", "--print", "--deployment", str(path))[1])
    assert resolve({}).region == "us-east-1"
    context = [word for i, word in enumerate(words) if word == "-c" or (i and words[i - 1] == "-c")]
    cli = deployment.REPO_ROOT / "node_modules" / ".bin" / "cdk"
    env = {key: value for key, value in os.environ.items() if not key.startswith(("AWS_", "CDK_"))}
    env.update(AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), CDK_DISABLE_VERSION_CHECK="1")
    result = subprocess.run([str(cli), "ls", "--long", "--output", str(tmp_path / "cdk.out"), *context],
                            cwd=deployment.REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    listed = {stack["name"]: stack["environment"]["region"] for stack in yaml.safe_load(result.stdout)}
    assert listed == dict.fromkeys(["team-a-network", "team-a-storage", "team-a-image", "team-a-cluster"],
                                   "us-west-2")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["parallelcluster", "pcs"])
def test_every_output_the_record_reads_is_declared_by_the_stacks(request, backend):
    """The outputs files here hold only outputs the synthesised stacks declare, and the record's names
    (bucket, head node, ...) come from outputs that exist."""
    synth = request.getfixturevalue("synth" if backend == "parallelcluster" else "pcs_synth")
    declared = {stack: set(synth.json[stack].get("Outputs", {})) for stack in ("network", "storage", "image",
                                                                               "cluster")}
    for stack_name, values in outputs(backend).items():
        assert set(values) <= declared[stack_name.removeprefix("team-a-")], stack_name
    wanted = {name for name, (stack, output) in deployment.RESOURCES.items() if output in declared[stack]}
    expected = {"bucket", "file_system_id", "image_project", "dashboard", "alarm_topic_arn", "rest_client_policy"}
    assert wanted == expected | ({"pcs_cluster_id"} if backend == "pcs" else {"head_node_instance_id",
                                                                            "rest_token_secret"})


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["destroy", "cluster"], ["update", "--force"], ["deploy", "--no-rollback"],
                                  ["image"], ["image", "--published"], ["ssm"]])
def test_the_command_lines_built_take_options_their_programs_have(tmp_path, capsys, argv):
    """The same check docs/deploy.md's commands pass: the pinned CDK CLI's --help, the AWS CLI's models."""
    from tests.infra.test_deploy_doc import check

    path = tmp_path / "deployment.json"
    write_record(path)
    code, out, _ = run_main(capsys, *argv, "--print", "--deployment", str(path))
    assert code == 0
    check(shlex.split(out))
