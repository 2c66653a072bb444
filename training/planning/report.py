"""The plan's rows (one per preset and node count: which presets and counts, from the step's flags),
the table `python -m training plan` prints and the JSON it keeps."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any, Callable

from training.config import Config
from training.costs.instances import INSTANCES, LOCAL
from training.costs.prices import on_demand
from training.errors import UserError
from training.planning import inputs
from training.planning.fixed import fixed_costs, fixed_text, for_row
from training.planning.model import plan
from training.planning.profile_steps import profile_steps, profile_steps_text, wells_of
from training.planning.standing import standing_cost, standing_summary, standing_text
from training.rundir import RunLayout
from training.writes.atomic import write_json_atomic

log = logging.getLogger(__name__)

LOCAL_NODES = 2
"""Nodes of the local Slurm cluster (scripts/local-slurm.sh)."""


def preset_names(asked: list[str], enabled: tuple[str, ...]) -> list[str]:
    """The presets `--preset` names (`all`: every preset of the instance table), else the enabled ones."""
    names = [name for item in asked for name in (INSTANCES if item == "all" else [item])] or list(enabled)
    for name in names:
        if name != LOCAL and name not in INSTANCES:
            raise UserError(f"--preset {name!r}: unknown; choose from {', '.join(INSTANCES)}, all or {LOCAL}")
    return list(dict.fromkeys(names))


def node_counts(text: str | None, max_nodes: int, local: bool) -> list[int]:
    """`--nodes`' counts; else the local cluster's nodes, or 1, 2, 4, ... up to cluster.max_nodes."""
    if text:
        try:
            counts = [int(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise UserError(f"--nodes {text!r}: give node counts such as 1,2,4") from None
        if not counts or min(counts) < 1:
            raise UserError(f"--nodes {text!r}: node counts must be 1 or more")
        return counts
    if local:
        return [LOCAL_NODES]
    counts, n = [], 1
    while n < max_nodes:
        counts.append(n)
        n *= 2
    return counts + [max_nodes]


def _price_and_warnings(name: str, settings: inputs.PlanSettings, live) -> tuple:
    warnings = []
    price = live.price(name, settings.region) if live else None
    price = price or on_demand(name, settings.region)
    if price is None:
        warnings.append(f"no dated on-demand price for {name} in {settings.region}: the cost is left empty "
                        "(--live-prices asks AWS)")
    if settings.capacity_type == "CAPACITY_BLOCK":
        warnings.append("cluster.capacity_type=CAPACITY_BLOCK: a block's price is set when it is bought; the cost "
                        "shown is the on-demand rate")
    if settings.capacity_type == "SPOT":
        warnings.append("cluster.capacity_type=SPOT: Spot prices move by the hour and nodes may be reclaimed; the cost "
                        "shown is the on-demand rate, an upper bound")
    return price, warnings


def _quota_warning(name: str, nodes: int, settings: inputs.PlanSettings, live) -> list[str]:
    quota = live.quota(name, settings.region) if live else None
    needed = nodes * INSTANCES[name].vcpus
    if quota is None or quota.vcpus >= needed:
        return []
    return [f"{nodes} x {name} need {needed} vCPUs, more than the account's quota of {quota.vcpus:.0f} "
            f"({quota.name}, {quota.code}) in {settings.region}: request an increase in Service Quotas"]


def plan_rows(config: Config, layout: RunLayout, settings: inputs.PlanSettings, names: list[str],
              args: argparse.Namespace, counts: Callable[[bool], list[int]]) -> list[dict]:
    """Every row: each named preset (or the local cluster) on each node count."""
    work = inputs.workload(config, layout, args.images, args.image_bytes)
    step = inputs.read_json_file(args.step_json, "--step-json")
    loader = inputs.read_json_file(args.loader_json, "--loader-json")
    busbw = inputs.read_json_file(args.busbw_json, "--busbw-json")
    live = None
    if args.live_prices:
        from training.planning.live import LivePrices

        live = LivePrices()
    rows = []
    for name in names:
        if name == LOCAL:
            target, warnings = inputs.local_target(busbw)
            gpu_model, storage = None, None
        else:
            price, warnings = _price_and_warnings(name, settings, live)
            target = inputs.preset_target(INSTANCES[name], price, busbw if len(names) == 1 else None)
            gpu_model, storage = INSTANCES[name].gpu.model, settings.storage
        compute = inputs.compute(config, work, target, gpu_model, step, loader, busbw)
        for nodes in counts(name == LOCAL):
            extra = warnings + (_quota_warning(name, nodes, settings, live) if name != LOCAL else [])
            rows.append(plan(work, target, compute, storage, nodes, extra).row() | {"dataset": work.source})
    fixed = fixed_costs(settings, live)
    for row in rows:
        if fixed and row["preset"] != LOCAL:
            row["fixed"] = for_row(fixed, row["wall_h"])
        if live:
            row["warnings"] = row["warnings"] + live.warnings
    return rows


def plan_standing(config: Config, layout: RunLayout, settings: inputs.PlanSettings, names: list[str],
                  args: argparse.Namespace) -> dict[str, Any] | None:
    """What the deployment bills a month while idle and after `cdk destroy --all`, its bucket holding the
    dataset; None when only the local cluster is planned."""
    if all(name == LOCAL for name in names):
        return None
    count, image_bytes, _ = inputs.dataset_size(config, layout, args.images, args.image_bytes)
    return standing_cost(settings, stored_gb=count * image_bytes / 2**30)


def plan_profile_steps(config: Config, layout: RunLayout, args: argparse.Namespace) -> dict[str, Any]:
    """The steps after `features` for the dataset's cells (training/planning/profile_steps.py)."""
    cells, _, _ = inputs.dataset_size(config, layout, args.images, args.image_bytes)
    wells, source = wells_of(cells, getattr(args, "wells", None))
    return {**profile_steps(cells, wells, subpopulations=config.eval.profile_subpopulations), "wells_source": source}


def _money(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


def plan_text(rows: list[dict], settings: inputs.PlanSettings, standing: dict[str, Any] | None = None,
              profile: dict[str, Any] | None = None) -> str:
    """The table, then each row's warnings and the figures it rests on (once per preset), the back ends'
    fixed cost per hour, the deployment's standing cost per month and the steps after `features`."""
    lines = [f"region {settings.region}; FSx {settings.fsx_capacity_gib} GiB at {settings.fsx_throughput_per_tib} "
             "MB/s/TiB; pretraining for the configured epochs, downstream steps after",
             f"{'preset':<15} {'nodes':>5} {'wall h':>9} {'GPU h':>9} {'cost':>11} {'downstream h':>12}  bottleneck"]
    for row in rows:
        hours = "core h" if row["unit"] == "core_h" else "GPU h"
        lines.append(f"{row['preset']:<15} {row['nodes']:>5} {row['wall_h']:>9.3f} {row['gpu_h']:>9.3f} "
                     f"{_money(row['cost_usd']):>11} {row['downstream_h']:>12.3f}  {row['bottleneck']}"
                     + ("" if hours == "GPU h" else f" ({hours})"))
    lines += standing_summary(standing)
    seen = set()
    for row in rows:
        for warning in row["warnings"]:
            lines.append(f"warning: {row['preset']} x {row['nodes']}: {warning}")
        if row["preset"] not in seen:
            seen.add(row["preset"])
            price = row["price"]
            lines.append(f"{row['preset']}: " + "; ".join(f"{k}: {v}" for k, v in row["basis"].items())
                         + (f"; price: ${price['usd_per_hour']}/h, {price['source']}, {price['date']}" if price else ""))
    lines += fixed_text(next((row["fixed"] for row in rows if row.get("fixed")), None))
    lines += standing_text(standing)
    lines += profile_steps_text(profile)
    return "\n".join(lines)


def plan_payload(rows: list[dict], settings: inputs.PlanSettings, seconds: float,
                 standing: dict[str, Any] | None = None, profile: dict[str, Any] | None = None) -> dict[str, Any]:
    """What `--json` and `--save` keep: the settings planned for, the rows, the standing cost, the steps
    after `features` and the planner's time."""
    return {"settings": vars(settings) | {"presets": list(settings.presets)}, "rows": rows, "standing": standing,
            "profile_steps": profile, "seconds": round(seconds, 3)}


def write_plan(payload: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, payload, indent=2)
    log.info("wrote %s", path)
