"""ParallelCluster's own rendering of our cluster configurations, as the infra tests read it.

`render_all` sends our configurations to tests/support/pcluster_render.py in .venv-pcluster, once for all of
them, and caches the result in pytest's cache directory by the hash of what decides it (the request, the
renderer's source, the installed aws-parallelcluster). `Rendered` is one cluster's artifacts as
ParallelCluster would upload them; the helpers below read the parts a node acts on: the head node's
cfn-init metadata and dna.json, each queue's launch template and compute dna.json, the node roles.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from tests.support.cdk_synth import PCLUSTER_PYTHON, REPO_ROOT

RENDERER = Path(__file__).resolve().parent / "pcluster_render.py"
TEMPLATE = "templates/aws-parallelcluster.cfn.yaml"
IMPLIED_CONFIG = "configs/cluster-config-with-implied-values.yaml"
INSTANCE_TYPES = "configs/instance-types-data.json"


@dataclass
class Rendered:
    """One cluster as ParallelCluster's create left it: what it uploaded and the CreateStack it called."""

    directory: Path
    config: dict[str, Any]
    """What we sent (build_cluster_config's output)."""
    seconds: float
    operations: list[str]

    def _json(self, relative: str) -> Any:
        return json.loads((self.directory / relative).read_text())

    @cached_property
    def template(self) -> dict[str, Any]:
        return yaml.safe_load((self.directory / TEMPLATE).read_text())

    @cached_property
    def nested(self) -> list[dict[str, Any]]:
        """The nested stacks' templates (queues, login nodes), uploaded as CDK assets."""
        return [json.loads(path.read_text()) for path in sorted((self.directory / "assets").glob("*.json"))]

    @cached_property
    def implied_config(self) -> dict[str, Any]:
        """The configuration with ParallelCluster's implied values: what the nodes download and act on."""
        return yaml.safe_load((self.directory / IMPLIED_CONFIG).read_text())

    @cached_property
    def instance_types(self) -> dict[str, Any]:
        return self._json(INSTANCE_TYPES)

    @cached_property
    def versions(self) -> dict[str, dict[str, str]]:
        """S3 key and version id of each uploaded file, by its path below the artifact directory."""
        return self._json("versions.json")

    @property
    def create_stack(self) -> dict[str, Any]:
        (call,) = self._json("create_stack.json")
        return call

    def template_files(self) -> list[Path]:
        return [self.directory / TEMPLATE, *sorted((self.directory / "assets").glob("*.json"))]


def _cache_key(request: dict[str, Any]) -> str:
    """What decides a render: the request, the renderer, and every package installed beside ParallelCluster."""
    installed = sorted(path.name for path in PCLUSTER_PYTHON.parents[1].glob("lib/python3*/site-packages/*.dist-info"))
    digest = hashlib.sha256(json.dumps([request, installed], sort_keys=True).encode())
    digest.update(RENDERER.read_bytes())
    return digest.hexdigest()[:24]


def render_all(cache_dir: Path, cluster_name: str, cases: dict[str, dict[str, Any]]) -> dict[str, Rendered]:
    """ParallelCluster's create of each case ({"region", "zone", "config"}), in one subprocess; cached by content.
    A render is staged, then renamed into place, so that sessions sharing the cache never see half of one."""
    assert PCLUSTER_PYTHON.exists(), f"{PCLUSTER_PYTHON} missing: run `make install`"
    request = {"cluster_name": cluster_name, "renders": cases}
    outdir = cache_dir / _cache_key(request)
    if not (outdir / "summary.json").exists():
        staging = Path(tempfile.mkdtemp(prefix="staging-", dir=cache_dir))
        try:
            result = subprocess.run([str(PCLUSTER_PYTHON), str(RENDERER)],
                                    input=json.dumps({**request, "outdir": str(staging)}),
                                    capture_output=True, text=True, timeout=900, check=False, cwd=REPO_ROOT)
            assert result.returncode == 0, f"ParallelCluster's render failed:\n{result.stderr[-4000:]}"
            (staging / "summary.json").write_text(result.stdout)
            staging.rename(outdir)
        except OSError:  # another session stored the same render first
            pass
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        _drop_stale(cache_dir, keep=outdir)
    summary = json.loads((outdir / "summary.json").read_text())
    return {label: Rendered(outdir / label, cases[label]["config"], found["seconds"], found["operations"])
            for label, found in summary.items()}


def _drop_stale(cache_dir: Path, keep: Path, age_s: float = 3600) -> None:
    """Renders of other inputs, an hour old or more (a render set is about 1 MB)."""
    for path in cache_dir.iterdir():
        if path != keep and time.time() - path.stat().st_mtime > age_s:
            shutil.rmtree(path, ignore_errors=True)


def resources(template: dict[str, Any], resource_type: str) -> dict[str, dict[str, Any]]:
    return {name: value for name, value in template["Resources"].items() if value["Type"] == resource_type}


def joined(value: Any) -> str:
    """A string CloudFormation builds with Fn::Join, intrinsic parts written as `<Ref X>` / `<GetAtt X>`."""
    if isinstance(value, str):
        return value
    (parts,) = [value["Fn::Join"][1]]
    return "".join(part if isinstance(part, str) else f"<{'|'.join(map(str, _intrinsic(part)))}>" for part in parts)


def _intrinsic(part: dict[str, Any]) -> list[Any]:
    ((name, argument),) = part.items()
    return [name.removeprefix("Fn::"), *(argument if isinstance(argument, list) else [argument])]


def head_node_init(rendered: Rendered) -> dict[str, Any]:
    """The head node launch template's AWS::CloudFormation::Init metadata (what cfn-init runs)."""
    return rendered.template["Resources"]["HeadNodeLaunchTemplate"]["Metadata"]["AWS::CloudFormation::Init"]


def head_node_dna(rendered: Rendered) -> dict[str, Any]:
    """/opt/parallelcluster/tmp/dna.json as cfn-init writes it on the head node (the cookbook's attributes)."""
    files = head_node_init(rendered)["deployConfigFiles"]["files"]
    (content,) = [spec["content"] for path, spec in files.items() if path.endswith("/dna.json")]
    return json.loads(joined(content))["cluster"]


def user_data(launch_template: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(script, variables) of a launch template's `Fn::Base64: Fn::Sub: [script, variables]` user data."""
    script, variables = launch_template["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]["Fn::Sub"]
    return script, variables


def tag(launch_template: dict[str, Any], key: str) -> str:
    specs = launch_template["Properties"]["LaunchTemplateData"]["TagSpecifications"]
    (instance,) = [spec for spec in specs if spec["ResourceType"] == "instance"]
    (value,) = {item["Value"] for item in instance["Tags"] if item["Key"] == key}
    return value


def queue_launch_templates(rendered: Rendered) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Each compute queue's (launch template, its nested stack template), by queue name (one compute
    resource per queue in our configurations)."""
    found = {}
    for nested in rendered.nested:
        for template in resources(nested, "AWS::EC2::LaunchTemplate").values():
            if "parallelcluster:queue-name" in str(template):
                queue = tag(template, "parallelcluster:queue-name")
                assert queue not in found, f"queue {queue} has two launch templates"
                found[queue] = (template, nested)
    return found


def launch_template_dna(launch_template: dict[str, Any]) -> dict[str, Any]:
    """The dna.json a compute or login node's user data writes (the cookbook's attributes on that node)."""
    _, variables = user_data(launch_template)
    return json.loads(joined(variables["DnaJson"]))["cluster"]


def role_of(template: dict[str, Any], launch_template: dict[str, Any]) -> str:
    """Logical id, in `template`, of the IAM role a launch template's instance profile holds."""
    profile = launch_template["Properties"]["LaunchTemplateData"]["IamInstanceProfile"]["Name"]["Ref"]
    (role,) = template["Resources"][profile]["Properties"]["Roles"]
    return role["Ref"]


def policies_of_role(template: dict[str, Any], role_name: str) -> list[dict[str, Any]]:
    """The statements of every AWS::IAM::Policy of the template attached to `role_name`."""
    return [statement for policy in resources(template, "AWS::IAM::Policy").values()
            if {"Ref": role_name} in policy["Properties"]["Roles"]
            for statement in policy["Properties"]["PolicyDocument"]["Statement"]]
