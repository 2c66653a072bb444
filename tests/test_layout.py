"""The layout of tests/, checked over the tree: a module's tests are found from the module's path.

- each test folder mirrors a source folder: tests/training/<pkg>/ is training/<pkg>/, tests/infra/<pkg>/ is
  stacks/<pkg>/, tests/slurm/ is slurm/, tests/bootstrap/ is bootstrap/ (a folder of data files only, such as
  tests/data/ or a snapshot folder, mirrors nothing);
- a test folder whose source package has sub-packages is not flat: its tests sit in the sub-package's folder,
  and a test file named after a sub-package (test_recovery_spot.py beside training/recovery/) sits in that folder;
- helpers the tests share live in tests/support/, which holds no test file; every other module under tests/
  is a test file, a conftest.py or an __init__.py;
- every folder of Python files is a package, so that test files of the same name in two folders are two
  modules (tests.training.recovery.test_spot, ...), not one.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MIRRORS = {"training": "training", "infra": "stacks", "slurm": "slurm", "bootstrap": "bootstrap"}
"""Each top folder of tests/ and the source folder it mirrors."""
SUPPORT = "support"


def python_folders(tests: Path) -> list[Path]:
    """Folders under `tests` (itself included) that hold Python files, caches left out."""
    return sorted({p.parent for p in tests.rglob("*.py") if "__pycache__" not in p.parts})


def sub_packages(folder: Path) -> set[str]:
    return {d.name for d in folder.iterdir() if d.is_dir() and (d / "__init__.py").exists()}


def unmirrored_folders(repo: Path, mirrors: dict[str, str] = MIRRORS) -> list[str]:
    """Test folders with no source folder of the same path."""
    tests = repo / "tests"
    found = []
    for folder in python_folders(tests):
        parts = folder.relative_to(tests).parts
        if not parts or parts[0] == SUPPORT:
            continue
        source = mirrors.get(parts[0])
        if source is None or not (repo / source).joinpath(*parts[1:]).is_dir():
            found.append(str(folder.relative_to(repo)))
    return found


def misplaced_tests(repo: Path, mirrors: dict[str, str] = MIRRORS) -> list[str]:
    """Test files in a flat folder whose source package has sub-packages, and test files named after a
    sub-package that sit beside it rather than in its folder, each with the folder it belongs in."""
    tests = repo / "tests"
    found = []
    for folder in python_folders(tests):
        parts = folder.relative_to(tests).parts
        if not parts or parts[0] not in mirrors:
            continue
        source = (repo / mirrors[parts[0]]).joinpath(*parts[1:])
        subs = sub_packages(source) if source.is_dir() else set()
        if not subs:
            continue
        test_files = sorted(folder.glob("test_*.py"))
        flat = not any(d.is_dir() and d.name in subs for d in folder.iterdir())
        for path in test_files:
            stem = path.stem.removeprefix("test_")
            named = next((sub for sub in sorted(subs) if stem == sub or stem.startswith(sub + "_")), None)
            if named:
                found.append(f"{path.relative_to(repo)}: belongs in {folder.relative_to(repo)}/{named}/")
            elif flat:
                found.append(f"{path.relative_to(repo)}: {source.relative_to(repo)}/ has sub-packages "
                             f"({', '.join(sorted(subs))}): put it in the folder of the one it tests")
    return found


def stray_modules(repo: Path) -> list[str]:
    """Helper modules outside tests/support/, and test files or conftests inside it."""
    tests = repo / "tests"
    found = []
    for path in sorted(tests.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        in_support = path.relative_to(tests).parts[0] == SUPPORT
        is_test = path.name.startswith("test_") or path.name == "conftest.py"
        if path.name == "__init__.py":
            continue
        if in_support == is_test:
            found.append(str(path.relative_to(repo)))
    return found


def folders_without_init(repo: Path) -> list[str]:
    return [str(folder.relative_to(repo)) for folder in python_folders(repo / "tests")
            if not (folder / "__init__.py").exists()]


def test_every_test_folder_mirrors_a_source_folder():
    assert unmirrored_folders(REPO) == []


def test_no_test_file_sits_in_a_flat_folder_over_sub_packages():
    assert misplaced_tests(REPO) == []


def test_helpers_live_in_tests_support_and_only_there():
    assert stray_modules(REPO) == []


def test_every_test_folder_is_a_package():
    assert folders_without_init(REPO) == []


def write(root: Path, *paths: str) -> None:
    for name in paths:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("")


def test_the_checks_find_planted_faults(tmp_path):
    """A small repository with one fault of each kind, and each check names it (and nothing else)."""
    write(tmp_path, "training/__init__.py", "training/recovery/__init__.py", "training/recovery/spot.py",
          "training/data/__init__.py", "training/data/ingest/__init__.py", "training/data/tiff.py",
          "training/logs.py")
    write(tmp_path, "tests/__init__.py", "tests/support/__init__.py", "tests/support/tiny.py",
          "tests/support/test_tiny.py",
          "tests/training/__init__.py", "tests/training/test_logs.py", "tests/training/test_recovery_spot.py",
          "tests/training/tiny_helpers.py",
          "tests/training/data/__init__.py", "tests/training/data/test_tiff.py",
          "tests/training/costs/test_bill.py",
          "tests/data/nuclei.tif")
    assert unmirrored_folders(tmp_path) == ["tests/training/costs"]
    assert misplaced_tests(tmp_path) == [
        "tests/training/test_recovery_spot.py: belongs in tests/training/recovery/",
        "tests/training/data/test_tiff.py: training/data/ has sub-packages (ingest): put it in the folder of "
        "the one it tests"]
    assert stray_modules(tmp_path) == ["tests/support/test_tiny.py", "tests/training/tiny_helpers.py"]
    assert folders_without_init(tmp_path) == ["tests/training/costs"]
    write(tmp_path, "tests/training/data/ingest/__init__.py", "tests/training/data/ingest/test_table.py")
    assert misplaced_tests(tmp_path) == ["tests/training/test_recovery_spot.py: belongs in tests/training/recovery/"]
