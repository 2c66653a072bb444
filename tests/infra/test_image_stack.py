"""Image stack: a KMS-encrypted CodeBuild project that runs Packer on ami/ and publishes the AMI id."""

from __future__ import annotations

import json

from infra.synth_helpers import one


def _project(synth) -> dict:
    return one(synth.json["image"], "AWS::CodeBuild::Project")["Properties"]


def test_project_is_encrypted_with_a_rotating_key(synth):
    project = _project(synth)
    assert project["EncryptionKey"] == {"Fn::GetAtt": [_key_id(synth), "Arn"]}
    synth.templates["image"].has_resource_properties("AWS::KMS::Key", {"EnableKeyRotation": True})


def _key_id(synth) -> str:
    (key_id,) = [k for k, v in synth.json["image"]["Resources"].items() if v["Type"] == "AWS::KMS::Key"]
    return key_id


def test_source_is_the_ami_folder_asset(synth):
    source = _project(synth)["Source"]
    assert source["Type"] == "S3"
    assert source["Location"]["Fn::Join"][1][-1].endswith(".zip")


def _build_spec(synth) -> dict:
    """The buildspec JSON, with the cross-stack subnet reference replaced by a marker."""
    spec = _project(synth)["Source"]["BuildSpec"]
    parts = spec["Fn::Join"][1] if isinstance(spec, dict) else [spec]
    return json.loads("".join(part if isinstance(part, str) else "<subnet>" for part in parts))


def test_build_spec_installs_pinned_packer_builds_and_publishes(synth):
    phases = _build_spec(synth)["phases"]
    install, build = phases["install"]["commands"], phases["build"]["commands"]
    assert any("sha256sum -c" in command for command in install)
    assert build[1] == "packer init ."
    (packer_build,) = [command for command in build if command.startswith("packer build")]
    for var in ('pcluster_version=3.16.1', 'subnet_id=<subnet>', 'ssh_source_cidr=${BUILDER_IP}/32'):
        assert f'-var "{var}"' in packer_build, var
    assert build[-2].startswith("aws ssm put-parameter --overwrite")
    env = {v["Name"]: v["Value"] for v in _project(synth)["Environment"]["EnvironmentVariables"]}
    assert env["AMI_PARAMETER"] == "/scdino/ami/gpu"
    assert env["PACKER_VERSION"].count(".") == 2


def test_packer_gets_ec2_actions_and_write_on_its_parameter_only(synth):
    policy = one(synth.json["image"], "AWS::IAM::Policy")["Properties"]["PolicyDocument"]["Statement"]
    ec2 = [s for s in policy if isinstance(s["Action"], list) and "ec2:RunInstances" in s["Action"]]
    assert len(ec2) == 1 and not any(a in ("ec2:*", "*") for a in ec2[0]["Action"])
    ssm = [s for s in policy if "ssm:PutParameter" in s["Action"]]
    assert len(ssm) == 1 and ssm[0]["Resource"]["Fn::Join"][1][-1] == {"Ref": "AmiIdParameter4C94AE68"}


def test_ami_parameter_exists_for_the_cluster_to_read(synth):
    synth.templates["image"].has_resource_properties("AWS::SSM::Parameter", {
        "Name": "/scdino/ami/gpu", "Type": "String"})
