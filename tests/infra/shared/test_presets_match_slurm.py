"""slurm/env.sh must describe the cluster the CDK app creates (stacks/shared/presets.py): each preset's
shape from the site file the nodes render from the deploy's pointer, the default preset's without one."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from stacks.shared.constants import BUNDLE_DIR, FSX_MOUNT_DIR, IMAGE_VENV, NCCL_TESTS_BIN, SCRATCH_DIR
from stacks.shared.presets import DEFAULT_PRESET, PRESETS, SLURM_DEFAULTS, node_shape

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[3]
ENV_SH = REPO_ROOT / "slurm" / "env.sh"
RENDERER = REPO_ROOT / "bootstrap" / "cluster-env.py"
SHAPE = ("SCDINO_PARTITION", "SCDINO_GPUS_PER_NODE", "SCDINO_CPUS_PER_GPU", "SCDINO_INSTANCE_TYPE", "SCDINO_CPUS_PER_TASK")
# VAR=${VAR:-default} or export VAR="${VAR:-default}"
_ASSIGN = re.compile(r'^\s*(?:export\s+)?(?P<name>[A-Z_][A-Z0-9_]*)="?\$\{(?P=name):?-(?P<value>[^}]*)\}"?\s*$')
# : "${VAR:=default}"
_COLON = re.compile(r'^\s*:\s+"?\$\{(?P<name>[A-Z_][A-Z0-9_]*):?=(?P<value>[^}]*)\}"?\s*$')


def env_defaults(text: str) -> dict[str, str]:
    """Default value of each variable slurm/env.sh sets, in either shell idiom."""
    defaults = {}
    for line in text.splitlines():
        match = _ASSIGN.match(line) or _COLON.match(line)
        if match:
            defaults[match["name"]] = match["value"].strip("'\"")
    return defaults


def test_parser_reads_both_idioms():
    text = 'A=${A:-one}\nexport B="${B:-two}"\n: "${C:=three}"\n# D=${D:-no}\n'
    assert env_defaults(text) == {"A": "one", "B": "two", "C": "three"}


def env_sh_shape(site: Path, **env: str) -> dict[str, str]:
    """The shape slurm/env.sh sets with `site` as the site file and `env` in the environment."""
    script = 'source slurm/env.sh && for name in "$@"; do echo "$name=${!name}"; done'
    out = subprocess.run(["bash", "-c", script, "env.sh", *SHAPE], cwd=REPO_ROOT, capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "SCDINO_CLUSTER_ENV": str(site), **env}, check=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines())


def preset_shape(name: str) -> dict[str, str]:
    preset = PRESETS[name]
    return {"SCDINO_PARTITION": preset.queue_name, "SCDINO_GPUS_PER_NODE": str(preset.gpus_per_node),
            "SCDINO_CPUS_PER_GPU": str(preset.cpus_per_gpu), "SCDINO_INSTANCE_TYPE": preset.instance_type,
            "SCDINO_CPUS_PER_TASK": str(preset.cpus_per_gpu)}


def test_the_python_planner_and_slurm_env_give_ingest_the_same_cpus():
    """A laptop plans the chain in Python (training/remote) without slurm/env.sh: the same default."""
    from training.chain.graph import INGEST_CPUS_PER_TASK

    assert env_defaults(ENV_SH.read_text())["SCDINO_INGEST_CPUS_PER_TASK"] == str(INGEST_CPUS_PER_TASK)


def test_slurm_env_without_a_site_file_describes_the_default_preset(tmp_path):
    assert ENV_SH.is_file(), "slurm/env.sh is missing: the Slurm scripts must ship their site defaults"
    shape = env_sh_shape(tmp_path / "no-cluster.env")
    assert shape == preset_shape(DEFAULT_PRESET)
    assert {name: shape[name] for name in SLURM_DEFAULTS} == SLURM_DEFAULTS


@pytest.mark.parametrize("presets", [["p5.48xlarge"], ["g4dn.12xlarge", "p4d.24xlarge"], sorted(PRESETS)],
                         ids=lambda presets: "+".join(presets))
def test_slurm_env_takes_each_preset_s_shape_from_the_site_file_the_pointer_renders_to(tmp_path, presets):
    """The deploy's pointer holds node_shape(cluster.presets); the nodes render it with bootstrap/cluster-env.py.
    env.sh then takes the first preset's shape (the cluster's default partition), the one SCDINO_PRESET names
    (by instance type or partition), inside a job the one of its partition; a value in the environment wins."""
    pointer, site = tmp_path / "current.json", tmp_path / "cluster.env"
    pointer.write_text(json.dumps({"bundle": "s3://b/bundles/x.zip", "id": "x", "cluster": node_shape(presets)}))
    subprocess.run(["python3", str(RENDERER), str(pointer), str(site)], check=True)
    assert env_sh_shape(site) == preset_shape(presets[0])
    for name in presets:
        queue = PRESETS[name].queue_name
        assert env_sh_shape(site, SCDINO_PRESET=name) == preset_shape(name)
        assert env_sh_shape(site, SCDINO_PRESET=queue) == preset_shape(name)
        assert env_sh_shape(site, SLURM_JOB_PARTITION=queue) == preset_shape(name)
    assert env_sh_shape(site, SLURM_JOB_PARTITION="cpu-spot") == preset_shape(presets[0])
    mine = env_sh_shape(site, SCDINO_PRESET=presets[-1], SCDINO_PARTITION="mine", SCDINO_CPUS_PER_TASK="3")
    assert mine == {**preset_shape(presets[-1]), "SCDINO_PARTITION": "mine", "SCDINO_CPUS_PER_TASK": "3"}


def test_slurm_env_paths_match_the_cluster_layout():
    defaults = env_defaults(ENV_SH.read_text())
    assert defaults.get("SCDINO_HOME") == BUNDLE_DIR
    assert defaults.get("SCDINO_FSX") == FSX_MOUNT_DIR
    assert defaults.get("SCDINO_SCRATCH") == SCRATCH_DIR
    assert defaults.get("SCDINO_CLUSTER_ENV") == "$SCDINO_HOME/cluster.env"  # where the bootstrap writes it


def _sbatch_options() -> list[tuple[str, str, str]]:
    """(script, option, value) of every `#SBATCH --option=value` line in slurm/*.slurm."""
    options = []
    for script in sorted(ENV_SH.parent.glob("*.slurm")):
        for line in script.read_text().splitlines():
            match = re.match(r"#SBATCH\s+--([a-z-]+)=(\S+)", line)
            if match:
                options.append((script.name, match[1], match[2]))
    return options


def test_sbatch_defaults_can_be_scheduled_on_a_cluster_of_any_preset():
    """A script submitted by hand goes to the cluster's default partition, whichever preset that is: a request
    it cannot satisfy would pend forever (the seeds' queue-size bug), a partition it lacks is refused."""
    from stacks.shared.settings import build_settings

    cluster = build_settings().cluster
    options = _sbatch_options()
    assert options, "no #SBATCH lines found in slurm/*.slurm"
    for script, option, value in options:
        assert option != "partition", f"{script}: --partition={value}, a partition the cluster may lack"
        if option == "nodes":
            assert int(value.split("-")[-1]) <= cluster.max_nodes, f"{script}: --nodes={value} > max_nodes"
        elif option in ("cpus-per-task", "cpus-per-gpu"):
            assert all(int(value) <= p.cpus_per_gpu for p in PRESETS.values()), f"{script}: --{option}={value}"
        elif option in ("gpus-per-node", "gres"):
            assert all(int(value.rsplit(":", 1)[-1]) <= p.gpus_per_node for p in PRESETS.values()), \
                f"{script}: --{option}={value}"


def _readonly(path: Path, name: str) -> str:
    """The value of `readonly NAME=value` or `readonly NAME=${OVERRIDE:-value}` in a shell script."""
    match = re.search(rf"^readonly {name}=(?:\$\{{\w+:-)?([^}}\s]+)\}}?$", path.read_text(), flags=re.M)
    assert match, f"{path.name}: no `readonly {name}=`"
    return match[1]


def test_nccl_tests_are_installed_where_the_slurm_script_runs_them():
    installed = _readonly(REPO_ROOT / "ami" / "scripts" / "30-nccl-tests.sh", "BIN_DIR") + "/all_reduce_perf"
    (default,) = re.findall(r"^NCCL_TESTS_BIN=\$\{NCCL_TESTS_BIN:-\$\(command -v all_reduce_perf \|\| echo (\S+)\)\}$",
                            (REPO_ROOT / "slurm" / "nccl_tests.slurm").read_text(), flags=re.M)
    assert installed == default == NCCL_TESTS_BIN


def test_the_image_environment_is_the_one_bootstrap_links():
    assert _readonly(REPO_ROOT / "ami" / "scripts" / "20-python-env.sh", "VENV") == IMAGE_VENV
    assert _readonly(REPO_ROOT / "ami" / "scripts" / "30-nccl-tests.sh", "VENV") == IMAGE_VENV
    assert _readonly(REPO_ROOT / "bootstrap" / "on-node-configured.sh", "IMAGE_VENV") == IMAGE_VENV


def test_bootstrap_uses_the_cluster_mount_points():
    bootstrap = REPO_ROOT / "bootstrap" / "on-node-configured.sh"
    assert _readonly(bootstrap, "SCRATCH_DIR") == SCRATCH_DIR
    assert _readonly(bootstrap, "SHARED_VENVS").startswith(FSX_MOUNT_DIR + "/")
    (install_dir,) = re.findall(r"install_dir=\$\{2:-([^}]+)\}", bootstrap.read_text())
    assert install_dir == BUNDLE_DIR


def test_one_pinned_environment_with_dali_is_built_in_the_image():
    script = (REPO_ROOT / "ami" / "scripts" / "20-python-env.sh").read_text()
    (install,) = re.findall(r'"\$\{VENV\}/bin/pip" install [^\n]*\\\n([^\n]*)', script)
    assert install.split() == ['-r', '"${REQUIREMENTS_DIR}/requirements.txt"',
                               '-r', '"${REQUIREMENTS_DIR}/requirements-dali.txt"']
    for name in ("requirements.txt", "requirements-dali.txt"):
        lines = [line.split("#")[0].strip() for line in (REPO_ROOT / name).read_text().splitlines()]
        assert all(re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+==[0-9][^\s]*", line) for line in lines if line), name


def test_the_image_records_the_requirement_files_bootstrap_compares():
    """Bootstrap uses the image's environment only when the files it hashes (REQUIREMENT_FILES) are the
    ones the image recorded: a file missing on one side silently sends every node to FSx-built venvs."""
    node_files = ["requirements.txt", "requirements-dali.txt"]
    (compared,) = re.findall(r"^readonly REQUIREMENT_FILES=\(([^)]*)\)$",
                             (REPO_ROOT / "bootstrap" / "on-node-configured.sh").read_text(), flags=re.M)
    assert compared.split() == node_files
    (recorded,) = re.findall(r'^cp ((?:"\$\{REQUIREMENTS_DIR\}/[^"]+" )+)"\$\{RECORD_DIR\}/"$',
                             (REPO_ROOT / "ami" / "scripts" / "20-python-env.sh").read_text(), flags=re.M)
    assert re.findall(r'/([^/"]+)"', recorded) == node_files
    uploads = re.findall(r'sources\s+= \[("\$\{path\.root\}/\.\./[^\]]*)\]',
                         (REPO_ROOT / "ami" / "gpu-image.pkr.hcl").read_text())
    assert len(uploads) == 2  # one per build: ParallelCluster's image and the PCS image
    for uploaded in uploads:
        assert re.findall(r'/\.\./([^"]+)"', uploaded) == node_files
    from stacks.shared.image_stack import BUILD_SOURCES
    from stacks.shared.node_bundle import BUNDLE_CONTENTS

    for shipped in (BUILD_SOURCES, BUNDLE_CONTENTS):
        assert [name for name in shipped if name.startswith("requirements")] == node_files
