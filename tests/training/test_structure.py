"""The package's structure, as docs/architecture.md states it: checked over the source, not trusted.

- no import circles between modules of training/ (function-level imports count too);
- a pipeline step imports no other step;
- what a run costs (training/costs/: the instance table, the dated prices, the FLOP count, the scaling
  model and the bill) sits on the ground floor: standard library and each other only (the FLOP count
  also reads the ViT sizes), so that the planner reads it instead of the benchmarks; no room but the
  planner itself and the steps imports the planner;
- rundir/ holds the run directory's names and readers only; the run summary is training/results.py;
- stacks/ (the CDK app, every sub-package) reads nothing of the package but the instance table and the
  dotted-key conversion its settings share with the run configuration (training/config/dotted.py,
  standard library only);
- only training/rundir/layout.py spells a run file's name, or a run folder's as a path component
  (code and shell scripts ask it);
- the command line starts without torch, numpy or the step libraries;
- no library imports the command line (training/cli.py): it stands on top, and what a library shares
  with it (how each rank logs) lives in training/logs.py.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from training.cli import main
from training.rundir import RunLayout

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "training"
PATH_OWNER = PACKAGE / "rundir" / "layout.py"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imported_modules(path: Path, modules: dict[str, Path]) -> set[str]:
    """Modules of the package that `path` imports anywhere in its body, resolved to known modules."""
    def known(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {known(a.name) for a in node.names if a.name.startswith("training")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("training"):
            for alias in node.names:
                target = f"{node.module}.{alias.name}"
                found.add(target if target in modules else known(node.module))
    return found - {"", module_name(path)}


def import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    return {name: imported_modules(path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_cycle_finder_finds_a_planted_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_no_import_circles_in_the_package():
    assert cycles(import_graph()) == []


def test_steps_import_no_other_step():
    graph = import_graph()
    offenders = {name: sorted(m for m in deps if m.startswith("training.steps.") and m != "training.steps")
                 for name, deps in graph.items() if name.startswith("training.steps.")}
    assert {name: deps for name, deps in offenders.items() if deps} == {}


def step_modules() -> dict[str, ast.Module]:
    return {path.stem: ast.parse(path.read_text()) for path in sorted((PACKAGE / "steps").glob("*.py"))
            if path.stem != "__init__"}


def function_parameters(tree: ast.Module, name: str) -> str | None:
    """`name`'s parameters as the docstring writes them ("config, layout, args"), None without it."""
    found = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == name]
    return ", ".join(arg.arg for arg in found[0].args.args) if found else None


def reads_its_own_config(tree: ast.Module) -> bool:
    return any(isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "READS_ITS_OWN_CONFIG"
                                                    for t in node.targets) for node in tree.body)


def documented_signatures(doc: str) -> tuple[str, str | None, str | None]:
    """What training/steps/__init__.py says a step module defines: run's parameters, add_arguments's,
    and run's where the module reads its own configuration (None where it says nothing of it)."""
    run = re.search(r"defines `add_arguments\((\w*)\)` \(optional[^)]*\) and `run\(([^)]*)\)`", doc)
    own = re.search(r"READS_ITS_OWN_CONFIG = True[^)]*\), defines `run\(([^)]*)\)` instead", doc)
    assert run, "training/steps/__init__.py no longer says what a step module defines"
    return run[2], run[1], own[1] if own else None


def test_every_step_module_defines_what_the_steps_package_says():
    """training/steps/__init__.py's docstring once said `run(config, args)` while every step took the
    layout too: each module's run and add_arguments are checked against what it says now."""
    import training.steps
    from training.cli import STEPS

    run, add_arguments, own = documented_signatures(training.steps.__doc__)
    modules = step_modules()
    assert sorted(STEPS.values()) == sorted(modules)
    expected = {name: own if reads_its_own_config(tree) else run for name, tree in modules.items()}
    assert {name: function_parameters(tree, "run") for name, tree in modules.items()} == expected
    flags = {name: function_parameters(tree, "add_arguments") for name, tree in modules.items()}
    assert {name: found for name, found in flags.items() if found not in (None, add_arguments)} == {}


def test_the_step_signature_check_reads_the_docstring():
    doc = ("Each module defines `add_arguments(parser)` (optional: flags) and `run(config, args)`, the\n"
           "status. One (`READS_ITS_OWN_CONFIG = True`: `chain`), defines `run(args)` instead.")
    assert documented_signatures(doc) == ("config, args", "parser", "args")
    assert documented_signatures(doc.split(" One")[0]) == ("config, args", "parser", None)


def test_no_library_imports_the_command_line():
    """The command line imports every step (by name); a library that imported it would stand under
    the whole house. The process-group module (now distributed/groups.py) once did, for the ranks
    logger's name: three floors of it."""
    graph = import_graph()
    assert sorted(name for name, deps in graph.items()
                  if "training.cli" in deps and name != "training.__main__") == []


GROUND_FLOOR = {
    "training.costs.instances": set(),
    "training.costs.prices": {"training.costs.instances"},
    "training.costs.bill": {"training.costs.instances", "training.costs.prices"},
    "training.costs.scaling": {"training.costs.instances"},
    "training.costs.flops": {"training.config.archs", "training.config"},
}
"""The rooms every other room may read: what each imports of the package (nothing above them). The FLOP
count reads the ViT sizes (a table that imports nothing) and names the configuration's type only."""


def test_the_cost_package_imports_only_the_ground_floor():
    graph = import_graph()
    costs = {name for name in graph if name.startswith("training.costs.")}
    assert costs == set(GROUND_FLOOR)
    assert {name: graph[name] for name in GROUND_FLOOR} == GROUND_FLOOR


def runtime_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules `path` imports when it runs: those under `if TYPE_CHECKING:` left out."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            node.body = [ast.Pass()]
    found = set()
    for node in ast.walk(tree):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [f"{node.module}.{a.name}" for a in node.names] if isinstance(node, ast.ImportFrom) and node.module
                 else [])
        for name in (n for n in names if n.startswith("training")):
            while name not in modules:
                name = name.rpartition(".")[0]
            found.add(name)
    return found - {module_name(path)}


def test_the_cost_package_imports_nothing_of_the_package_outside_itself_when_it_runs():
    """Only the ViT sizes (training/config/archs.py, which imports nothing): the configuration the FLOP
    count is given is a type annotation, so reading the costs never loads a room above them."""
    modules = package_modules()
    outside = {name: runtime_imports(path, modules) - set(GROUND_FLOOR) for name, path in modules.items()
               if name.startswith("training.costs")}
    assert {name: found for name, found in outside.items() if found - {"training.config.archs"}} == {}
    assert imported_modules(modules["training.config.archs"], modules) == set()


@pytest.mark.parametrize("module", sorted(GROUND_FLOOR))
def test_the_ground_floor_needs_only_the_standard_library(module):
    tree = ast.parse(package_modules()[module].read_text())
    top = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    top |= {node.module.split(".")[0] for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module}
    assert top - set(sys.stdlib_module_names) - {"training"} == set()


def test_the_planner_reads_the_costs_not_the_benchmarks():
    """The planner sits beside the benchmarks, not above them: both read training/costs/."""
    graph = import_graph()
    planner = {name: deps for name, deps in graph.items() if name.startswith("training.planning")}
    assert {name: sorted(d for d in deps if d.startswith("training.benchmarks")) for name, deps in planner.items()
            if any(d.startswith("training.benchmarks") for d in deps)} == {}
    assert any(d.startswith("training.costs") for deps in planner.values() for d in deps)


RUN_DIRECTORY = {"__init__.py", "layout.py", "tags.py", "features.py", "artifacts.py", "integrity.py"}
"""rundir/: the run's file names (layout, tags), their formats and readers (features, artifacts, integrity)."""


def test_the_run_directory_holds_its_names_and_readers_only():
    """What a step makes of the run's files lives in that step's library (results.json: training/results.py)."""
    rundir = PACKAGE / "rundir"
    assert {p.name for p in rundir.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()} == RUN_DIRECTORY


def test_only_the_planner_and_the_steps_import_the_planner():
    graph = import_graph()
    readers = {name for name, deps in graph.items() if any(d.startswith("training.planning") for d in deps)}
    assert {name for name in readers if not name.startswith(("training.planning", "training.steps"))} == set()


CDK_APP_READS = {"training.costs.instances", "training.config.dotted"}
"""All the CDK app reads of the package: the instance table and the dotted-key conversion."""


def test_the_cdk_app_reads_only_the_instance_table_and_the_dotted_key_conversion():
    stacks = sorted((REPO / "stacks").rglob("*.py"))
    assert stacks
    modules = package_modules()
    used = {module for path in stacks for module in imported_modules(path, modules)}
    assert used == CDK_APP_READS


def test_the_dotted_key_conversion_needs_only_the_standard_library():
    """The CDK app imports it (through training/config/__init__.py, which loads no torch or numpy either)."""
    path = package_modules()["training.config.dotted"]
    tree = ast.parse(path.read_text())
    top = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    top |= {node.module.split(".")[0] for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module}
    assert top - set(sys.stdlib_module_names) == set()
    loaded = subprocess.run([sys.executable, "-c", "import sys, training.config.dotted; "
                             "print(sorted({'torch', 'numpy'} & set(sys.modules)))"],
                            cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]"


def stacks_imports(room: str) -> set[str]:
    """The rooms of stacks/ (shared, parallelcluster, pcs) that the modules of stacks/<room>/ import."""
    found = set()
    for path in (REPO / "stacks" / room).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            found |= {name.split(".")[1] for name in names if name.startswith("stacks.") and name.count(".") >= 2}
    return found - {room}


def test_a_back_end_of_the_cdk_app_imports_shared_and_never_the_other_back_end():
    """docs/architecture.md: stacks/shared/ imports no back end; each back end imports only shared/."""
    assert stacks_imports("shared") == set()
    assert stacks_imports("parallelcluster") == {"shared"}
    assert stacks_imports("pcs") == {"shared"}


def run_file_names() -> set[str]:
    """File names of the run directory, from the layout itself (files have an extension, the
    pre-emption marker is in capitals, the parts' folder beside packed/ is packed.parts)."""
    names = {path.name for path in RunLayout(Path("run")).named_paths().values()}
    return {n for n in names if "." in n or n.isupper()}


def run_folder_names() -> set[str]:
    """Folder names of the run directory (packed, knn, plots, ...), from the layout itself: words used
    elsewhere too, so they count only where they are a component of a path (run_paths_spelled_in)."""
    layout = RunLayout(Path("run"))
    return {path.name for path in layout.named_paths().values()} - run_file_names() - {layout.root.name}


def beside_folder_suffixes() -> set[str]:
    """The suffixes of names the layout makes beside a run folder from its name (".parts" of packed.parts)."""
    paths = RunLayout(Path("run")).named_paths().values()
    return {path.name[len(other.name):] for path in paths for other in paths
            if path.parent == other.parent and path.name.startswith(f"{other.name}.")}


RUN_PATH_EXPRESSION = re.compile(r"layout|root|output_dir|packed|\brun\b")
"""Code that names a run path: the layout, a run's root or output_dir, the packed dataset's folder."""


def docstrings(tree: ast.AST) -> set[int]:
    """Bare string statements: module, class and function docstrings and attribute docstrings."""
    return {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}


def folder_as_component(folder: str, text: str, in_fstring: bool) -> bool:
    """`folder` is a component of a path spelled in `text`: beside another component ("runs/demo/packed",
    "knn/knn.json"), or, in a piece of an f-string, joined onto what comes before it (f"{root}/packed")."""
    name = re.escape(folder)
    if re.search(rf"[\w.*-]/{name}(?![\w.-])|(?<![\w.-]){name}/[\w.*]", text):
        return True
    return in_fstring and re.match(rf"/{name}(?![\w.-])", text) is not None


def run_paths_spelled_in(source: str, where: str, files: set[str], folders: set[str]) -> list[str]:
    """Where code (not docstrings) spells a run path instead of asking the layout: a string constant
    holding a run file's name, or a run folder's name as a path component (folder_as_component), or
    the suffix of a name made beside a run folder (".parts" of packed.parts); and a run folder's name
    joined with `/` onto code that names a run path (layout.root / "knn", Path(output_dir) / "packed")."""
    tree = ast.parse(source)
    skip = docstrings(tree)
    in_fstrings = {id(piece) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for piece in node.values}
    suffixes = beside_folder_suffixes()
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            found = {name for name in files if name in node.value} | ({node.value} & suffixes)
            found |= {name for name in folders if folder_as_component(name, node.value, id(node) in in_fstrings)}
            hits += [f"{where}:{node.lineno}: {name}" for name in sorted(found)]
        elif (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant)
              and node.right.value in folders and RUN_PATH_EXPRESSION.search(ast.unparse(node.left))):
            hits.append(f"{where}:{node.lineno}: {node.right.value}")
    return hits


def test_only_the_layout_names_run_files():
    files, folders = run_file_names(), run_folder_names()
    assert {"knn.json", "results.json", "labels.json", "PREEMPTED", "manifest.json", "packed.parts"} <= files
    assert {"packed", "checkpoints", "knn", "plots", "features"} <= folders
    hits = [hit for path in sorted(PACKAGE.rglob("*.py")) if path != PATH_OWNER
            for hit in run_paths_spelled_in(path.read_text(), str(path.relative_to(REPO)), files, folders)]
    assert hits == []


PLANTED = '''
def offenders(layout, config, root, name):
    knn = Path(config.run.output_dir) / "knn"
    checkpoints = layout.root / "checkpoints"
    packed = "runs/demo/packed"
    plots = f"{root}/plots"
    index = f"{layout.root}/packed/{name}"
    parts = layout.packed.with_name(layout.packed.name + ".parts")
    results = root / "results.json"
'''
"""One run path spelled on each line from the third: without a dot or capitals (but the last two)."""

INNOCENT = '''
def innocent(scratch, layout, tag):
    """Writes runs/demo/packed and knn/knn.json (a docstring may say so)."""
    log.info("linear probe on features/%s", tag)
    return scratch / "packed", layout.knn_json, "checkpoints are kept", "plots", "a/b/features_x"
'''
"""Run folders' names as words, a scratch folder of the same name, the layout asked."""


def test_the_run_path_check_finds_planted_offenders():
    files, folders = run_file_names(), run_folder_names()
    hits = run_paths_spelled_in(PLANTED, "planted.py", files, folders)
    assert sorted(int(hit.split(":")[1]) for hit in hits) == list(range(3, 10))
    assert run_paths_spelled_in(INNOCENT, "innocent.py", files, folders) == []


RUNDIR = PACKAGE / "rundir"

WRITTEN_IN_RUNDIR = ("bad_images",)
"""Run files rundir/ writes as well as reads (bad_images.json: two steps write it in one format, later
steps read it): anywhere else their path appears only inside an f-string, a message naming it."""


def feature_set_file_names() -> set[str]:
    """The files of a feature set (features/<tag>/), as rundir/ names them (its *_FILE constants)."""
    return {node.value.value for path in RUNDIR.glob("*.py") for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
            and any(getattr(target, "id", "").endswith("_FILE") for target in node.targets)}


def run_files_handled_in(source: str, where: str) -> list[str]:
    """Where code outside rundir/ handles a run file that rundir/ owns: a path of WRITTEN_IN_RUNDIR
    used other than inside an f-string, or a feature-set file spelled, or joined onto a feature-set
    folder (layout.features(tag) / "index.json")."""
    tree = ast.parse(source)
    quoted = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for inner in ast.walk(node)}
    skip = docstrings(tree)
    names = feature_set_file_names()
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in WRITTEN_IN_RUNDIR and id(node) not in quoted:
            hits.append(f"{where}:{node.lineno}: {node.attr}")
        elif (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant)
              and node.right.value in names and "features" in ast.unparse(node.left)):
            hits.append(f"{where}:{node.lineno}: {node.right.value}")
        elif (isinstance(node, ast.Constant) and id(node) not in skip and node.value in names - {"index.json"}):
            hits.append(f"{where}:{node.lineno}: {node.value}")
    return hits


def test_the_files_rundir_owns_are_written_and_read_there_only():
    """bad_images.json was written by data/dataset.py and read by rundir/artifacts.py; a benchmark
    joined "index.json" onto a feature set's folder. The packed dataset's own index.json is the
    store's (training/data/store/format.py), hence only a join onto a feature-set folder counts."""
    assert {"features.npy", "rows.npy", "index.json"} <= feature_set_file_names()
    hits = [hit for path in sorted(PACKAGE.rglob("*.py")) if RUNDIR not in path.parents
            for hit in run_files_handled_in(path.read_text(), str(path.relative_to(REPO)))]
    assert hits == []


def test_the_rundir_file_check_finds_planted_offenders():
    planted = ('def offenders(layout, tag, bad):\n'
               '    write_json_atomic(layout.bad_images, bad)\n'
               '    done = layout.features(tag) / "index.json"\n'
               '    rows = np.load(folder / "rows.npy")\n'
               '    log.warning("see %s", layout.bad_images)\n'
               '    raise UserError(f"none readable: see {layout.bad_images}")\n'
               '    return layout.packed / "index.json"\n')
    assert sorted(int(hit.split(":")[1]) for hit in run_files_handled_in(planted, "planted.py")) == [2, 3, 4, 5]


def shell_code_lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")]


@pytest.mark.parametrize("script", [*sorted((REPO / "slurm").glob("*.slurm")), *sorted((REPO / "slurm").glob("*.sh")),
                                    REPO / "scripts" / "demo.sh"], ids=lambda p: p.name)
def test_shell_scripts_ask_python_for_run_paths(script):
    names = run_file_names()
    hits = [f"{script.name}: {line.strip()}" for line in shell_code_lines(script)
            for name in names if re.search(rf"[/\"'$ ]{re.escape(name)}\b", line)]
    assert hits == []


def test_the_command_line_starts_without_heavy_imports():
    code = ("import sys; from training.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('torch', 'numpy', 'timm', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_paths_prints_the_layouts_paths(tmp_path):
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["paths", "--set", f"run.output_dir={tmp_path / 'r'}", "--set", "data.packed_dir=/scratch/p",
                     "root", "packed", "preempted_marker", "results"])
    assert code == 0
    assert out.getvalue().split() == [str(tmp_path / "r"), "/scratch/p", str(tmp_path / "r" / "checkpoints" / "PREEMPTED"),
                                      str(tmp_path / "r" / "results.json")]


def test_paths_refuses_an_unknown_name(tmp_path, capsys):
    assert main(["paths", "--set", f"run.output_dir={tmp_path}", "reslts"]) == 2
    assert "unknown path name(s) reslts; known: root, packed" in capsys.readouterr().err


MAX_ROOM_ENTRIES = 12
"""A room a newcomer reads at a glance: its modules and subfolders, __init__.py included."""


def room_entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()
                  if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").is_file()))


def test_no_room_of_the_package_holds_more_than_twelve_entries():
    """steps/ (one module per command) aside."""
    rooms = [p for p in PACKAGE.rglob("*") if p.is_dir() and (p / "__init__.py").is_file() and p.name != "steps"]
    crowded = {p.relative_to(REPO).as_posix(): len(room_entries(p)) for p in rooms
               if len(room_entries(p)) > MAX_ROOM_ENTRIES}
    assert crowded == {}


def test_the_package_root_holds_no_more_than_twelve_modules():
    """The root's subfolders are the rooms docs/architecture.md lists; its modules are what lies
    outside every room (the command line, the errors, the logs, the trainer ...): at most twelve."""
    modules = [name for name in room_entries(PACKAGE) if name.endswith(".py")]
    assert len(modules) <= MAX_ROOM_ENTRIES, modules


def test_profiles_live_in_one_room():
    """Well profiles, their normalisation and their export sit together in eval/profiles/; the
    helpers the knn step needs sit beside the metrics they serve (knn.py, retrieval.py)."""
    evaluation = PACKAGE / "eval"
    assert {"wells.py", "normalization.py", "export.py"} <= set(room_entries(evaluation / "profiles"))
    assert not {"export.py", "profiles.py", "profile_normalization.py", "screen.py"} & set(room_entries(evaluation))


MAX_STEP_LOGIC_LINES = 40
"""A step is a thin composition: arguments -> typed request -> library -> files."""


def logic_lines(path: Path) -> int:
    """Lines of code in the bodies of a module's functions and methods: docstrings, comments, blank
    lines, imports and add_arguments (the flags a step declares) aside."""
    import tokenize

    text = path.read_text()
    tree = ast.parse(text)
    skipped = docstrings(tree)
    aside = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) or (isinstance(node, ast.Expr) and id(node.value) in skipped):
            aside |= set(range(node.lineno, node.end_lineno + 1))
    code = {line for token in tokenize.generate_tokens(io.StringIO(text).readline)
            if token.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                                  tokenize.ENDMARKER)
            for line in range(token.start[0], token.end[0] + 1)}
    functions = [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and node.name != "add_arguments"]
    bodies = {line for function in functions for statement in function.body
              for line in range(statement.lineno, statement.end_lineno + 1)}
    return len((bodies & code) - aside)


def test_logic_lines_count_function_bodies_only(tmp_path):
    source = ('"""Doc."""\nimport os\n\n\ndef add_arguments(parser):\n    parser.add_argument("--x")\n\n\n'
              'def run(config, layout, args):\n    """Doc."""\n    # why\n    from a import b\n\n'
              '    value = b(\n        args.x)\n    return 0\n')
    path = tmp_path / "step.py"
    path.write_text(source)
    assert logic_lines(path) == 3


@pytest.mark.parametrize("step", sorted(p.stem for p in (PACKAGE / "steps").glob("*.py") if p.stem != "__init__"))
def test_every_step_is_a_thin_composition(step):
    lines = logic_lines(PACKAGE / "steps" / f"{step}.py")
    assert lines <= MAX_STEP_LOGIC_LINES, (f"steps/{step}.py has {lines} lines of logic: move the work into the "
                                           "library it calls")
