"""`plan --live-prices` through boto3 against a fake of the AWS Price List API and Service Quotas on
loopback. moto 5.2.5 has no Price List API and its Service Quotas knows only the vpc quotas, so
this is a small HTTP server speaking both services' JSON 1.1 protocol (X-Amz-Target), which records
what boto3 asked; boto3 reaches it through AWS_ENDPOINT_URL, as it would reach AWS."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from training.cli import main

PRICE = 4.1234
PRODUCT = {"product": {"attributes": {"instanceType": "g5.12xlarge"}},
           "terms": {"OnDemand": {"ABC.JRTCKXETXF": {"priceDimensions": {
               "ABC.JRTCKXETXF.6YS6EN2CT7": {"unit": "Hrs", "pricePerUnit": {"USD": str(PRICE)}}}}}}}


class FakeAws(BaseHTTPRequestHandler):
    """GetProducts answers PRODUCT for g5.12xlarge and nothing else; GetServiceQuota answers a quota
    of `quota_vcpus` for L-DB2E81BA; any other target is an error, as AWS would answer it."""

    calls: list[tuple[str, dict]] = []
    quota_vcpus = 96.0

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        target = self.headers.get("X-Amz-Target", "")
        type(self).calls.append((target, body))
        if target == "AWSPriceListService.GetProducts":
            filters = {f["Field"]: f["Value"] for f in body["Filters"]}
            products = [json.dumps(PRODUCT)] if filters.get("instanceType") == "g5.12xlarge" else []
            self._answer(200, {"FormatVersion": "aws_v1", "PriceList": products})
        elif target == "ServiceQuotasV20190624.GetServiceQuota" and body.get("QuotaCode") == "L-DB2E81BA":
            self._answer(200, {"Quota": {"ServiceCode": "ec2", "QuotaCode": "L-DB2E81BA",
                                         "QuotaName": "Running On-Demand G and VT instances",
                                         "Value": type(self).quota_vcpus}})
        else:
            self._answer(400, {"__type": "NoSuchResourceException", "message": f"no quota for {body}"})

    def _answer(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/x-amz-json-1.1")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args) -> None:
        pass


@pytest.fixture
def fake_aws(monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeAws)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    FakeAws.calls = []
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    yield FakeAws
    server.shutdown()
    server.server_close()


def _plan(tmp_path, capsys, *args: str) -> list[dict]:
    out = tmp_path / "plan.json"
    assert main(["plan", "--set", f"run.output_dir={tmp_path / 'run'}", "--images", "100000", "--json", str(out),
                 "--live-prices", *args]) == 0
    capsys.readouterr()
    return json.loads(out.read_text())["rows"]


def test_the_price_list_api_price_replaces_the_dated_one(tmp_path, capsys, fake_aws):
    (row,) = _plan(tmp_path, capsys, "--preset", "g5.12xlarge", "--nodes", "1")
    assert row["price"]["usd_per_hour"] == PRICE and row["price"]["source"].startswith("AWS Price List API")
    assert row["cost_usd"] == pytest.approx(row["wall_h"] * PRICE, abs=0.01)
    (target, body), *_ = [call for call in fake_aws.calls if call[0].endswith("GetProducts")]
    filters = {f["Field"]: f["Value"] for f in body["Filters"]}
    assert body["ServiceCode"] == "AmazonEC2"
    assert filters == {"instanceType": "g5.12xlarge", "regionCode": "us-east-1", "operatingSystem": "Linux",
                       "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used"}


def test_a_plan_beyond_the_vcpu_quota_says_which_quota_to_raise(tmp_path, capsys, fake_aws):
    fake_aws.quota_vcpus = 96.0
    one, four = _plan(tmp_path, capsys, "--preset", "g5.12xlarge", "--nodes", "1,4")
    assert not any("quota" in w for w in one["warnings"])  # 48 vCPUs fit in 96
    (warning,) = [w for w in four["warnings"] if "quota" in w]
    assert "need 192 vCPUs, more than the account's quota of 96" in warning and "L-DB2E81BA" in warning


def test_an_unpriced_type_keeps_the_dated_price_and_says_why(tmp_path, capsys, fake_aws):
    (row,) = _plan(tmp_path, capsys, "--preset", "p5.48xlarge", "--nodes", "1")
    assert row["price"]["usd_per_hour"] == 55.04 and row["price"]["date"] == "2026-11-24"
    assert any("Service Quotas did not answer for p5.48xlarge" in w for w in row["warnings"])


def test_without_credentials_the_dated_table_is_used(tmp_path, capsys, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    (row,) = _plan(tmp_path, capsys, "--preset", "g5.12xlarge", "--nodes", "1")
    assert row["price"]["usd_per_hour"] == 5.672
    assert any("no AWS credentials found" in w for w in row["warnings"])
