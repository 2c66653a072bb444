"""Dated prices of the presets, per region: what the planner multiplies GPU-hours by.

On-demand Linux prices (USD per instance-hour, shared tenancy) as AWS lists them; each entry
carries its source and the date it was read. Spot is not offered for the GPU queues (only the
optional `cpu-spot` CPU queue is Spot) and Capacity Blocks are priced at purchase, per block and
date, so neither has a dated figure here: the planner says so, and `--live-prices` asks the AWS
Price List API for the current on-demand price (training/planning/live.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from training.instances import READ


@dataclass(frozen=True)
class Price:
    usd_per_hour: float
    source: str
    date: str


_LISTED = ("AWS EC2 On-Demand pricing, Linux, {region}, as quoted by public price tables that agree to the cent "
           "({where}); not read from AWS's page here: --live-prices asks the Price List API")
_TABLES = "several open-source cost tables found by code search"
_DSTACK = "dstack PR #4110's `dstack offer` output for p5en.48xlarge"

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
    },
    "us-west-2": {
        "p5en.48xlarge": Price(63.296, _LISTED.format(region="us-west-2", where=_DSTACK), READ),
    },
}
"""Region -> instance type -> price. A missing pair has no dated price: the planner warns and
leaves the cost empty unless --live-prices finds one."""


def on_demand(instance_type: str, region: str) -> Price | None:
    return ON_DEMAND.get(region, {}).get(instance_type)
