"""`python -m stacks.deployment images [--prune]` against an EC2- and SSM-compatible server (moto, server mode,
on loopback): boto3's real request and pagination code runs, and moto keeps images, snapshots, instances,
launch templates and parameters as EC2 and SSM do (an image's snapshot outlives its deregistration; a
snapshot an image still uses cannot be deleted). The images stand in for Packer's: registered and tagged
as ami/gpu-image.pkr.hcl tags them (no AMI can be built here)."""

from __future__ import annotations

import time
from pathlib import Path

import boto3
import pytest

from stacks import deployment
from stacks.deployment import Deployment, main, resolve
from stacks.shared.constants import BUILD_TAG_KEY

pytestmark = pytest.mark.slow  # a server in this process, and three seconds of builds (about 10 s in all)

REGION = "us-east-1"
CONTEXT = {"region": REGION, "prefix": "team-a"}
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION}


@pytest.fixture
def aws(moto_endpoint, monkeypatch):
    for key, value in {**CREDENTIALS, "AWS_ENDPOINT_URL": moto_endpoint}.items():
        monkeypatch.setenv(key, value)
    return boto3.client("ec2", region_name=REGION), boto3.client("ssm", region_name=REGION)


@pytest.fixture
def record(tmp_path) -> tuple[Path, Deployment]:
    path = tmp_path / "deployment.json"
    found = Deployment.of(resolve(CONTEXT), CONTEXT)
    deployment.save(found, path)
    return path, found


def run(capsys, path: Path, *argv: str) -> tuple[int, list[str], str]:
    code = main(["images", "--deployment", str(path), *argv])
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err


def register(ec2, name: str, prefix: str) -> tuple[str, str]:
    """An image as Packer leaves it: registered with a root snapshot, tagged with the build tag (id, snapshot)."""
    image_id = ec2.register_image(Name=name, RootDeviceName="/dev/xvda")["ImageId"]
    (mapping,) = ec2.describe_images(ImageIds=[image_id])["Images"][0]["BlockDeviceMappings"]
    ec2.create_tags(Resources=[image_id, mapping["Ebs"]["SnapshotId"]],
                    Tags=[{"Key": BUILD_TAG_KEY, "Value": prefix}])
    return image_id, mapping["Ebs"]["SnapshotId"]


def exists(ec2, image_id: str, snapshot: str) -> tuple[bool, bool]:
    images = ec2.describe_images(Filters=[{"Name": "image-id", "Values": [image_id]}])["Images"]
    snapshots = ec2.describe_snapshots(Filters=[{"Name": "snapshot-id", "Values": [snapshot]}])["Snapshots"]
    return bool(images), bool(snapshots)


def test_prune_keeps_the_newest_and_every_image_in_use_and_removes_the_rest_with_their_snapshots(
        aws, record, capsys):
    ec2, ssm = aws
    path, found = record
    # Three seconds of builds, names ordered against time across them (within one second the name's Packer
    # timestamp orders): the newest first is f, e, d, c, b, a only if creation time comes first.
    built = {}
    for group in (("z-a", "z-b", "z-c"), ("y-d", "y-e"), ("x-f",)):
        for name in group:
            built[name[-1]] = register(ec2, f"scdino-gpu-{name}", "team-a")
        time.sleep(1.05)
    other = register(ec2, "scdino-gpu-other", "team-b")  # another deployment's: never touched
    ec2.create_launch_template(LaunchTemplateName="team-a-queue", LaunchTemplateData={"ImageId": built["b"][0]})
    instance = ec2.run_instances(ImageId=built["c"][0], MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    ssm.put_parameter(Name=found.ami_parameter, Value=built["e"][0], Type="String")

    code, lines, err = run(capsys, path)
    verdicts = {line.split()[0]: line.split("  ", 3)[3] for line in lines}
    assert code == 0 and [line.split()[0] for line in lines] == [built[k][0] for k in "fedcba"]
    assert verdicts == {
        built["f"][0]: "kept: one of the 2 newest",
        built["e"][0]: f"kept: the AMI parameter {found.ami_parameter} names it",
        built["d"][0]: "not kept (--prune removes it)",
        built["c"][0]: f"kept: instance {instance} runs it",
        built["b"][0]: "kept: launch template team-a-queue launches it",
        built["a"][0]: "not kept (--prune removes it)"}
    assert "6 image(s) tagged scdino:image-build=team-a in us-east-1: 0 deregistered" in err
    assert all(exists(ec2, *image) == (True, True) for image in built.values())  # a listing removes nothing

    code, lines, err = run(capsys, path, "--prune")
    assert code == 0 and "2 deregistered with 2 snapshot(s), 0 more not kept" in err
    for key, image in built.items():
        assert exists(ec2, *image) == ((False, False) if key in "ad" else (True, True)), key
    assert exists(ec2, *other) == (True, True)

    # After a destroy: no parameter, no instance, no launch template; --keep 0 removes every image left.
    ssm.delete_parameter(Name=found.ami_parameter)
    ec2.terminate_instances(InstanceIds=[instance])
    ec2.delete_launch_template(LaunchTemplateName="team-a-queue")
    code, lines, err = run(capsys, path, "--prune", "--keep", "0")
    assert code == 0 and len(lines) == 4 and all(line.endswith("deregistered, 1 snapshot(s) deleted") for line in lines)
    assert all(exists(ec2, *image) == (False, False) for image in built.values())
    assert exists(ec2, *other) == (True, True)
    code, lines, err = run(capsys, path, "--prune")
    assert (code, lines) == (0, []) and "0 image(s) tagged scdino:image-build=team-a" in err


def test_print_shows_the_listing_call_and_asks_nothing(record, capsys, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens: a call would fail
    code, lines, err = run(capsys, record[0], "--print")
    assert (code, err) == (0, "")
    assert lines == ["aws ec2 describe-images --region us-east-1 --owners self --filters "
                     "Name=tag:scdino:image-build,Values=team-a --query "
                     "'sort_by(Images,&CreationDate)[].[ImageId,CreationDate,Name]' --output text"]


@pytest.mark.parametrize("argv, message", [
    (["--keep", "-1"], "error: --keep -1: give how many of the newest images to keep, 0 or more"),
    (["--region", "eu-west-1"], "error: deployment.json records the deployment team-a in us-east-1, but this "
                                "command names region eu-west-1"),
])
def test_bad_input_is_one_line(record, capsys, argv, message):
    code, lines, err = run(capsys, record[0], *argv)
    assert (code, lines) == (2, []) and err.startswith(message) and err.count("\n") == 1


def test_an_unreachable_endpoint_is_one_line(record, capsys, monkeypatch):
    for key, value in {**CREDENTIALS, "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1"}.items():
        monkeypatch.setenv(key, value)
    code, lines, err = run(capsys, record[0], "--prune")
    assert (code, lines) == (2, []) and err.startswith("error: images of team-a in us-east-1: ")
    assert err.count("\n") == 1


def test_without_a_record_it_says_how_to_make_one(tmp_path, capsys):
    code, lines, err = run(capsys, tmp_path / "none.json")
    assert code == 2 and err.startswith(f"error: no deployment record {tmp_path / 'none.json'}: `images` reaches")
