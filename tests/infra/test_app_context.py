"""app.py merges cdk.json defaults, the settings file and `-c key=value` overrides, in that order."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import aws_cdk as cdk
import pytest

from stacks.shared.settings import SettingsError

pytestmark = pytest.mark.slow

APP_PY = Path(__file__).resolve().parents[2] / "app.py"


def _app_module():
    spec = importlib.util.spec_from_file_location("scdino_cdk_app", APP_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_precedence_defaults_then_file_then_single_keys(tmp_path):
    settings_file = tmp_path / "site.yaml"
    settings_file.write_text("cluster:\n  max_nodes: 6\n  min_nodes: 1\nstorage:\n  retain: false\n")
    app = cdk.App(context={
        "scdino": {"cluster": {"max_nodes": 3, "presets": ["p4d.24xlarge"]}},
        "settings": str(settings_file),
        "cluster.max_nodes": "8",
    })
    settings = _app_module().settings_from_context(app)
    assert settings.cluster.presets == ("p4d.24xlarge",)
    assert (settings.cluster.min_nodes, settings.cluster.max_nodes) == (1, 8)
    assert settings.storage.retain is False


def test_feature_flags_in_context_are_not_mistaken_for_settings():
    app = cdk.App(context={"@aws-cdk/core:target-partitions": ["aws"], "scdino": {}})
    assert _app_module().settings_from_context(app).cluster.max_nodes == 2


def test_unknown_key_in_the_defaults_is_named():
    app = cdk.App(context={"scdino": {"cluster": {"nodes": 3}}})
    with pytest.raises(SettingsError, match="setting cluster.nodes: unknown setting"):
        _app_module().settings_from_context(app)
