"""`plan --live-prices`: today's on-demand price from the AWS Price List API and the account's vCPU
quota from Service Quotas, through boto3, where credentials exist.

The Price List API answers from us-east-1 (one of its endpoints) for every region; a product is one
JSON document per SKU, its on-demand terms under terms.OnDemand.*.priceDimensions.*.pricePerUnit.USD.
EC2's running-instance quotas count vCPUs per family group: "Running On-Demand G and VT instances"
(L-DB2E81BA) for g*, "Running On-Demand P instances" (L-417A185B) for p*. Any failure leaves the
dated table's figure in place and says why in the row's warnings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date
from typing import Any

from training.costs.prices import Price

PRICING_REGION = "us-east-1"
QUOTAS = {"g": ("L-DB2E81BA", "Running On-Demand G and VT instances"),
          "p": ("L-417A185B", "Running On-Demand P instances")}


@dataclass(frozen=True)
class Quota:
    code: str
    name: str
    vcpus: float


def _filters(instance_type: str, region: str) -> list[dict[str, str]]:
    wanted = {"instanceType": instance_type, "regionCode": region, "operatingSystem": "Linux",
              "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used"}
    return [{"Type": "TERM_MATCH", "Field": key, "Value": value} for key, value in wanted.items()]


def on_demand_usd(product: dict[str, Any]) -> float | None:
    """The hourly USD price of one Price List product document, None without an on-demand term."""
    for term in product.get("terms", {}).get("OnDemand", {}).values():
        for dimension in term.get("priceDimensions", {}).values():
            usd = dimension.get("pricePerUnit", {}).get("USD")
            if usd is not None and float(usd) > 0:
                return float(usd)
    return None


def live_price(session: Any, instance_type: str, region: str) -> Price | None:
    """Today's Linux on-demand price of `instance_type` in `region`, or None when AWS lists none."""
    client = session.client("pricing", region_name=PRICING_REGION)
    answer = client.get_products(ServiceCode="AmazonEC2", Filters=_filters(instance_type, region), MaxResults=10)
    for document in answer.get("PriceList", []):
        usd = on_demand_usd(json.loads(document) if isinstance(document, str) else document)
        if usd is not None:
            return Price(usd, f"AWS Price List API (GetProducts, AmazonEC2, Linux, shared, {region})",
                         date.today().isoformat())
    return None


def vcpu_quota(session: Any, instance_type: str, region: str) -> Quota | None:
    """The account's running on-demand vCPU quota for this instance type's family group."""
    family = QUOTAS.get(instance_type[:1])
    if family is None:
        return None
    code, name = family
    client = session.client("service-quotas", region_name=region)
    value = client.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"]
    return Quota(code, name, float(value))


class LivePrices:
    """Price and quota look-ups for one plan; each failure becomes one warning, not an error."""

    def __init__(self) -> None:
        import boto3

        self.session = boto3.Session()
        self.warnings: list[str] = []
        if self.session.get_credentials() is None:
            self.session = None
            self.warnings.append("--live-prices: no AWS credentials found; the dated price table is used")

    def price(self, instance_type: str, region: str) -> Price | None:
        return self._ask(live_price, instance_type, region, "Price List API")

    def quota(self, instance_type: str, region: str) -> Quota | None:
        return self._ask(vcpu_quota, instance_type, region, "Service Quotas")

    def _ask(self, lookup, instance_type: str, region: str, service: str):
        if self.session is None:
            return None
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return lookup(self.session, instance_type, region)
        except (BotoCoreError, ClientError) as exc:
            self.warnings.append(f"--live-prices: {service} did not answer for {instance_type} in {region} "
                                 f"({str(exc).splitlines()[0]}); the dated table is used")
            return None
