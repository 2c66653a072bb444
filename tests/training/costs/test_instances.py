"""The one table of instance facts: every fact sourced and dated, and every reader takes it from there."""

from __future__ import annotations

import re

import pytest

from training.costs import prices
from training.costs.instances import GPUS, INSTANCES, READ, SOURCED_FACTS, peak_flops_of
from training.costs.scaling import PRESETS as NETWORK


def _dated_or_assumed(source: str) -> bool:
    dated = READ in source or re.search(r"read \d{4}-\d{2}-\d{2}", source)
    return bool(dated) or source.startswith("assumed") or "not re-read" in source


def test_every_fact_names_a_dated_source_or_says_it_is_assumed():
    for facts in INSTANCES.values():
        assert set(SOURCED_FACTS) <= set(facts.sources), facts.instance_type
        for name in SOURCED_FACTS:
            assert _dated_or_assumed(facts.sources[name]), (facts.instance_type, name)
    for gpu in GPUS.values():
        assert READ in gpu.source and re.search(r"\d", gpu.source), gpu.model


def test_the_issue_s_presets_are_there_with_their_gpus():
    expected = {"g4dn.12xlarge": "T4", "g5.12xlarge": "A10G", "g6e.12xlarge": "L40S", "p4d.24xlarge": "A100",
                "p5.48xlarge": "H100", "p5en.48xlarge": "H200"}
    assert {name: facts.gpu.model for name, facts in INSTANCES.items()} == expected
    assert INSTANCES["p5en.48xlarge"].gpu.memory_gb > INSTANCES["p5.48xlarge"].gpu.memory_gb


def test_every_preset_has_a_dated_us_east_1_price():
    for name in INSTANCES:
        price = prices.on_demand(name, "us-east-1")
        assert price is not None and price.usd_per_hour > 0 and price.date == READ, name
    assert prices.on_demand("g5.12xlarge", "ap-south-2") is None


def test_the_scaling_model_and_the_cluster_read_the_same_table():
    from stacks.shared.presets import PRESETS

    assert set(NETWORK) == set(PRESETS) == set(INSTANCES)
    for name, facts in INSTANCES.items():
        assert (NETWORK[name].gpus_per_node, NETWORK[name].peak_tflops) == (facts.gpus, facts.gpu.peak_tflops)
        assert (PRESETS[name].gpus_per_node, PRESETS[name].vcpus, PRESETS[name].efa) == (
            facts.gpus, facts.vcpus, facts.efa)


@pytest.mark.parametrize(("device", "peak"), [
    ("NVIDIA H100 PCIe", 756e12), ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA L40S", 362.05e12),
    ("NVIDIA L4", 121e12), ("Tesla T4", 65e12), ("NVIDIA A10G", 70e12), ("NVIDIA RTX A6000", None)])
def test_bench_step_finds_a_gpu_s_peak_by_its_device_name_in_the_same_table(device, peak):
    assert peak_flops_of(device) == peak


def test_every_price_in_the_table_has_a_source_and_a_date_and_the_default_head_and_login_nodes_have_one():
    entries = [price for table in (prices.ON_DEMAND, prices.PCS_FEES) for region in table.values()
               for price in region.values()]
    assert entries and all(re.fullmatch(r"\d{4}-\d{2}-\d{2}", p.date) and len(p.source) > 30 for p in entries)
    from stacks.shared.settings import ClusterSettings

    defaults = ClusterSettings()
    for instance_type in (defaults.head_node_instance_type, defaults.login_node_instance_type):
        assert prices.on_demand(instance_type, "us-east-1").usd_per_hour > 0, instance_type
    assert prices.pcs_fee("controller", "SMALL", "ap-south-2") is None
