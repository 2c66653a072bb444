"""One snapshot per stack, asset hashes masked, so that any template change is a reviewed diff.

Update after an intended change: `.venv/bin/python -m pytest tests/infra/test_snapshots.py --snapshot-update`.
"""

from __future__ import annotations

import json
import re

import pytest

pytestmark = pytest.mark.slow

_ASSET_HASH = re.compile(r"[0-9a-f]{64}")


def masked(template: dict) -> dict:
    """The template with every asset hash (they change with any file in the bundle) replaced."""
    return json.loads(_ASSET_HASH.sub("<asset-hash>", json.dumps(template, sort_keys=True)))


@pytest.mark.parametrize("stack", ["network", "storage", "image", "cluster"])
def test_stack_template_snapshot(synth, snapshot, stack):
    assert masked(synth.json[stack]) == snapshot


@pytest.mark.parametrize("stack", ["image", "cluster"])
def test_pcs_stack_template_snapshot(pcs_synth, snapshot, stack):
    """backend=pcs changes only the image and cluster stacks (the network and storage are the same)."""
    assert masked(pcs_synth.json[stack]) == snapshot


@pytest.mark.parametrize("stack", ["network", "storage"])
def test_network_and_storage_resources_are_the_same_for_both_back_ends(synth, pcs_synth, stack):
    """Only their exports differ: each cluster stack imports what it uses (PCS: the FSx DNS and mount name)."""
    assert masked(pcs_synth.json[stack])["Resources"] == masked(synth.json[stack])["Resources"]
