"""What the CloudWatch agent's configuration file may hold, for the parts this project writes
(bootstrap/cloudwatch-agent.json): keys and values as the agent documents them, read 2026-11-24
from the agent's own JSON schema and translator (aws/amazon-cloudwatch-agent at ab55b8d:
translator/config/schema.json, translator/translate/metrics/config/registered_metrics.go and
plugin_alias_map.go, whose sample validNvidiaGpuConfig.json uses `nvidia_gpu`). No package ships the
agent or its schema, so these are written out here; a key or value outside them fails the check."""

from __future__ import annotations

import re
from typing import Any

TOP = {"agent", "metrics", "logs", "traces"}
METRICS = {"namespace", "aggregation_dimensions", "append_dimensions", "metrics_collected", "force_flush_interval",
           "credentials", "endpoint_override"}
EC2_DIMENSIONS = {"ImageId": "${aws:ImageId}", "InstanceId": "${aws:InstanceId}",
                  "InstanceType": "${aws:InstanceType}", "AutoScalingGroupName": "${aws:AutoScalingGroupName}"}
"""The only append_dimensions the agent fills in (its schema's description)."""
NVIDIA_GPU = {"measurement", "metrics_collection_interval", "append_dimensions"}
NVIDIA_MEASUREMENTS = {"utilization_gpu", "temperature_gpu", "power_draw", "utilization_memory", "fan_speed",
                       "memory_total", "memory_used", "memory_free", "pcie_link_gen_current",
                       "pcie_link_width_current", "encoder_stats_session_count", "encoder_stats_average_fps",
                       "encoder_stats_average_latency", "clocks_current_graphics", "clocks_current_sm",
                       "clocks_current_memory", "clocks_current_video"}
LOGS = {"logs_collected", "metrics_collected", "log_stream_name", "force_flush_interval", "credentials",
        "endpoint_override", "concurrency"}
COLLECT_ITEM = {"file_path", "log_group_name", "log_stream_name", "log_group_class", "multi_line_start_pattern",
                "timestamp_format", "timezone", "trim_timestamp", "encoding", "auto_removal", "backpressure_mode",
                "blacklist", "publish_multi_logs", "retention_in_days", "filters"}
FILTER = {"type", "expression"}
LOG_NAME_PLACEHOLDERS = {"{instance_id}", "{hostname}", "{local_hostname}", "{ip_address}"}


def _only(found: dict, allowed: set[str], where: str) -> None:
    extra = set(found) - allowed
    assert not extra, f"{where}: keys the agent does not document: {sorted(extra)}"


def check_agent_config(config: dict[str, Any]) -> None:
    _only(config, TOP, "top level")
    metrics = config["metrics"]
    _only(metrics, METRICS, "metrics")
    assert 1 <= len(metrics["namespace"]) <= 255 and not metrics["namespace"].startswith(":")
    for key, value in metrics.get("append_dimensions", {}).items():
        assert EC2_DIMENSIONS.get(key) == value, f"append_dimensions {key}={value}: only the EC2 ones are filled in"
    for dimensions in metrics.get("aggregation_dimensions", []):
        assert isinstance(dimensions, list) and len(dimensions) <= 30
    (plugin,) = metrics["metrics_collected"]
    assert plugin == "nvidia_gpu"
    gpu = metrics["metrics_collected"]["nvidia_gpu"]
    _only(gpu, NVIDIA_GPU, "nvidia_gpu")
    assert set(gpu["measurement"]) <= NVIDIA_MEASUREMENTS
    assert gpu["metrics_collection_interval"] >= 1
    logs = config["logs"]
    _only(logs, LOGS, "logs")
    (source,) = logs["logs_collected"]
    assert source == "files"
    items = logs["logs_collected"]["files"]["collect_list"]
    assert items and len({str(sorted(item.items())) for item in items}) == len(items)  # uniqueItems
    for item in items:
        _only(item, COLLECT_ITEM, "collect_list item")
        assert item["file_path"].startswith("/")
        for key in ("log_group_name", "log_stream_name"):
            assert 1 <= len(item[key]) <= 512
        stream_placeholders = set(re.findall(r"\{[a-z_]+\}", item["log_stream_name"]))
        assert stream_placeholders <= LOG_NAME_PLACEHOLDERS, item["log_stream_name"]
        for rule in item.get("filters", []):
            _only(rule, FILTER, "filter")
            assert rule["type"] in ("include", "exclude")
            re.compile(rule["expression"])
