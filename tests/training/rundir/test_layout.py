"""training/rundir/layout.py's tree and its properties tell the same layout: every path property is in
the tree where it lies, the tree names no path that no property or method gives, and each property
says in one line what it holds."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from training.rundir import RunLayout
from training.rundir import layout as layout_module

TREE_LINE = re.compile(r"^(?P<indent> {4,})(?P<path>\S+)\s+(?P<name>\w+)(?:\((?P<args>[^)]*)\))?$")
"""A line of the tree: the path (a folder ends in /), then the property or the call that gives it."""


def tree_entries(doc: str) -> list[tuple[int, str, str, str | None]]:
    """(depth, path, name, call arguments or None) of every line of the docstring's tree."""
    entries = []
    for line in doc.splitlines():
        match = TREE_LINE.match(line)
        if match and (match["path"].endswith("/") or "." in match["path"] or match["path"].isupper()):
            depth = (len(match["indent"]) - 4) // 2
            entries.append((depth, match["path"], match["name"], match["args"]))
    return entries


def resolve(doc: str, root: Path) -> list[tuple[str, Path, Path | None]]:
    """(name as the tree writes it, the path the tree places it at, the path the layout gives, None
    for a name the layout lacks) of each tree line, a call resolved on the run its folder belongs to
    (`evaluation` on its channel-adaptive model's run)."""
    base = RunLayout(root)
    resolved = []
    placed: list[Path] = []
    runs: list[tuple[int, RunLayout]] = [(-1, base)]
    for depth, path, name, args in tree_entries(doc):
        if depth == 0:
            placed, where = [root], root
        else:
            placed = placed[:depth]
            where = placed[-1] / path.rstrip("/")
        placed.append(where)
        while runs[-1][0] >= depth:
            runs.pop()
        run = runs[-1][1]
        value = getattr(run, name, None)
        if value is None:
            resolved.append((name, where, None))
            continue
        if args is not None:
            value = value(*ast.literal_eval(f"({args},)"))
        if isinstance(value, RunLayout):
            runs.append((depth, value))
            value = value.root
        resolved.append((name if args is None else f"{name}({args})", where, value))
    return resolved


def path_properties() -> list[str]:
    return [name for name, value in vars(RunLayout).items() if isinstance(value, property)]


def test_every_line_of_the_tree_lies_where_its_property_puts_it(tmp_path):
    resolved = resolve(layout_module.__doc__, tmp_path / "run")
    assert len(resolved) > 40
    assert [(name, placed) for name, placed, given in resolved if placed != given] == []


def properties_missing_from(doc: str) -> list[str]:
    named = {name for _, _, name, args in tree_entries(doc) if args is None}
    return sorted(set(path_properties()) - named)


def test_every_path_property_is_in_the_tree():
    assert properties_missing_from(layout_module.__doc__) == []


def without_line(doc: str, path: str) -> str:
    return "\n".join(line for line in doc.splitlines() if line.split()[:1] != [path])


def test_the_tree_check_finds_a_misplaced_line_an_unknown_name_and_a_missing_property(tmp_path):
    doc = layout_module.__doc__
    moved = without_line(doc, "knn.json").replace("      labels.json ", "      knn.json    knn_json\n      labels.json ")
    assert [name for name, placed, given in resolve(moved, tmp_path) if placed != given] == ["knn_json"]
    unknown = doc.replace("knn.md                                  knn_md", "knn.yaml    knn_yaml")
    assert [name for name, placed, given in resolve(unknown, tmp_path) if placed != given] == ["knn_yaml"]
    assert properties_missing_from(without_line(doc, "report.html")) == ["report"]


@pytest.mark.parametrize("name", path_properties())
def test_each_path_property_says_in_one_line_what_it_holds(name):
    doc = getattr(RunLayout, name).__doc__ or ""
    assert doc.strip() and "\n" not in doc.strip() and doc.strip().endswith("."), f"RunLayout.{name}: {doc!r}"
