"""What a deployment costs per month while it stands idle, and what `cdk destroy --all` leaves billing.

A pure function of the deployment settings (PlanSettings: the same cdk.json context, settings file and
`-c` overrides app.py reads) to items (resource, quantity, unit, unit price, $/month) priced from the
dated table (training/costs/prices.py: STANDING, EVERY_REGION, on_demand, PCS_FEES). An item whose
price the table lacks is named with its price unknown, and the total is then a lower bound.

What each stack holds is mirrored here as counts (tests/infra/test_standing_cost.py holds them to the
synthesised templates). `cdk destroy --all` deletes the cluster and image stacks (the NAT gateway, the
head or login nodes, the static nodes, their volumes, the dashboards and alarms). With storage.retain
(the default) the storage stack's RETAIN keeps its KMS key, both buckets and the FSx file system, whose
termination protection stops the destroy there, so the network stack (and its flow-log key) stays too;
built AMIs are not CloudFormation's and stay whatever retain says.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from training.costs.prices import PCS_PRICING_PAGE, Price, Rate, on_demand, pcs_fee, standing_rate
from training.planning.inputs import PlanSettings

HOURS_PER_MONTH = 730
"""The month of AWS's pricing pages (8,760 hours / 12)."""
KMS_KEYS = {"network": 1, "storage": 1, "image": 1, "cluster": 2}
"""Customer-managed keys per stack: the flow-log key, the file system's key, the image build's key, and the
cluster stack's logs key and alarm-topic key (both back ends)."""
DASHBOARDS = {"parallelcluster": 2, "pcs": 1}
"""CloudWatch dashboards: the GPU and training one (stacks/shared/monitoring.py), plus ParallelCluster's own."""
ALARM_METRICS = 5
"""Metrics the cluster's three alarms read (stacks/shared/monitoring.py: 2 + 2 + 1); each is billed."""
SECRETS = {"parallelcluster": 1, "pcs": 0}
"""Secrets Manager secrets of the cluster stack: ParallelCluster's Slurm REST API token (stacks/shared/rest_api.py).
PCS keeps its cluster's keys in secrets of its own (pcs!...), which NOT_COUNTED names."""
AMI_VOLUME_GIB = 100
"""The image build's root volume (ami/gpu-image.pkr.hcl, volume_size_gib): its snapshot's upper bound."""
NOT_COUNTED = {
    "": "traffic (NAT gateway data processing, priced per GB above; flow logs; CloudWatch Logs ingestion), the "
        "access-log and deploy buckets, retained CloudWatch log groups",
    "parallelcluster": "ParallelCluster's own head-node alarms, EC2 detailed monitoring, the login nodes' root volumes",
    "pcs": f"PCS's node management fee per instance-hour and accounting storage per GB-month ({PCS_PRICING_PAGE}), "
           "the Secrets Manager secrets PCS keeps its cluster's keys in",
}
"""What bills by use or is too small to price here, per back end ("": both)."""


@dataclass(frozen=True)
class Item:
    """One line of the standing cost: `quantity` `unit`s a month at `rate`."""

    resource: str
    quantity: float
    rate: Rate | None
    kept: bool
    """Still billed after `cdk destroy --all`."""
    unit: str = ""
    note: str = ""

    @property
    def usd_per_month(self) -> float | None:
        """None when the price is unknown, unless none is used (idle traffic, an empty bucket)."""
        if self.rate is None:
            return 0.0 if self.quantity == 0 else None
        return round(self.quantity * self.rate.usd, 4)

    def row(self) -> dict[str, Any]:
        return {"resource": self.resource, "quantity": round(self.quantity, 4),
                "unit": self.rate.unit if self.rate else self.unit,
                "usd_per_unit": self.rate.usd if self.rate else None, "usd_per_month": self.usd_per_month,
                "kept_after_destroy": self.kept, "note": self.note,
                "price": asdict(self.rate) if self.rate else None}


def _per_hour(price: Price | None, unit: str = "instance-hour") -> Rate | None:
    return Rate(price.usd_per_hour, unit, price.source, price.date) if price else None


def _gp3(what: str, count: int, gib: int, region: str) -> list[Item]:
    if not count or not gib:
        return []
    return [Item(f"{what} ({count} x {gib} GiB gp3)", count * gib, standing_rate("ebs-gp3", region), False,
                 "GB-month")]


def _storage(settings: PlanSettings, stored_gb: float | None) -> list[Item]:
    region, keep = settings.region, settings.retain
    fsx = Item(f"FSx for Lustre PERSISTENT_2, {settings.fsx_capacity_gib} GiB at {settings.fsx_throughput_per_tib} "
               "MB/s/TiB", settings.fsx_capacity_gib,
               standing_rate(f"fsx-persistent2-{settings.fsx_throughput_per_tib}", region), keep, "GB-month",
               "billed in full after the destroy until deleted by hand" if keep else "")
    bucket = Item("S3 data bucket (Standard)", stored_gb or 0.0, standing_rate("s3-standard", region), keep,
                  "GB-month", "the dataset only; checkpoints and results add to it" if stored_gb
                  else "the dataset's size is not known: give --images")
    return [fsx, bucket]


def _network(settings: PlanSettings) -> list[Item]:
    region = settings.region
    return [Item("NAT gateway", HOURS_PER_MONTH, standing_rate("nat-gateway-hour", region), False, "hour"),
            Item("NAT gateway data processed", 0.0, standing_rate("nat-gateway-gb", region), False, "GB",
                 "0 while idle; each GB the private subnet sends out"),
            Item("NAT gateway's public IPv4 address", HOURS_PER_MONTH, standing_rate("public-ipv4", region), False,
                 "hour")]


def _instances(what: str, instance_type: str, count: int, region: str, note: str = "") -> list[Item]:
    if not count:
        return []
    return [Item(f"{what} ({count} x {instance_type})", count * HOURS_PER_MONTH,
                 _per_hour(on_demand(instance_type, region)), False, "instance-hour", note)]


def _controller(settings: PlanSettings) -> list[Item]:
    """What runs Slurm and where people log in: the head node (and its /apps volume), or PCS's fees and
    its login nodes."""
    region, root = settings.region, settings.root_volume_gib
    if settings.backend == "parallelcluster":
        return (_instances("head node", settings.head_node_instance_type, 1, region)
                + _gp3("head node root volume", 1, root, region)
                + _gp3("/apps volume", 1, settings.apps_volume_gib, region)
                + _instances("login nodes", settings.login_node_instance_type, settings.login_nodes, region))
    fees = []
    for component in ("controller", "accounting"):
        rate = _per_hour(pcs_fee(component, settings.pcs_size, region), "hour")
        fees.append(Item(f"PCS {component} fee ({settings.pcs_size})", HOURS_PER_MONTH, rate, False, "hour",
                         "" if rate else f"PCS_FEES lacks it: read it from {PCS_PRICING_PAGE}"))
    return (fees + _instances("login nodes", settings.login_node_instance_type, settings.pcs_login_nodes, region)
            + _gp3("login nodes' root volumes", settings.pcs_login_nodes, root, region))


def _static_nodes(settings: PlanSettings) -> list[Item]:
    if not settings.min_nodes:
        return []
    note = {"SPOT": "at the on-demand rate, an upper bound for Spot",
            "CAPACITY_BLOCK": "at the on-demand rate: a Capacity Block is priced when bought"}.get(
        settings.capacity_type, "")
    items = [item for preset in settings.presets
             for item in _instances("static GPU nodes", preset, settings.min_nodes, settings.region, note)]
    return items + _gp3("static nodes' root volumes", settings.min_nodes * len(settings.presets),
                        settings.root_volume_gib, settings.region)


def _keys_and_monitoring(settings: PlanSettings) -> list[Item]:
    region = settings.region
    kept_stacks = ("storage", "network") if settings.retain else ()
    kept = sum(KMS_KEYS[stack] for stack in kept_stacks)
    key = standing_rate("kms-key", region)
    keys = [Item(f"KMS keys of the {' and '.join(kept_stacks)} stacks", kept, key, True, "key-month")] if kept else []
    keys.append(Item("KMS keys deleted with their stacks", sum(KMS_KEYS.values()) - kept, key, False, "key-month"))
    secrets = [Item("Secrets Manager secret (the Slurm REST API's token)", SECRETS[settings.backend],
                    standing_rate("secretsmanager-secret", region), False, "secret-month")] if SECRETS[settings.backend] else []
    return keys + secrets + [
        Item("CloudWatch dashboards", DASHBOARDS[settings.backend], standing_rate("cloudwatch-dashboard", region),
             False, "dashboard-month"),
        Item("CloudWatch alarm metrics", ALARM_METRICS, standing_rate("cloudwatch-alarm-metric", region), False,
             "alarm metric-month"),
        Item("built AMI's snapshot, at most", AMI_VOLUME_GIB, standing_rate("ebs-snapshot", region), True, "GB-month",
             "snapshots bill the blocks written; each image rebuilt adds one until deregistered")]


def standing_items(settings: PlanSettings, stored_gb: float | None = None) -> list[Item]:
    """Every item the deployment bills while it stands, at a month's quantity; `stored_gb`: the data in the bucket."""
    return (_storage(settings, stored_gb) + _network(settings) + _controller(settings) + _static_nodes(settings)
            + _keys_and_monitoring(settings))


def _total(items: list[Item]) -> dict[str, Any]:
    known = [item.usd_per_month for item in items if item.usd_per_month is not None]
    unknown = [item.resource for item in items if item.usd_per_month is None]
    return {"usd_per_month": None if unknown else round(sum(known), 2), "known_usd_per_month": round(sum(known), 2),
            "unknown": unknown}


def standing_cost(settings: PlanSettings, stored_gb: float | None = None) -> dict[str, Any] | None:
    """The items, the monthly total while deployed and idle, and the part `cdk destroy --all` keeps billing;
    None when the settings name no back end."""
    if not settings.backend:
        return None
    items = standing_items(settings, stored_gb)
    return {"backend": settings.backend, "region": settings.region, "retain": settings.retain,
            "hours_per_month": HOURS_PER_MONTH, "items": [item.row() for item in items],
            "deployed": _total(items), "kept_after_destroy": _total([item for item in items if item.kept]),
            "not_counted": [NOT_COUNTED[""], NOT_COUNTED[settings.backend]]}


def _money(total: dict[str, Any]) -> str:
    if total["usd_per_month"] is not None:
        return f"${total['usd_per_month']:,.2f}/month"
    return (f"at least ${total['known_usd_per_month']:,.2f}/month ({len(total['unknown'])} item(s) with no dated "
            "price, marked below)")


def _item_line(row: dict[str, Any]) -> str:
    kept = " [kept]" if row["kept_after_destroy"] else ""
    note = f"; {row['note']}" if row["note"] else ""
    if row["usd_per_unit"] is None:
        return (f"    {row['resource']}{kept}: {row['quantity']:,g} {row['unit']}, price unknown (no dated price in "
                f"training/costs/prices.py for this region{note})")
    return (f"    {row['resource']}{kept}: {row['quantity']:,g} {row['unit']} x ${row['usd_per_unit']:g} = "
            f"${row['usd_per_month']:,.2f} ({row['price']['date']}{note})")


def standing_summary(standing: dict[str, Any] | None) -> list[str]:
    """The line `plan` prints under the run's cost: what the deployment bills a month whatever runs."""
    if not standing:
        return []
    return [f"standing cost ({standing['backend']}): {_money(standing['deployed'])} while deployed and idle; "
            f"{_money(standing['kept_after_destroy'])} kept after `cdk destroy --all` (items below)"]


def standing_text(standing: dict[str, Any] | None) -> list[str]:
    """The lines `plan` prints: both totals, the warning that a retained file system keeps billing, each item."""
    if not standing:
        return []
    kept = standing["kept_after_destroy"]
    lines = [f"standing cost of the deployment ({standing['backend']}, {standing['region']}, "
             f"{standing['hours_per_month']} h a month, dated price table):",
             f"  while deployed and idle: {_money(standing['deployed'])}",
             f"  kept after `cdk destroy --all`: {_money(kept)}"]
    fsx = standing["items"][0]
    if fsx["kept_after_destroy"]:
        lines.append("  WARNING: storage.retain=true keeps the FSx file system after `cdk destroy --all`: "
                     + (f"${fsx['usd_per_month']:,.2f}" if fsx["usd_per_month"] is not None else "its price")
                     + " a month until deleted by hand (docs/deploy.md, Destroy), or deploy with "
                       "-c storage.retain=false")
    lines += [_item_line(row) for row in standing["items"]]
    lines += [f"  not counted: {what}" for what in standing["not_counted"]]
    return lines
