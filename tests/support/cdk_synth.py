"""Synthesis and template helpers shared by the infra tests (fixtures live in conftest.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
PCLUSTER_PYTHON = REPO_ROOT / ".venv-pcluster" / "bin" / "python"
PCLUSTER_CHECK = Path(__file__).resolve().parent / "pcluster_check.py"
CDK_ENV = {"JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20", "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1"}
os.environ.update(CDK_ENV)


@dataclass
class Synth:
    """One synthesised app: the Template of each stack, raw JSON, and the cloud assembly directory."""

    templates: dict[str, Any]
    json: dict[str, dict[str, Any]]
    outdir: Path
    stacks: Any


def cdk_json_context() -> dict[str, Any]:
    """The context the CLI would pass (cdk.json's), since App() outside the CLI does not read it."""
    return json.loads((REPO_ROOT / "cdk.json").read_text())["context"]


def synthesize(outdir: Path, *overrides: dict[str, Any]) -> Synth:
    import aws_cdk as cdk
    from aws_cdk.assertions import Template

    from stacks.app_builder import build_app
    from stacks.shared.settings import build_settings

    context = cdk_json_context()
    app = cdk.App(context=context, outdir=str(outdir))
    stacks = build_app(app, build_settings(context["scdino"], *overrides))
    by_name = {"network": stacks.network, "storage": stacks.storage, "image": stacks.image,
               "cluster": stacks.cluster}
    templates = {name: Template.from_stack(stack) for name, stack in by_name.items()}
    return Synth(templates=templates, json={name: t.to_json() for name, t in templates.items()}, outdir=outdir,
                 stacks=stacks)


def resources(template: dict[str, Any], resource_type: str) -> dict[str, dict[str, Any]]:
    return {key: value for key, value in template["Resources"].items() if value["Type"] == resource_type}


def one(template: dict[str, Any], resource_type: str) -> dict[str, Any]:
    found = resources(template, resource_type)
    assert len(found) == 1, f"expected one {resource_type}, found {sorted(found)}"
    return next(iter(found.values()))


def exported(synth_result: Synth, value: dict[str, Any]) -> tuple[str, Any]:
    """(exporting stack, output value) that a cross-stack `{"Fn::ImportValue": name}` reads."""
    (found,) = [(stack, output["Value"]) for stack, template in synth_result.json.items()
                for output in template.get("Outputs", {}).values()
                if output.get("Export", {}).get("Name") == value["Fn::ImportValue"]]
    return found


def cluster_config(synth_result: Synth) -> dict[str, Any]:
    return one(synth_result.json["cluster"], "Custom::PclusterCluster")["Properties"]["ClusterConfiguration"]


def node_pointer(synth_result: Synth) -> dict[str, Any]:
    """The bundle pointer (bootstrap/current.json) the cluster stack's deploy writes, read from its asset in the
    cloud assembly; the values known only at deploy time (CDK's markers: bucket, bundle key) read "<deploy>"."""
    (deployment,) = [resource["Properties"] for resource in
                     resources(synth_result.json["cluster"], "Custom::CDKBucketDeployment").values()
                     if resource["Properties"]["DestinationBucketKeyPrefix"] == "bootstrap/"]
    (text,) = [path.read_text() for key in deployment["SourceObjectKeys"]
               for path in [synth_result.outdir / f"asset.{key.removesuffix('.zip')}" / "current.json"] if path.is_file()]
    return json.loads(re.sub(r'"?<<marker:0xbaba:\d+>>"?', '"<deploy>"', text))


def run_pcluster(request: dict[str, Any]) -> dict[str, Any]:
    """ParallelCluster 3.16's own code, in its virtualenv, on `request` (see pcluster_check.py)."""
    assert PCLUSTER_PYTHON.exists(), f"{PCLUSTER_PYTHON} missing: run `make install`"
    result = subprocess.run([str(PCLUSTER_PYTHON), str(PCLUSTER_CHECK)], input=json.dumps(request),
                            capture_output=True, text=True, timeout=180, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)
