"""Every command in the shell blocks of README.md, docs/deploy.md and docs/slurm.md exists and takes the
options, files and keys shown: the pinned CDK CLI, ParallelCluster's CLI, sbatch and the training CLI by
their own --help, AWS CLI calls by botocore's service models (the AWS CLI is not installed here),
repository scripts and Makefile targets by their text, files by the repository (a node's /apps/scdino by
the bundle), `--set` keys by the run configuration's schema and `-c` keys by the CDK settings'."""

from __future__ import annotations

import re
import shlex
import subprocess
from functools import cache

import pytest

from stacks.shared.constants import BUNDLE_DIR
from stacks.shared.node_bundle import BUNDLE_CONTENTS
from tests.support.cdk_synth import CDK_ENV, PCLUSTER_PYTHON, REPO_ROOT

pytestmark = pytest.mark.slow

DOC = REPO_ROOT / "docs" / "deploy.md"
DOCS = [REPO_ROOT / "README.md", DOC, REPO_ROOT / "docs" / "slurm.md"]
VENV_PYTHON = REPO_ROOT / ".venv" / "bin" / "python"
# Commands of the operating system and Slurm that the guides run on the head node.
SYSTEM = {"cd", "ls", "mkdir", "cp", "sinfo", "squeue", "tail"}
# What the guides may source: files a repository script writes (the local cluster's job environment).
SOURCED = {".local-slurm/scdino-env.sh": "scripts/local-slurm.sh"}
# CDK context keys the app reads besides the settings' own dotted keys (app.py, stacks/shared/settings.py).
CONTEXT_KEYS = {"settings"}
AWS_GLOBAL = {"--region", "--query", "--output", "--profile"}
# The AWS CLI's hand-written `aws s3` commands (not in botocore's models) and the options used here.
AWS_S3 = {"sync": set(), "cp": set(), "ls": set()}
# Python entry points the guide runs: the training CLI and the deployment's commands (each with a
# subcommand), and the zone picker.
PYTHON_MODULES = {"training", "stacks.deployment", "stacks.pick_az", "training.benchmarks.speed.allreduce"}
WITH_SUBCOMMANDS = {"training", "stacks.deployment"}


def doc_commands(doc=DOC) -> list[list[str]]:
    """Each simple command of the ```bash blocks, as words; $(...) substitutions are commands too."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", doc.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            for inner in re.findall(r"\$\((.*?)\)(?!\S*\))", line):
                commands.append(shlex.split(inner, comments=True))
            line = re.sub(r"\$\((.*?)\)(?!\S*\))", "SUBSTITUTED", line)
            for part in re.split(r"&&|\|", line):
                words = shlex.split(part, comments=True)
                if words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
                    words = words[1:]
                if words:
                    commands.append(words)
    return commands


def all_doc_commands() -> list[tuple[str, list[str]]]:
    return [(doc.name, words) for doc in DOCS for words in doc_commands(doc)]


def options(words: list[str]) -> list[str]:
    return [word.split("=", 1)[0] for word in words if word.startswith("-")]


def pairs_after(flag: str, words: list[str]) -> list[str]:
    """The key=value words that follow each `flag` (e.g. --set, -c)."""
    return [words[i + 1] for i, word in enumerate(words[:-1]) if word == flag]


@cache
def config_keys() -> frozenset[str]:
    from training.config.dotted import dotted_keys
    from training.config.schema import Config

    return frozenset(dotted_keys(Config))


def check_config_keys(words: list[str]) -> None:
    """Every `--set key=value` names a key of the run configuration."""
    for pair in pairs_after("--set", words):
        key = pair.split("=", 1)[0]
        assert "=" in pair and key in config_keys(), f"--set {pair}: no config key {key!r}"


def check_setting_keys(words: list[str]) -> None:
    """Every `-c key=value` names a CDK setting (or the settings file)."""
    from stacks.shared.settings import setting_keys

    for pair in pairs_after("-c", words):
        key = pair.split("=", 1)[0]
        assert "=" in pair and (key in setting_keys() or key in CONTEXT_KEYS), f"-c {pair}: no setting {key!r}"


def check_files(words: list[str]) -> None:
    """Repository files the command names (configs, scripts, examples) exist."""
    for word in words:
        if re.fullmatch(r"(configs|slurm|scripts|examples)/[\w./-]+\.(yaml|sh|slurm|py)", word):
            assert (REPO_ROOT / word).is_file(), f"{word} does not exist"


def check_sbatch(words: list[str]) -> None:
    """sbatch's options by its --help, the script in the repository (or the bundle), the step's options by
    the training step's --help, where the script passes them on."""
    index = next((i for i, word in enumerate(words) if word.endswith(".slurm")), None)
    assert index is not None, f"no slurm/*.slurm script in {words}"
    text = subprocess.run(["sbatch", "--help"], capture_output=True, text=True, timeout=60).stdout
    for option in options(words[1:index]):
        assert re.search(rf"(^|[\s,]){re.escape(option)}[\s=,]", text, re.M), f"sbatch has no {option}"
    script = words[index].removeprefix(f"{BUNDLE_DIR}/")
    in_bundle(f"{BUNDLE_DIR}/{script}")
    # The step the script runs with its arguments after CONFIG (none for the launcher and the tools).
    step = re.search(r"(?:-m training|^run_step) ([a-z-]+) (?:--config )?\"\$CONFIG\"", (REPO_ROOT / script).read_text(),
                     re.M)
    if step:
        check_help(words, (str(VENV_PYTHON), "-m", "training", step[1]), words[index + 2:])


def check_make(words: list[str]) -> None:
    makefile = (REPO_ROOT / "Makefile").read_text()
    for target in words[1:]:
        assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"the Makefile has no target {target}"


def check_script(words: list[str]) -> None:
    """A repository script's subcommand or options by its text."""
    script = (REPO_ROOT / words[0]).read_text()
    for word in words[1:]:
        if word.startswith("-"):
            assert f"{word.split('=')[0]})" in script or f'"{word}"' in script, f"{words[0]} does not parse {word}"
        elif not word.startswith("["):
            assert re.search(rf"^\s*{re.escape(word)}\)", script, re.M) or word.startswith("node"), \
                f"{words[0]} has no subcommand {word}"
            break


@cache
def help_text(*command: str) -> str:
    env = {**CDK_ENV, "PATH": "/usr/bin:/bin", "HOME": "/tmp", "CDK_DISABLE_VERSION_CHECK": "1"}
    result = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
                            env=env, check=False)
    return result.stdout + result.stderr


def check_cdk(words: list[str]) -> None:
    subcommand = words[2]
    text = help_text(str(REPO_ROOT / "node_modules" / ".bin" / "cdk"), subcommand)
    assert f"cdk {subcommand}" in text, f"no `cdk {subcommand}`"
    for option in options(words[3:]):
        assert re.search(rf"(^|\s){re.escape(option)}[\s,]", text) or (
            option.startswith("--no-") and f"--{option[5:]}" in text), f"cdk {subcommand} has no {option}"


def check_aws(words: list[str]) -> None:
    import botocore.session

    service, operation = words[1], words[2]
    given = set(options(words[3:])) - AWS_GLOBAL
    if service == "s3":
        assert operation in AWS_S3 and given <= AWS_S3[operation], words
        return
    # `aws s3api` is the AWS CLI's name for botocore's generated S3 model (`aws s3` being the hand-written one).
    model = botocore.session.get_session().get_service_model("s3" if service == "s3api" else service)
    name = "".join(part.capitalize() for part in operation.split("-"))
    assert name in model.operation_names, f"aws {service} has no {operation}"
    members = {re.sub(r"(?<!^)(?=[A-Z])", "-", member).lower()
               for member in model.operation_model(name).input_shape.members}
    for option in given:
        flag = option[2:].removeprefix("no-")
        assert flag in members, f"aws {service} {operation} has no {option}"


def check_help(words: list[str], command: tuple[str, ...], rest: list[str]) -> None:
    text = help_text(*command)
    assert "usage:" in text, f"{' '.join(command)} --help failed: {text[-500:]}"
    for option in options(rest):
        assert re.search(rf"(^|[\s\[,]){re.escape(option)}(?=[\s,\]=]|$)", text, re.M), \
            f"{' '.join(command)} has no {option}"


def in_bundle(path: str) -> str:
    """The repository path a node's /apps/scdino/<path> is (the bundle's contents, or the link to its environment)."""
    relative = path.removeprefix(f"{BUNDLE_DIR}/")
    if relative.startswith(".venv/"):
        return relative
    assert relative.split("/")[0] in BUNDLE_CONTENTS and (REPO_ROOT / relative).exists(), f"{path} is not in the bundle"
    return relative


def check(words: list[str]) -> None:
    program = words[0]
    if program == "sudo":
        if words[1:2] == ["-iu"]:
            return
        words, program = words[1:], words[1]
    if program.startswith(f"{BUNDLE_DIR}/"):
        words = [in_bundle(program), *words[1:]]
        program = words[0]
    check_files(words)
    check_config_keys(words)
    if program in ("npx", ".venv/bin/python"):  # the CDK CLI, stacks.deployment and `training plan` take -c
        check_setting_keys(words)
    if program == ".venv/bin/python" and words[1:3] == ["-m", "training"]:
        check_help(words, (str(VENV_PYTHON), "-m", "training", words[3]), words[4:])
    elif program == "npx":
        assert words[1] == "cdk", words
        check_cdk(words)
    elif program == "aws":
        check_aws(words)
    elif program in ("pcluster", ".venv-pcluster/bin/pcluster"):
        check_help(words, (str(PCLUSTER_PYTHON.parent / "pcluster"), words[1]), words[2:])
    elif program == "sbatch":
        check_sbatch(words)
    elif program == "make":
        check_make(words)
    elif program == "source":
        assert words[1] in SOURCED and words[1].rsplit("/", 1)[1] in (REPO_ROOT / SOURCED[words[1]]).read_text(), \
            f"nothing writes {words[1]}"
    elif program.startswith("scripts/"):
        check_script(words)
    elif program == ".venv/bin/python":
        assert words[1] == "-m" and words[2] in PYTHON_MODULES, words
        if words[2] in WITH_SUBCOMMANDS:
            command = (str(VENV_PYTHON), "-m", words[2], words[3])
            assert f"usage: python -m {words[2]} {words[3]} " in help_text(*command), f"no {words[2]} {words[3]}"
            check_help(words, command, words[4:])
        else:
            check_help(words, (str(VENV_PYTHON), "-m", words[2]), words[3:])
    elif program.startswith("slurm/"):
        script = (REPO_ROOT / program).read_text()
        for option in options(words[1:]):
            assert f"{option})" in script or f"{option} |" in script, f"{program} does not parse {option}"
        config = next((word for word in words[1:] if word.endswith(".yaml")), None)
        assert config is None or "/" not in config or (REPO_ROOT / config).is_file(), f"{config} does not exist"
    else:
        assert program in SYSTEM, f"unknown command {program!r}"


def test_the_guide_covers_deploy_update_image_rebuild_and_destroy():
    headings = re.findall(r"^## (.+)$", DOC.read_text(), re.M)
    for topic in ("First deploy", "Update the code", "rebuild the GPU image", "Destroy"):
        assert any(topic in heading for heading in headings), topic
    programs = {words[0] for words in doc_commands()}
    assert {"npx", "aws", ".venv-pcluster/bin/pcluster", ".venv/bin/python"} <= programs


@pytest.mark.parametrize(("doc", "words"), all_doc_commands(), ids=lambda item: item if isinstance(item, str) else
                         " ".join(item[:3]))
def test_every_command_exists_with_the_options_shown(doc, words):
    check(words)


def test_every_bundle_path_the_guides_name_is_in_the_bundle():
    named = {word for _, words in all_doc_commands() for word in words if word.startswith(f"{BUNDLE_DIR}/")}
    assert {f"{BUNDLE_DIR}/slurm/submit_pipeline.sh", f"{BUNDLE_DIR}/configs/demo.yaml",
            f"{BUNDLE_DIR}/examples/ddp_minimal.py"} <= named
    for path in named:
        in_bundle(path)


def _block_after(heading: str, containing: str = "stacks.deployment ssm") -> str:
    """The first shell block after `heading` that holds `containing`."""
    text = DOC.read_text()
    return next(block for block in re.findall(r"```bash\n(.*?)```", text[text.index(heading):], re.S)
                if containing in block)


def test_the_first_login_connects_becomes_the_user_submits_the_demo_watches_and_reads_the_report():
    """The order a user types it; the folder is the one the bootstrap makes writable for everyone, and the
    log the live view follows is the one the submitter names (logs/<job name>_<job id>.out)."""
    block = _block_after("## 5. Run the pipeline")
    steps = ["stacks.deployment ssm", "sudo -iu ec2-user", "mkdir -p /fsx/data/work/$USER && cd /fsx/data/work/$USER",
             f"cp {BUNDLE_DIR}/configs/demo.yaml demo.yaml", "-m training synth-data --config demo.yaml",
             f"{BUNDLE_DIR}/slurm/submit_pipeline.sh demo.yaml", "squeue", "tail -f logs/scdino-pretrain_<JOBID>.out",
             "-m training paths --config demo.yaml report"]
    where = [block.index(step) for step in steps]
    assert where == sorted(where)
    bootstrap = (REPO_ROOT / "bootstrap" / "on-node-configured.sh").read_text()
    assert "readonly WORK_DIR=${SCDINO_WORK_DIR:-/fsx/data/work}" in bootstrap
    assert 'chmod 1777 "${WORK_DIR}"' in bootstrap
    assert '--output="$LOG_DIR/%x_%j.out"' in (REPO_ROOT / "slurm" / "submit_pipeline.sh").read_text()
    assert "#SBATCH --job-name=scdino-pretrain " in (REPO_ROOT / "slurm" / "pretrain.slurm").read_text()
    report = subprocess.run([str(VENV_PYTHON), "-m", "training", "paths", "--config", "configs/demo.yaml", "report"],
                            cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout.strip()
    assert f"s3://<BucketName>/data/work/ec2-user/{report}" in DOC.read_text()
    # On PCS the same: connect to the login node, then become the user that submits.
    pcs = _block_after("2. **Connect to the login node.**")
    assert pcs.index("stacks.deployment ssm") < pcs.index("sudo -iu ec2-user") < pcs.index("sinfo")


def test_after_the_deploy_every_command_reaches_the_recorded_deployment():
    """A `cdk destroy --all` without the deploy's `-c region=` fell back to cdk.json's region and left the
    deployment billing: the guide deploys, updates and destroys through the record (stacks/deployment.py), and
    every AWS CLI or ParallelCluster command it gives names the recorded region ($REGION, set from the record
    before its first use). The README's short version does the same."""
    commands = doc_commands()
    assert [words for words in commands if words[:3] in (["npx", "cdk", "deploy"], ["npx", "cdk", "destroy"])] == []
    regional = [words for words in commands
                if words[0].endswith("pcluster") or (words[0] == "aws" and words[1] not in ("sts", "s3"))]
    assert regional and [words for words in regional
                         if "--region" not in words or words[words.index("--region") + 1] != "$REGION"] == []
    text = DOC.read_text()
    assert text.index("REGION=$(.venv/bin/python -m stacks.deployment show region)") < text.index('"$REGION"')
    readme = (REPO_ROOT / "README.md").read_text()
    block = re.search(r"## Deploy to AWS.*?```bash\n(.*?)```", readme, re.S)[1]
    assert "stacks.deployment deploy" in block and "stacks.deployment destroy" in block
    assert "cdk deploy" not in block and "cdk destroy" not in block and "aws ssm" not in block


@pytest.mark.parametrize("words", [
    ["npx", "cdk", "deploy", "--no-such-option"],
    ["aws", "ssm", "start-sessions", "--target", "i-1"],
    ["aws", "codebuild", "start-build", "--project", "p"],
    ["pcluster", "describe-cluster", "--cluster", "c"],
    ["slurm/submit_pipeline.sh", "run.yaml", "--node", "2"],
    [".venv/bin/python", "-m", "stacks.pick_az", "--region", "us-east-1", "--instance-type", "p5.48xlarge"],
    [".venv/bin/python", "-m", "stacks.pick_zone", "--region", "us-east-1"],
    [".venv/bin/python", "-m", "stacks.deployment", "destroy", "--all"],
    [".venv/bin/python", "-m", "stacks.deployment", "remove"],
    [".venv/bin/python", "-m", "training", "plan", "--config", "configs/demo.yaml", "--set", "optim.lrr=1"],
    [".venv/bin/python", "-m", "training", "plan", "--config", "configs/no-such.yaml"],
    [".venv/bin/python", "-m", "stacks.deployment", "deploy", "-c", "cluster.max_node=4"],
    ["sbatch", "--nodes=2", "slurm/no_such_step.slurm", "run.yaml"],
    ["sbatch", "--nodez=2", "slurm/knn.slurm", "run.yaml"],
    ["sbatch", "slurm/ingest.slurm", "run.yaml", "--merge", "--partz", "16"],
    ["make", "demos"],
    ["scripts/local-slurm.sh", "restart"],
    ["source", ".local-slurm/other-env.sh"],
    ["/apps/scdino/slurm/submit_pipeline.sh", "run.yaml", "--set", "data.chanels=0"],
])
def test_the_checks_reject_a_wrong_command(words):
    with pytest.raises(AssertionError):
        check(words)
