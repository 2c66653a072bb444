"""Dated prices, per region: what the planner multiplies GPU-hours by, and what each cluster back end
bills by the hour while it exists (ParallelCluster's head node; AWS PCS's controller and login node).

On-demand Linux prices (USD per instance-hour, shared tenancy) as AWS lists them; each entry
carries its source and the date it was read. Spot prices move by the hour and Capacity Blocks are
priced at purchase, per block and date, so neither has a dated figure here: the planner says so and
shows the on-demand rate, and `--live-prices` asks the AWS Price List API for the current on-demand
price (training/planning/live.py). AWS PCS's fees are per controller size (PCS_FEES). What a deployment
bills while it stands (file system, NAT gateway, volumes, keys, buckets) is priced per GB-month, hour or
key-month in STANDING (training/planning/standing.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from training.costs.instances import READ


@dataclass(frozen=True)
class Price:
    usd_per_hour: float
    source: str
    date: str


_LISTED = ("AWS EC2 On-Demand pricing, Linux, {region}, as quoted by public price tables that agree to the cent "
           "({where}); not read from AWS's page here: --live-prices asks the Price List API")
_TABLES = "several open-source cost tables found by code search"
_DSTACK = "dstack PR #4110's `dstack offer` output for p5en.48xlarge"
_CPU_TABLES = ("several open-source cost tables found by code search, one of them citing ec2.shop and "
               "instances.vantage.sh on 2026-10-06")
CPU_READ = "2026-11-26"
"""The date the head and login node prices were read."""

ON_DEMAND: dict[str, dict[str, Price]] = {
    "us-east-1": {
        "g4dn.12xlarge": Price(3.912, _LISTED.format(region="us-east-1", where=_TABLES), READ),
        "g5.12xlarge": Price(5.672, _LISTED.format(region="us-east-1", where=_TABLES), READ),
        "g6e.12xlarge": Price(10.49264, _LISTED.format(region="us-east-1", where=_TABLES), READ),
        "p4d.24xlarge": Price(21.957642, _LISTED.format(region="us-east-1", where=_TABLES + " (after AWS's 2025 "
                                                                                 "P4/P5 price cut)"), READ),
        "p5.48xlarge": Price(55.04, _LISTED.format(region="us-east-1", where=_TABLES + " (after AWS's 2025 "
                                                                          "P4/P5 price cut)"), READ),
        "p5en.48xlarge": Price(63.296, _LISTED.format(region="us-east-1", where=_DSTACK), READ),
        # The default head node (ParallelCluster) and login node (PCS, ParallelCluster's optional ones).
        "c6i.2xlarge": Price(0.34, _LISTED.format(region="us-east-1", where=_CPU_TABLES), CPU_READ),
        "c6i.xlarge": Price(0.17, _LISTED.format(region="us-east-1", where=_CPU_TABLES), CPU_READ),
    },
    "us-west-2": {
        "p5en.48xlarge": Price(63.296, _LISTED.format(region="us-west-2", where=_DSTACK), READ),
    },
}
"""Region -> instance type -> price. A missing pair has no dated price: the planner warns and
leaves the cost empty unless --live-prices finds one."""


def on_demand(instance_type: str, region: str) -> Price | None:
    return ON_DEMAND.get(region, {}).get(instance_type)


PCS_PRICING_PAGE = "https://aws.amazon.com/pcs/pricing/"
PCS_FEES: dict[str, dict[str, Price]] = {}
"""Region -> "controller-<SIZE>" or "accounting-<SIZE>" -> AWS PCS's hourly fee for a cluster of that
size (its Slurm controller; Slurm accounting, which backend=pcs turns on). PCS also bills a node
management fee per instance-hour and accounting storage per GB-month, which no plan row counts.
Empty on purpose: on 2026-11-26 no figure of AWS's PCS pricing page could be read from here (the page
is not reachable, and no public table or document found by search quotes one), and a figure without
a source is not put here. Add each one from that page with the date it was read; the planner then
prices PCS's fixed cost as it prices ParallelCluster's head node."""


def pcs_fee(component: str, size: str, region: str) -> Price | None:
    """AWS PCS's hourly fee for `component` ("controller" or "accounting") at `size`, None when undated."""
    return PCS_FEES.get(region, {}).get(f"{component}-{size}")


@dataclass(frozen=True)
class Rate:
    """A list price that is not an instance-hour: USD per `unit` (a GB-month, an hour, a key-month)."""

    usd: float
    unit: str
    source: str
    date: str


STANDING_READ = "2026-11-27"
"""The date the standing prices below were read."""
_FOUND = "several open-source cost tables and notes found by code search that agree, quoting {page}"
_FSX_TABLE = ("FSx for Lustre PERSISTENT_2 SSD storage, us-east-1: an open-source FSx cost tool's table taken from the "
              "AWS Price List API, found by code search; its 125 MB/s/TiB figure agrees with c3x.dev's FSx page and a "
              "second public note. AWS's page (https://aws.amazon.com/fsx/lustre/pricing/) could not be read here")
_VPC = _FOUND.format(page="https://aws.amazon.com/vpc/pricing/")
_EBS = _FOUND.format(page="https://aws.amazon.com/ebs/pricing/")
_CLOUDWATCH = _FOUND.format(page="https://aws.amazon.com/cloudwatch/pricing/")
STANDING: dict[str, dict[str, Rate]] = {
    "us-east-1": {
        **{f"fsx-persistent2-{tier}": Rate(usd, "GB-month", _FSX_TABLE, STANDING_READ)
           for tier, usd in ((125, 0.145), (250, 0.21), (500, 0.34), (1000, 0.60))},
        "nat-gateway-hour": Rate(0.045, "hour", _VPC, STANDING_READ),
        "nat-gateway-gb": Rate(0.045, "GB", _VPC + " (per GB processed)", STANDING_READ),
        "ebs-gp3": Rate(0.08, "GB-month", _EBS, STANDING_READ),
        "ebs-snapshot": Rate(0.05, "GB-month", _EBS + " (standard snapshots)", STANDING_READ),
        "s3-standard": Rate(0.023, "GB-month", _FOUND.format(page="https://aws.amazon.com/s3/pricing/")
                            + " (the first 50 TB a month)", STANDING_READ),
        "cloudwatch-alarm-metric": Rate(0.10, "alarm metric-month", _CLOUDWATCH + " (standard resolution; an "
                                        "account's first 10 are free)", STANDING_READ),
    },
}
"""Region -> item -> price, for what a deployment bills while it stands (training/planning/standing.py).
A missing pair has no dated price: the planner names the item's price unknown."""
EVERY_REGION: dict[str, Rate] = {
    "kms-key": Rate(1.0, "key-month", _FOUND.format(page="https://aws.amazon.com/kms/pricing/")
                    + " (prorated hourly; each of a rotated key's first two yearly rotations adds $1)", STANDING_READ),
    "public-ipv4": Rate(0.005, "hour", "AWS's announcement, in force since 2024-02-01 for every public "
                        "IPv4 address, in use or not (https://aws.amazon.com/blogs/aws/new-aws-public-ipv4-address-"
                        "charge-public-ip-insights/), as public notes found by code search quote it", STANDING_READ),
    "cloudwatch-dashboard": Rate(3.0, "dashboard-month", _CLOUDWATCH + " (an account's first 3 are free)",
                                 STANDING_READ),
    "secretsmanager-secret": Rate(0.40, "secret-month", "public notes found by search that agree, quoting "
                                  "https://aws.amazon.com/secrets-manager/pricing/ (API calls bill $0.05 per 10,000 "
                                  "besides)", STANDING_READ),
}
"""What AWS prices the same in every commercial region."""


def standing_rate(item: str, region: str) -> Rate | None:
    """The dated price of a standing item in `region`, None when the table has none."""
    return STANDING.get(region, {}).get(item) or EVERY_REGION.get(item)
