"""What each cluster back end bills by the hour while the cluster exists, whatever runs on it.

Both back ends share the file system, the NAT gateway and the GPU nodes' price, so the plan compares
what differs: ParallelCluster's head node (and its optional login nodes), against AWS PCS's
controller fee and accounting fee, both set by the controller's size, and its login node. Prices
come from the dated table (training/costs/prices.py), or `--live-prices` for instances; a fee the table
does not hold is named, with where to read it, and the back end's total is then left open.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from training.costs.prices import PCS_PRICING_PAGE, Price, on_demand, pcs_fee
from training.planning.inputs import PlanSettings

BACKENDS = ("parallelcluster", "pcs")


def _instances(what: str, instance_type: str, count: int, region: str, live) -> dict[str, Any]:
    price = (live.price(instance_type, region) if live else None) or on_demand(instance_type, region)
    return _item(f"{what}: {count} x {instance_type}", price, count)


def _item(what: str, price: Price | None, count: int = 1, missing: str = "") -> dict[str, Any]:
    return {"what": what, "usd_per_hour": round(price.usd_per_hour * count, 6) if price else None,
            "price": asdict(price) if price else None,
            "missing": "" if price else (missing or "no dated on-demand price in training/costs/prices.py (--live-prices "
                                                     "asks AWS)")}


def _pcs_fee(component: str, settings: PlanSettings) -> dict[str, Any]:
    price = pcs_fee(component, settings.pcs_size, settings.region)
    return _item(f"PCS {component} fee ({settings.pcs_size})", price,
                 missing=f"not in training/costs/prices.py PCS_FEES for {settings.region}: read it from {PCS_PRICING_PAGE}")


def _items(backend: str, settings: PlanSettings, live) -> list[dict[str, Any]]:
    region = settings.region
    if backend == "parallelcluster":
        items = [_instances("head node", settings.head_node_instance_type, 1, region, live)]
        if settings.login_nodes:
            items.append(_instances("login nodes", settings.login_node_instance_type, settings.login_nodes, region,
                                    live))
        return items
    return [_pcs_fee("controller", settings), _pcs_fee("accounting", settings),
            _instances("login nodes", settings.login_node_instance_type, settings.pcs_login_nodes, region, live)]


def fixed_costs(settings: PlanSettings, live=None) -> list[dict[str, Any]]:
    """Each back end's hourly fixed cost, its items and its total (None while an item is unpriced); the
    chosen one first. Empty when the settings name no back end."""
    if not settings.backend:
        return []
    order = sorted(BACKENDS, key=lambda name: name != settings.backend)
    costs = []
    for backend in order:
        items = _items(backend, settings, live)
        hourly = [item["usd_per_hour"] for item in items]
        costs.append({"backend": backend, "chosen": backend == settings.backend, "items": items,
                      "usd_per_hour": round(sum(hourly), 6) if None not in hourly else None,
                      "known_usd_per_hour": round(sum(h for h in hourly if h is not None), 6)})
    return costs


def for_row(costs: list[dict[str, Any]], wall_h: float) -> dict[str, Any]:
    """A plan row's fixed cost per back end: per hour, over the row's wall time (None where a fee is
    unpriced), and its items (what, $/h, the price's date or what is missing)."""
    return {cost["backend"]: {
        "chosen": cost["chosen"], "usd_per_hour": cost["usd_per_hour"], "known_usd_per_hour": cost["known_usd_per_hour"],
        "cost_usd": round(cost["usd_per_hour"] * wall_h, 4) if cost["usd_per_hour"] is not None else None,
        "items": [{"what": item["what"], "usd_per_hour": item["usd_per_hour"],
                   "date": item["price"]["date"] if item["price"] else None, "missing": item["missing"]}
                  for item in cost["items"]]} for cost in costs}


def fixed_text(fixed: dict[str, Any] | None) -> list[str]:
    """The lines `plan` prints from a row's "fixed": each back end's items and total, side by side."""
    if not fixed:
        return []
    lines = ["fixed cost per hour while the cluster exists (the file system, the NAT gateway and the GPU nodes "
             "are the same for both back ends):"]
    for backend, cost in fixed.items():
        total = (f"${cost['usd_per_hour']:,.2f}/h" if cost["usd_per_hour"] is not None
                 else f"at least ${cost['known_usd_per_hour']:,.2f}/h (a fee is not in the table)")
        lines.append(f"  {backend}{' (chosen)' if cost['chosen'] else ''}: {total}")
        for item in cost["items"]:
            lines.append(f"    {item['what']}: " + (f"${item['usd_per_hour']:,.4g}/h ({item['date']})"
                                                      if item["usd_per_hour"] is not None else item["missing"]))
    lines.append("  pcs also bills a node management fee per instance-hour and accounting storage per GB-month "
                 f"({PCS_PRICING_PAGE}); not counted")
    return lines
