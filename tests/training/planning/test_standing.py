"""`python -m training plan`'s standing cost: what the deployment bills a month while idle and what
`cdk destroy --all` keeps billing, for the settings cdk.json, a settings file and `-c` give.

Every expected figure is computed here from the dated table's own rows (STANDING, EVERY_REGION,
ON_DEMAND), times the quantities the settings name, not by the planner's helpers."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from training.cli import main
from training.costs import prices

REPO = Path(__file__).resolve().parents[3]
MONTH = 730
IMAGES, IMAGE_BYTES = 200_000, 5 * 48 * 48 * 2
"""--images and the planner's assumed 16-bit 5 x 48 x 48 px image: the bucket's 4.29 GB."""


def _rate(item: str) -> float:
    return prices.STANDING["us-east-1"].get(item, prices.EVERY_REGION.get(item)).usd


def _hour(instance_type: str) -> float:
    return prices.ON_DEMAND["us-east-1"][instance_type].usd_per_hour


def _standing(tmp_path, capsys, *context: str) -> tuple[dict, str]:
    out = tmp_path / "plan.json"
    assert main(["plan", "--set", f"run.output_dir={tmp_path / 'run'}", "--images", str(IMAGES), "--preset",
                 "g4dn.12xlarge", "--nodes", "1", "--json", str(out), *context]) == 0
    return json.loads(out.read_text())["standing"], capsys.readouterr().out


def _shared(stored_gb: float) -> float:
    """What both back ends bill: the file system (cdk.json: 1200 GiB at 250 MB/s/TiB), the NAT gateway and
    its address, five KMS keys, three alarms' five metrics, one image's snapshot (100 GiB) and the dataset."""
    return (1200 * _rate("fsx-persistent2-250") + MONTH * (_rate("nat-gateway-hour") + _rate("public-ipv4"))
            + 5 * _rate("kms-key") + 5 * _rate("cloudwatch-alarm-metric") + 100 * _rate("ebs-snapshot")
            + stored_gb * _rate("s3-standard"))


def test_the_default_deployment_s_idle_month_and_what_destroy_keeps(tmp_path, capsys):
    standing, text = _standing(tmp_path, capsys)
    stored_gb = IMAGES * IMAGE_BYTES / 2**30
    # head node c6i.2xlarge, its 200 GiB root volume and the 200 GiB /apps volume, two dashboards, the REST token
    idle = (_shared(stored_gb) + MONTH * _hour("c6i.2xlarge") + 400 * _rate("ebs-gp3") + 2 * _rate("cloudwatch-dashboard")
            + _rate("secretsmanager-secret"))
    kept = 1200 * _rate("fsx-persistent2-250") + 2 * _rate("kms-key") + 100 * _rate("ebs-snapshot") \
        + stored_gb * _rate("s3-standard")
    assert standing["deployed"]["usd_per_month"] == pytest.approx(idle, abs=0.01)
    assert standing["kept_after_destroy"]["usd_per_month"] == pytest.approx(kept, abs=0.01)
    assert f"standing cost (parallelcluster): ${idle:,.2f}/month while deployed and idle; ${kept:,.2f}/month kept" \
        in text
    assert f"storage.retain=true keeps the FSx file system after `cdk destroy --all`: ${1200 * 0.21:,.2f} a month" \
        in text
    for row in standing["items"]:
        assert row["price"]["date"] and row["price"]["source"], row


def test_pcs_bills_its_fees_and_a_login_node_where_parallelcluster_bills_a_head_node(tmp_path, capsys, monkeypatch):
    pc, _ = _standing(tmp_path, capsys)
    pcs, text = _standing(tmp_path, capsys, "-c", "backend=pcs")
    # ParallelCluster: head node + root and /apps volumes + its own dashboard + the REST API token's secret; PCS: a
    # login node + its root volume
    difference = (MONTH * _hour("c6i.2xlarge") + 400 * _rate("ebs-gp3") + _rate("cloudwatch-dashboard")
                  + _rate("secretsmanager-secret") - MONTH * _hour("c6i.xlarge") - 200 * _rate("ebs-gp3"))
    assert pcs["deployed"]["usd_per_month"] is None  # PCS_FEES holds no dated fee
    assert pc["deployed"]["usd_per_month"] - pcs["deployed"]["known_usd_per_month"] == pytest.approx(difference,
                                                                                                    abs=0.01)
    assert pcs["deployed"]["unknown"] == ["PCS controller fee (SMALL)", "PCS accounting fee (SMALL)"]
    assert "PCS controller fee (SMALL): 730 hour, price unknown" in text and prices.PCS_PRICING_PAGE in text
    assert pcs["kept_after_destroy"] == pc["kept_after_destroy"]
    fees = {"controller-SMALL": prices.Price(0.5, "test", "2026-11-27"),
            "accounting-SMALL": prices.Price(0.25, "test", "2026-11-27")}
    monkeypatch.setitem(prices.PCS_FEES, "us-east-1", fees)
    dated, _ = _standing(tmp_path, capsys, "-c", "backend=pcs")
    assert dated["deployed"]["usd_per_month"] == pytest.approx(pcs["deployed"]["known_usd_per_month"] + MONTH * 0.75,
                                                               abs=0.01)


def test_a_settings_file_s_static_nodes_tier_and_throw_away_storage(tmp_path, capsys):
    settings = tmp_path / "settings.yaml"
    settings.write_text("storage:\n  retain: false\n  fsx_capacity_gib: 2400\n  fsx_throughput_per_tib: 1000\n"
                        "cluster:\n  min_nodes: 1\n  max_nodes: 2\n  root_volume_gib: 100\n")
    standing, text = _standing(tmp_path, capsys, "-c", f"settings={settings}")
    stored_gb = IMAGES * IMAGE_BYTES / 2**30
    shared = _shared(stored_gb) - 1200 * _rate("fsx-persistent2-250") + 2400 * _rate("fsx-persistent2-1000")
    # the head node's 100 GiB root volume and 200 GiB /apps, one static g4dn.12xlarge and its 100 GiB root volume
    idle = (shared + MONTH * (_hour("c6i.2xlarge") + _hour("g4dn.12xlarge")) + 400 * _rate("ebs-gp3")
            + 2 * _rate("cloudwatch-dashboard") + _rate("secretsmanager-secret"))
    assert standing["deployed"]["usd_per_month"] == pytest.approx(idle, abs=0.01)
    assert standing["kept_after_destroy"]["usd_per_month"] == pytest.approx(100 * _rate("ebs-snapshot"), abs=0.01)
    assert "WARNING" not in text and "static GPU nodes (1 x g4dn.12xlarge)" in text


def test_a_region_without_dated_prices_names_each_unknown_and_gives_a_lower_bound(tmp_path, capsys):
    standing, text = _standing(tmp_path, capsys, "-c", "region=us-west-2", "-c", "network.availability_zone=us-west-2a")
    assert standing["deployed"]["usd_per_month"] is None
    assert "FSx for Lustre PERSISTENT_2, 1200 GiB at 250 MB/s/TiB" in standing["deployed"]["unknown"]
    # what every region prices alike: the NAT gateway's address, five keys, two dashboards, the REST token's secret
    known = (MONTH * _rate("public-ipv4") + 5 * _rate("kms-key") + 2 * _rate("cloudwatch-dashboard")
             + _rate("secretsmanager-secret"))
    assert standing["deployed"]["known_usd_per_month"] == pytest.approx(known, abs=0.01)
    assert re.search(r"standing cost \(parallelcluster\): at least \$[\d.,]+/month \(\d+ item\(s\) with no dated "
                     "price", text)


@pytest.mark.parametrize(("context", "named"), [
    (["-c", "storage.fsx_throughput_per_tib=300"], "storage.fsx_throughput_per_tib: must be one of (125, 250, 500, "
                                                   "1000), got 300"),
    (["-c", "settings=no-such-settings.yaml"], "setting settings: file 'no-such-settings.yaml' does not exist"),
])
def test_a_bad_setting_is_one_line_that_names_it(tmp_path, context, named):
    result = subprocess.run([sys.executable, "-m", "training", "plan", "--images", "1000", "--set",
                             f"run.output_dir={tmp_path}", *context], cwd=REPO, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and named in result.stderr, result.stderr


def test_the_snapshot_bound_is_the_image_build_s_volume():
    from training.planning.standing import AMI_VOLUME_GIB

    hcl = (REPO / "ami" / "gpu-image.pkr.hcl").read_text()
    (default,) = re.findall(r'variable "volume_size_gib" \{[^}]*default\s*=\s*(\d+)', hcl)
    assert int(default) == AMI_VOLUME_GIB


def test_the_readme_and_deploy_guide_quote_the_figures_plan_prints_for_the_defaults():
    from stacks.shared.settings import build_settings
    from training.planning.inputs import PlanSettings
    from training.planning.standing import standing_cost

    context = json.loads((REPO / "cdk.json").read_text())["context"]["scdino"]
    month = {backend: standing_cost(PlanSettings.of(build_settings(context, {"backend": backend})))
             for backend in ("parallelcluster", "pcs")}
    idle = f"${month['parallelcluster']['deployed']['usd_per_month']:,.2f} a month"
    kept = f"${month['parallelcluster']['kept_after_destroy']['usd_per_month']:,.2f} a month"
    readme = " ".join((REPO / "README.md").read_text().split())
    guide = " ".join((REPO / "docs" / "deploy.md").read_text().split())
    assert f"costs {kept}" in readme and f"cost {idle}" in readme
    assert f"bills {idle} while idle" in guide and f"what is kept bills {kept}" in guide
    pcs = f"at least ${month['pcs']['deployed']['known_usd_per_month']:,.2f} with PCS"
    assert pcs in guide and month["pcs"]["kept_after_destroy"] == month["parallelcluster"]["kept_after_destroy"]
