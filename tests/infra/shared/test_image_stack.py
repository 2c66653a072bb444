"""Image stack: a KMS-encrypted CodeBuild project that runs Packer on ami/ and publishes the AMI id."""

from __future__ import annotations

import json
import re

import pytest

from tests.support.cdk_synth import REPO_ROOT, one

pytestmark = pytest.mark.slow


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
    assert build[1] == "packer init ami"
    (packer_build,) = [command for command in build if command.startswith("packer build")]
    for var in ("pcluster_version=3.16.1", "subnet_id=<subnet>", "ssh_source_cidr=${BUILDER_IP}/32",
                "build_tag=scdino"):
        assert f'-var "{var}"' in packer_build, var
    assert " -only=parallelcluster.amazon-ebs.gpu " in packer_build and "pcs_slurm_version" not in packer_build
    assert packer_build.endswith(" ami")
    assert build[-2].startswith("aws ssm put-parameter --overwrite")
    env = {v["Name"]: v["Value"] for v in _project(synth)["Environment"]["EnvironmentVariables"]}
    assert env["AMI_PARAMETER"] == "/scdino/ami/gpu"
    assert env["PACKER_VERSION"].count(".") == 2


def _statements(synth) -> list[dict]:
    return one(synth.json["image"], "AWS::IAM::Policy")["Properties"]["PolicyDocument"]["Statement"]


def _actions(statement: dict) -> list[str]:
    return statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]


def _resources(statement: dict) -> list:
    return statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]


def _ec2_statements(synth) -> list[dict]:
    return [s for s in _statements(synth) if any(a.startswith("ec2:") for a in _actions(s))]


# Where Packer's amazon-ebs builder needs these at all, they must be bound to what it tagged.
DESTRUCTIVE = {"ec2:TerminateInstances", "ec2:StopInstances", "ec2:DeregisterImage", "ec2:DeleteSnapshot"}
# encrypt_boot's copy and Windows/chroot/sharing calls this image build does not make.
NOT_NEEDED = {"ec2:GetPasswordData", "ec2:ModifyImageAttribute", "ec2:ModifySnapshotAttribute",
              "ec2:ModifyInstanceAttribute", "ec2:CopyImage", "ec2:RegisterImage", "ec2:AttachVolume",
              "ec2:DetachVolume", "ec2:CreateVolume", "ec2:DeleteVolume", "ec2:CreateSnapshot"}


def _tag_value(synth) -> str:
    """The value of Packer's build tag, as the buildspec passes it (-var build_tag=...)."""
    (packer_build,) = [c for c in _build_spec(synth)["phases"]["build"]["commands"] if c.startswith("packer build")]
    return re.search(r'-var "build_tag=([^"]+)"', packer_build)[1]


def test_every_ec2_write_is_scoped_by_tag_vpc_or_resource_in_this_region(synth):
    tag = _tag_value(synth)
    for statement in _ec2_statements(synth):
        actions = set(_actions(statement))
        assert not actions & NOT_NEEDED, actions & NOT_NEEDED
        if all(a.startswith("ec2:Describe") for a in actions):
            assert statement["Condition"] == {"StringEquals": {"aws:RequestedRegion": "us-east-1"}}
            continue
        for resource in _resources(statement):
            assert resource != "*", statement
            text = json.dumps(resource)
            assert "arn:aws:ec2:us-east-1:" in text, resource
        if actions & DESTRUCTIVE:
            assert statement["Condition"] == {"StringEquals": {"aws:ResourceTag/scdino:image-build": tag}}


def test_packer_tags_everything_the_role_may_destroy_with_the_build_tag(synth):
    tag = _tag_value(synth)
    template = (REPO_ROOT / "ami" / "gpu-image.pkr.hcl").read_text()
    assert re.search(r'build_tags = \{\n\s+"scdino:image-build" = var\.build_tag\n\s+\}', template)
    for block in ("run_tags", "snapshot_tags"):
        assert re.search(rf"\n\s+{block}\s+= local\.build_tags\n", template), block
    assert "tags = merge(local.build_tags," in template
    assert tag == "scdino"


def test_ssm_write_only_on_the_ami_parameter(synth):
    ssm = [s for s in _statements(synth) if "ssm:PutParameter" in _actions(s)]
    assert len(ssm) == 1 and ssm[0]["Resource"]["Fn::Join"][1][-1] == {"Ref": "AmiIdParameter4C94AE68"}


def test_ami_parameter_is_named_after_the_prefix(synth, demo_synth):
    synth.templates["image"].has_resource_properties("AWS::SSM::Parameter", {
        "Name": "/scdino/ami/gpu", "Type": "String"})
    demo_synth.templates["image"].has_resource_properties("AWS::SSM::Parameter", {"Name": "/scdino-demo/ami/gpu"})


# Root device of the official AMIs, from each distribution's EC2 images (independent of ami/).
ROOT_DEVICES = {"alinux2023": "/dev/xvda", "ubuntu2204": "/dev/sda1", "rhel9": "/dev/sda1"}


def test_packer_launches_with_the_root_device_of_each_os():
    from stacks.shared.settings import SUPPORTED_OSES

    template = (REPO_ROOT / "ami" / "gpu-image.pkr.hcl").read_text()
    block = re.search(r"root_devices = \{\n(.*?)\n  \}", template, re.S)[1]
    devices = dict(re.findall(r'(\w+)\s+= "([^"]+)"', block))
    assert devices == {os_name: ROOT_DEVICES[os_name] for os_name in SUPPORTED_OSES}
    assert "device_name           = local.root_devices[var.os]" in template


def test_build_source_holds_ami_and_the_pinned_requirements(synth):
    staged = [path for path in synth.outdir.glob("asset.*") if (path / "ami").is_dir()]
    assert len(staged) == 1
    assert {path.name for path in staged[0].iterdir()} == {"ami", "requirements.txt", "requirements-dali.txt"}


def _packer_builds() -> set[str]:
    """`<build name>.<source>` of every build block of the template (what -only names)."""
    template = (REPO_ROOT / "ami" / "gpu-image.pkr.hcl").read_text()
    blocks = re.findall(r'\nbuild \{\n\s+name\s+= "([^"]+)"\n\s+sources = \["source\.([^"]+)"\]', template)
    return {f"{name}.{source}" for name, source in blocks}


def test_each_back_end_builds_its_own_image_of_the_template(synth, pcs_synth):
    from stacks.shared.image_stack import PACKER_BUILDS

    assert set(PACKER_BUILDS.values()) == _packer_builds() and len(_packer_builds()) == 2
    for result, backend in ((synth, "parallelcluster"), (pcs_synth, "pcs")):
        build = _build_spec(result)["phases"]["build"]["commands"]
        validate, packer_build = [c for c in build if c.startswith(("packer validate", "packer build"))]
        assert f" -only={PACKER_BUILDS[backend]} " in validate and f" -only={PACKER_BUILDS[backend]} " in packer_build
    (pcs_build,) = [c for c in _build_spec(pcs_synth)["phases"]["build"]["commands"] if c.startswith("packer build")]
    assert '-var "pcs_slurm_version=25.11"' in pcs_build and '-var "os=alinux2023"' in pcs_build
    env = {v["Name"]: v["Value"] for v in _project(pcs_synth)["Environment"]["EnvironmentVariables"]}
    assert env["AMI_PARAMETER"] == "/scdino/ami/gpu-pcs"


FAKE_CURL = """#!/usr/bin/env bash
# Fake curl: serves $FAKE_WEB/<basename of the URL> to -o FILE and logs each URL; 404 (exit 22) otherwise.
out="" url=""
while (($#)); do
  case "$1" in -o) out=$2; shift 2 ;; -*) shift ;; *) url=$1; shift ;; esac
done
echo "${url}" >> "${FAKE_WEB}/requests.log"
[[ -f "${FAKE_WEB}/${url##*/}" ]] || exit 22
cp "${FAKE_WEB}/${url##*/}" "${out}"
"""


def test_the_pcs_image_installs_nothing_signed_by_a_key_that_is_not_aws_s(tmp_path):
    """15-pcs-node.sh, run for real against an impostor key served where AWS's should be: it stops
    before installing anything (AWS's real key cannot be fetched offline, so the good path is not run)."""
    import os
    import shutil
    import subprocess

    assert shutil.which("gpg"), "gpg is needed"
    web, home, bin_dir = tmp_path / "web", tmp_path / "impostor", tmp_path / "bin"
    for folder in (web, home, bin_dir):
        folder.mkdir(mode=0o700)
    gpg = {**os.environ, "GNUPGHOME": str(home)}
    subprocess.run(["gpg", "--batch", "--quiet", "--passphrase", "", "--quick-gen-key", "Impostor <i@example.org>",
                    "rsa2048", "sign", "never"], env=gpg, check=True, capture_output=True)
    key = subprocess.run(["gpg", "--batch", "--armor", "--export"], env=gpg, check=True, capture_output=True).stdout
    (web / "aws-pcs-public-key.pub").write_bytes(key)
    (bin_dir / "curl").write_text(FAKE_CURL)
    (bin_dir / "curl").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_WEB": str(web), "AWS_REGION": "us-east-1",
           "PCS_SLURM_VERSION": "25.11", "PCS_AGENT_INSTALLER": "latest", "PCS_SLURM_INSTALLER": "latest"}
    result = subprocess.run(["bash", str(REPO_ROOT / "ami" / "scripts" / "15-pcs-node.sh")], env=env,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode != 0
    assert "fingerprint is not 1C2432C1862F64D1F90A239A7EEF030EDDF5C21C: not installing" in result.stderr
    assert (web / "requests.log").read_text().splitlines() == [
        "https://aws-pcs-repo-public-keys-us-east-1.s3.us-east-1.amazonaws.com/aws-pcs-public-key.pub"]


def test_the_pcs_image_runs_each_installer_only_after_its_signature_verified():
    template = (REPO_ROOT / "ami" / "gpu-image.pkr.hcl").read_text()
    pcs_build = template[template.index('name    = "pcs"'):]
    assert '"${path.root}/scripts/15-pcs-node.sh"' in pcs_build
    assert "15-pcs-node.sh" not in template[:template.index('name    = "pcs"')]
    script = (REPO_ROOT / "ami" / "scripts" / "15-pcs-node.sh").read_text()
    for function, installer in (("install_pcs_agent() {", "./installer.sh)"),
                                ("install_pcs_slurm() {", "./installer.sh -y")):
        body = script[script.index(function):]
        assert body.index("verified_tarball") < body.index(installer), function
    verify = script[script.index("verified_tarball() {"):]
    assert verify.index('gpg --batch --verify') < verify.index("tar -xzf"), "unpacked before verification"
