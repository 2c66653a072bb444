"""`make clean`, run for real on a copy of what the targets leave behind: it removes every run the targets
write under runs/ (their folders read from the configs the targets use) and no other run there."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from training.config import load_config

REPO = Path(__file__).resolve().parents[1]
NEW_PLATES = "configs/screen_new_plates.yaml"
"""The new plates docs/training.md profiles with make screen's model ("Profiling new plates with a trained model")."""


def target_configs() -> list[str]:
    """The configs `make demo` and `make screen` run (their scripts' defaults), and the new plates' config."""
    found = []
    for script, variable in (("scripts/demo.sh", "DEMO_CONFIG"), ("scripts/screen.sh", "SCREEN_CONFIG")):
        match = re.search(rf"\${{{variable}:-([^}}]+)}}", (REPO / script).read_text())
        assert match, f"{script} no longer defaults {variable}: say here which config its target runs"
        found.append(match[1])
    assert NEW_PLATES in (REPO / "docs" / "training.md").read_text()
    return [*found, NEW_PLATES]


def written_runs() -> set[str]:
    """runs/<NAME> of every folder those configs write or generate their data in."""
    runs = set()
    for name in target_configs():
        config = load_config(REPO / name)
        for path in filter(None, (config.run.output_dir, config.data.source, config.ingest.table)):
            parts = Path(str(path)).parts
            assert parts[0] == "runs", f"{name}: {path} is not under runs/, which make clean tidies"
            runs.add(f"runs/{parts[1]}")
    return runs


def test_make_clean_removes_the_targets_runs_and_keeps_the_users(tmp_path):
    made = written_runs()
    assert made == {"runs/demo", "runs/screen", "runs/screen_new_plates"}
    users = ["runs/mine/checkpoints/checkpoint.pth", "runs/remote/demo/report.html", "runs/demo-channels/knn.json",
             "configs/demo.yaml"]
    for relative in [*(f"{run}/data/load_data.csv" for run in made), "cdk.out/manifest.json", *users]:
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text("x")
    result = subprocess.run(["make", "--no-print-directory", "-f", str(REPO / "Makefile"), "-C", str(tmp_path),
                             "clean"], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    left = sorted(path.relative_to(tmp_path).as_posix() for path in tmp_path.rglob("*") if path.is_file())
    assert left == sorted(users)
    assert not (tmp_path / "cdk.out").exists() and (tmp_path / "runs").is_dir()
