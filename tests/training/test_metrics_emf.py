"""Rank 0's CloudWatch embedded-metric-format (EMF) lines, checked against the EMF specification
(Amazon CloudWatch User Guide, "Specification: Embedded metric format"): a root object whose `_aws`
metadata holds `Timestamp` (epoch milliseconds) and `CloudWatchMetrics`, an array of directives with
`Namespace`, `Dimensions` (arrays of dimension names) and `Metrics` (`Name`, optional `Unit` and
`StorageResolution`), no other members in those objects, and every dimension (a string) and metric
(a number) it names present at the root."""

from __future__ import annotations

import json
import math

import jsonschema
import pytest

from training.config import load_config
from training.metrics import EMF_FIELDS, MetricsLogger, emf_document
from training.rundir import RunLayout

UNITS = ["Seconds", "Microseconds", "Milliseconds", "Bytes", "Kilobytes", "Megabytes", "Gigabytes", "Terabytes",
         "Bits", "Kilobits", "Megabits", "Gigabits", "Terabits", "Percent", "Count", "Bytes/Second",
         "Kilobytes/Second", "Megabytes/Second", "Gigabytes/Second", "Terabytes/Second", "Bits/Second",
         "Kilobits/Second", "Megabits/Second", "Gigabits/Second", "Terabits/Second", "Count/Second", "None"]
"""CloudWatch's units (MetricDatum.Unit), which the specification's MetricDefinition.Unit takes."""
EMF_SCHEMA = {
    "type": "object", "required": ["_aws"],
    "properties": {"_aws": {
        "type": "object", "required": ["Timestamp", "CloudWatchMetrics"],
        "properties": {
            "Timestamp": {"type": "integer", "minimum": 946684800000, "maximum": 4102444800000},
            "CloudWatchMetrics": {"type": "array", "minItems": 1, "items": {
                "type": "object", "additionalProperties": False, "required": ["Namespace", "Dimensions", "Metrics"],
                "properties": {
                    "Namespace": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[^:].*$"},
                    "Dimensions": {"type": "array", "items": {
                        "type": "array", "maxItems": 30, "items": {"type": "string", "minLength": 1, "maxLength": 250}}},
                    "Metrics": {"type": "array", "maxItems": 100, "items": {
                        "type": "object", "additionalProperties": False, "required": ["Name"],
                        "properties": {"Name": {"type": "string", "minLength": 1, "maxLength": 1024},
                                       "Unit": {"enum": UNITS}, "StorageResolution": {"enum": [1, 60]}}}}}}}}}}}


def check_emf(document: dict) -> None:
    """The schema above, then the references: what each directive names is at the root."""
    jsonschema.validate(document, EMF_SCHEMA)
    assert len(json.dumps(document)) < 256 * 1024
    for directive in document["_aws"]["CloudWatchMetrics"]:
        for dimension in {name for dimension_set in directive["Dimensions"] for name in dimension_set}:
            assert isinstance(document.get(dimension), str), dimension
        for metric in directive["Metrics"]:
            value = document.get(metric["Name"])
            assert isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value), metric


def _record(**extra) -> dict:
    return {"kind": "step", "epoch": 0, "step": 10, "loss": 5.2, "lr": 1e-4, "wd": 0.04, "momentum": 0.996,
            "images_per_s": 210.5, "data_wait_s": 0.01, "step_time_s": 0.14, "gpu_mem_gb": None, "cpu_core_s": 2.0,
            "gpu_s": 0.0, "time": 1795545624.732, **extra}


def test_a_step_record_becomes_a_valid_emf_document():
    document = emf_document(_record(), "demo", "scdino-hpc/Training")
    check_emf(document)
    (directive,) = document["_aws"]["CloudWatchMetrics"]
    assert document["_aws"]["Timestamp"] == 1795545624732
    assert directive["Dimensions"] == [["Run"], []] and document["Run"] == "demo"
    assert [m["Name"] for m in directive["Metrics"]] == ["images_per_s", "loss", "data_wait_s", "step_time_s", "lr"]
    assert {m["Name"]: m["Unit"] for m in directive["Metrics"]}["images_per_s"] == "Count/Second"


def test_the_teacher_entropy_is_published_when_the_loop_records_it():
    record = _record(teacher_entropy=9.1, teacher_batch_entropy=10.2, center_norm=0.3, log_out_dim=11.09,
                     gpu_mem_gb=12.5)
    document = emf_document(record, "demo", "ns")
    check_emf(document)
    names = {m["Name"] for m in document["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    assert {"teacher_entropy", "teacher_batch_entropy", "center_norm", "log_out_dim", "gpu_mem_gb"} <= names
    assert set(EMF_FIELDS) == names


def test_missing_null_boolean_and_non_finite_values_are_left_out():
    document = emf_document(_record(loss=float("nan"), lr=True, step_time_s=None), "demo", "ns")
    check_emf(document)
    assert {m["Name"] for m in document["_aws"]["CloudWatchMetrics"][0]["Metrics"]} == {"images_per_s", "data_wait_s"}
    assert emf_document({"kind": "step", "time": 1.0, "loss": None}, "demo", "ns") is None


def test_the_checker_rejects_what_the_specification_forbids():
    good = emf_document(_record(), "demo", "ns")
    for broken in (
        {**good, "Run": 3},                                                              # dimension not a string
        {k: v for k, v in good.items() if k != "loss"},                                  # metric missing at root
        {**good, "_aws": {**good["_aws"], "Timestamp": 1795545624.7}},                   # seconds, not ms
        {**good, "_aws": {**good["_aws"], "CloudWatchMetrics": [
            {**good["_aws"]["CloudWatchMetrics"][0], "Extra": 1}]}},                      # unknown member
    ):
        with pytest.raises((AssertionError, jsonschema.ValidationError)):
            check_emf(broken)


def _logger(tmp_path, monkeypatch, *, enabled: bool, emf_path) -> MetricsLogger:
    monkeypatch.setenv("SCDINO_EMF_LOG", str(emf_path))
    monkeypatch.setenv("SCDINO_EMF_NAMESPACE", "scdino-hpc/Training")
    config = load_config(None, [f"run.output_dir={tmp_path / 'run'}", "run.name=emf", "run.combination=",
                                "train.tensorboard=false"])
    return MetricsLogger(RunLayout.from_config(config), config, enabled=enabled)


def test_rank_0_appends_one_emf_line_per_step_record(tmp_path, monkeypatch):
    emf = tmp_path / "var" / "log" / "scdino" / "emf.log"
    logger = _logger(tmp_path, monkeypatch, enabled=True, emf_path=emf)
    logger.log(_record(teacher_entropy=8.0))
    logger.log({**_record(), "kind": "epoch"})
    logger.log(_record(step=20))
    lines = [json.loads(line) for line in emf.read_text().splitlines()]
    assert [line["step"] for line in lines] == [10, 20]
    for line in lines:
        check_emf(line)
        assert line["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "scdino-hpc/Training"
        assert line["Run"] == "emf"
    assert lines[0]["teacher_entropy"] == 8.0 and "teacher_entropy" not in lines[1]


def test_other_ranks_write_nothing_and_an_unwritable_path_does_not_stop_training(tmp_path, monkeypatch, caplog):
    quiet = _logger(tmp_path, monkeypatch, enabled=False, emf_path=tmp_path / "emf.log")
    quiet.log(_record())
    assert not (tmp_path / "emf.log").exists()
    blocker = tmp_path / "file"
    blocker.write_text("")
    logger = _logger(tmp_path, monkeypatch, enabled=True, emf_path=blocker / "emf.log")
    logger.log(_record())
    logger.log(_record(step=11))
    assert sum("CloudWatch metrics off" in r.message for r in caplog.records) == 1
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") == 2
