"""One deployment, one region: the deploy records where its stacks went, and every later command reads it.

    .venv/bin/python -m stacks.deployment deploy --no-rollback -c region=us-west-2 -c network.availability_zone=us-west-2a
    .venv/bin/python -m stacks.deployment update           # the cluster stack again (new code, changed settings)
    .venv/bin/python -m stacks.deployment image            # start the GPU image build (--published: its AMI id)
    .venv/bin/python -m stacks.deployment images --prune   # deregister old built images, delete their snapshots
    .venv/bin/python -m stacks.deployment ssm              # a shell on the head node (backend=pcs: the login node)
    .venv/bin/python -m stacks.deployment show region      # one recorded value; no name: the whole record
    .venv/bin/python -m stacks.deployment destroy          # every stack of the recorded deployment

`deploy` runs the pinned CDK CLI (`npx cdk deploy --outputs-file ...`) with your `-c` options and records
the deployment in deployment.json at the repository root (git-ignored): region, prefix, account (once
known), back end, stack names, the `-c` options every later `cdk` command of it gets, and the stacks'
outputs (bucket, head node, cluster, image project). The record is written before the CDK CLI starts, so
that a deploy which fails half-way can still be destroyed, and again with the outputs. Later commands take
the region and names from it; a `-c` option they are given is added (and recorded by deploy and update),
but a region or prefix other than the record's is refused with one line: a deployment never moves, and
no command reaches past it into another region. `destroy` without a record refuses to fall back to
cdk.json's region, and with one refuses credentials of another account than the record's (STS says whose
they are). `--print` prints the command lines instead of running them (no AWS call);
`--deployment FILE` names another record (a second deployment from the same checkout).
`python -m training upload-data` takes its bucket and region from the same record.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from stacks.images import KEEP, built_images, images_in_use, listing_command, plan, prune
from stacks.pcs.config import LOGIN_GROUP, node_group_tag
from stacks.shared.constants import BUILD_TAG_KEY, NODE_GROUP_TAG
from stacks.shared.settings import STACKS, Settings, SettingsError, load_settings_file, settings_from
from training.config.dotted import DottedKeyError, context_pairs

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RECORD = REPO_ROOT / "deployment.json"
RECORD_FORMAT = 1
CDK = ("npx", "cdk")
IDENTITY = ("region", "prefix")
"""The settings that name a deployment: pinned in its record's context, never changed by a later command."""
RESOURCES = {
    "bucket": ("storage", "BucketName"),
    "file_system_id": ("storage", "FileSystemId"),
    "image_project": ("image", "ProjectName"),
    "head_node_instance_id": ("cluster", "HeadNodeInstanceId"),
    "pcs_cluster_id": ("cluster", "ClusterId"),
    "dashboard": ("cluster", "DashboardName"),
    "alarm_topic_arn": ("cluster", "AlarmTopicArn"),
    "rest_token_secret": ("cluster", "RestTokenSecretArn"),
    "rest_client_policy": ("cluster", "RestClientPolicyArn"),
}
"""What a reader of the record asks for -> (stack, CfnOutput id) it is read from (a test holds the ids)."""
SET_ASIDE = "move it aside and give the deployment's -c options (region, prefix, ...) on the command line"
_ARN_ACCOUNT = re.compile(r"^arn:aws[a-z-]*:[a-z0-9-]+:[a-z0-9-]*:(\d{12}):")


class DeploymentError(ValueError):
    """A command cannot run as asked; the message says what is wrong and how to fix it, on one line."""


@dataclass(frozen=True)
class Deployment:
    """What deployment.json holds: enough for any later command to reach this deployment, and only it."""

    prefix: str
    region: str
    backend: str
    account: str
    """Empty until known: the `account` setting, or the account in an ARN among the outputs."""
    stacks: dict[str, str]
    """{stack: CloudFormation name}, e.g. {"storage": "scdino-storage", ...}."""
    cluster_name: str
    ami_parameter: str
    data_prefix: str
    """The bucket's prefix the file system imports (s3://<bucket>/<data_prefix>/ is /fsx/<data_prefix>/)."""
    login_node_tag: str
    """backend=pcs: KEY=VALUE of the tag that finds the login nodes; empty for ParallelCluster."""
    context: dict[str, str]
    """The `-c` options every `cdk` command of this deployment gets; region and prefix always among them."""
    outputs: dict[str, dict[str, str]] = field(default_factory=dict)
    """{stack name: {output id: value}}, as `cdk deploy --outputs-file` writes them."""

    @classmethod
    def of(cls, settings: Settings, context: dict[str, str], account: str = "",
           outputs: dict[str, dict[str, str]] | None = None) -> Deployment:
        pinned = {"region": settings.region, "prefix": settings.prefix}
        login = f"{NODE_GROUP_TAG}={node_group_tag(settings, LOGIN_GROUP)}" if settings.backend == "pcs" else ""
        return cls(prefix=settings.prefix, region=settings.region, backend=settings.backend,
                   account=settings.account or account, stacks=settings.stack_names,
                   cluster_name=settings.cluster_name, ami_parameter=settings.ami_parameter,
                   data_prefix=settings.storage.data_prefix, login_node_tag=login,
                   context={**pinned, **{k: v for k, v in context.items() if k not in pinned}},
                   outputs=dict(outputs or {}))

    @property
    def resources(self) -> dict[str, str]:
        """The named outputs known so far, e.g. {"bucket": ..., "head_node_instance_id": ...}."""
        found = {}
        for name, (stack, output) in RESOURCES.items():
            value = self.outputs.get(self.stacks[stack], {}).get(output)
            if value:
                found[name] = value
        return found

    def with_outputs(self, outputs: dict[str, dict[str, str]]) -> Deployment:
        """The record with these stacks' outputs replacing theirs, and the account if an ARN names it."""
        merged = {**self.outputs, **{stack: dict(values) for stack, values in outputs.items()}}
        accounts = {match[1] for values in merged.values() for value in values.values()
                    if (match := _ARN_ACCOUNT.match(str(value)))}
        account = self.account or (accounts.pop() if len(accounts) == 1 else "")
        return replace(self, outputs=merged, account=account)

    def without(self, stacks: Sequence[str]) -> Deployment:
        """The record once these stacks (CloudFormation names) are destroyed: their outputs dropped."""
        return replace(self, outputs={name: values for name, values in self.outputs.items() if name not in stacks})

    def to_json(self) -> dict[str, Any]:
        return {"format": RECORD_FORMAT, **asdict(self), "resources": self.resources}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Deployment:
        names = [name for name in cls.__dataclass_fields__]
        return cls(**{name: data[name] for name in names})


def load(path: Path) -> Deployment | None:
    """The record at `path`; None when there is none."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != RECORD_FORMAT:
            raise DeploymentError(f"{path} holds record format {data.get('format')!r}, this code reads "
                                  f"{RECORD_FORMAT}: use the code that wrote it, or {SET_ASIDE}")
        return Deployment.from_json(data)
    except (json.JSONDecodeError, AttributeError, KeyError, TypeError) as error:
        raise DeploymentError(f"{path} is not a deployment record ({type(error).__name__}: {error}): restore it, "
                              f"or {SET_ASIDE}") from None


def save(record: Deployment, path: Path) -> None:
    """Write the record whole or not at all (a temporary file beside it, then a rename)."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(record.to_json(), indent=2) + "\n", encoding="utf-8")
    os.replace(temporary, path)


def resolve(context: dict[str, str], cdk_json: Path = REPO_ROOT / "cdk.json") -> Settings:
    """The settings the CDK app builds from cdk.json's context and these `-c` options (as app.py merges them)."""
    merged = {**json.loads(cdk_json.read_text(encoding="utf-8")).get("context", {}), **context}
    try:
        return settings_from(merged.get)
    except SettingsError as error:
        raise DeploymentError(str(error)) from None


def check_identity(record: Deployment, path: Path, given: dict[str, str]) -> None:
    """Refuse a command that names a region or prefix (`-c`, or a settings file it names) other than the record's."""
    named = {key: (given[key], "as given") for key in IDENTITY if key in given}
    if given.get("settings"):
        in_file = load_or_fail(given["settings"])
        named = {**{key: (in_file[key], f"in {given['settings']}") for key in IDENTITY if key in in_file}, **named}
    for key, (asked, source) in named.items():
        if str(asked) != getattr(record, key):
            raise DeploymentError(
                f"{path.name} records the deployment {record.prefix} in {record.region}, but this command names "
                f"{key} {asked} ({source}): a deployment stays in its region and keeps its prefix; leave {key} out "
                "to reach the recorded one, or give another deployment its own record (--deployment FILE)")


def explicit_region(given: dict[str, str]) -> bool:
    """The command line names the region (-c region=, or a settings file that sets it), not cdk.json's default."""
    if "region" in given:
        return True
    return bool(given.get("settings")) and "region" in load_or_fail(given["settings"])


def load_or_fail(settings_file: str) -> dict[str, Any]:
    try:
        return load_settings_file(settings_file)
    except SettingsError as error:
        raise DeploymentError(str(error)) from None


def stack_names(record: Deployment, names: Sequence[str]) -> list[str]:
    """CloudFormation names of the stacks named short (cluster) or whole (scdino-cluster)."""
    chosen = []
    for name in names:
        full = record.stacks.get(name, name)
        if full not in record.stacks.values():
            raise DeploymentError(f"no stack {name!r} in the deployment {record.prefix}: choose from "
                                  f"{', '.join(STACKS)} (or {', '.join(record.stacks.values())})")
        chosen.append(full)
    return chosen


def outputs_file(path: Path) -> Path:
    """Where `cdk deploy --outputs-file` writes the outputs a record then takes: beside the record."""
    return path.with_name(f".{path.stem}-outputs.json")


def shown(path: Path) -> str:
    """A path as a command line shows it: relative to the repository (the commands run there) when inside it."""
    path = path.resolve()
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def cdk_command(verb: str, record: Deployment, stacks: Sequence[str], options: Sequence[str],
                outputs: Path | None = None) -> list[str]:
    """`npx cdk <verb>` of this deployment's stacks (all when none is named), with its recorded context."""
    command = [*CDK, verb, *(stacks or ["--all"])]
    if outputs is not None:
        command += ["--outputs-file", shown(outputs)]
    for key, value in record.context.items():
        command += ["-c", f"{key}={value}"]
    return command + list(options)


@dataclass(frozen=True)
class Request:
    """What one command line asks, common to every command."""

    path: Path
    given: dict[str, str] = field(default_factory=dict)
    """Its `-c` options (or `--region` as region)."""
    print_only: bool = False


def no_record(path: Path, command: str) -> DeploymentError:
    return DeploymentError(f"no deployment record {path}: `{command}` reaches a recorded deployment; deploy with "
                           "`python -m stacks.deployment deploy` (it records the region and names), or give "
                           "--deployment FILE")


def recorded(request: Request, command: str) -> Deployment:
    """The record a later command needs, checked against the region or prefix the command names."""
    record = load(request.path)
    if record is None:
        raise no_record(request.path, command)
    check_identity(record, request.path, request.given)
    return record


def deploy(request: Request, stacks: Sequence[str], options: Sequence[str], *, update: bool = False) -> int:
    """Record the deployment, run `cdk deploy` on it, record the outputs; `update`: the cluster stack of a
    recorded deployment."""
    previous = load(request.path)
    if previous is None and update:
        raise no_record(request.path, "update")
    if previous is not None:
        check_identity(previous, request.path, request.given)
    context = {**(previous.context if previous else {}), **request.given}
    settings = resolve(context)
    record = Deployment.of(settings, context, previous.account if previous else "",
                           previous.outputs if previous else None)
    outputs = outputs_file(request.path)
    command = cdk_command("deploy", record, stack_names(record, ["cluster"] if update else stacks), options, outputs)
    if request.print_only:
        print(shlex.join(command))
        return 0
    find_program(CDK[0])
    if previous is None:
        origin = "" if explicit_region(request.given) else " (cdk.json's region: -c region=... chooses another)"
        print(f"deploying {record.prefix} to {record.region}{origin}; recording it in {request.path}", file=sys.stderr)
    outputs.unlink(missing_ok=True)
    save(record, request.path)
    code = run(command)
    if outputs.is_file():
        record = record.with_outputs(json.loads(outputs.read_text(encoding="utf-8")))
        save(record, request.path)
        outputs.unlink()
    known = ", ".join(f"{name} {value}" for name, value in record.resources.items())
    print(f"{request.path.name}: {record.prefix} in {record.region} ({record.backend}){'; ' + known if known else ''}",
          file=sys.stderr)
    return code


def destroy(request: Request, stacks: Sequence[str], options: Sequence[str], *, confirmed: bool) -> int:
    """`cdk destroy` of the recorded deployment's stacks (all when none is named), after asking which and where."""
    record = load(request.path)
    if record is None:
        settings = resolve(request.given)
        if not explicit_region(request.given):
            raise DeploymentError(
                f"no deployment record {request.path}: this destroy would fall back to cdk.json's region "
                f"{settings.region} (prefix {settings.prefix}); pass -c region=<the deployment's region> with the "
                "-c options it was deployed with, or --deployment FILE")
        record = Deployment.of(settings, request.given)
    else:
        check_identity(record, request.path, request.given)
        context = {**record.context, **request.given}
        resolve(context)
        record = replace(record, context=context)
    chosen = stack_names(record, stacks) if stacks else []
    # cdk destroy asks too, but exits 0 when told no: asking here is what tells a deletion from a refusal.
    command = cdk_command("destroy", record, chosen, ["--force", *options])
    chosen = chosen or list(record.stacks.values())
    if request.print_only:
        print(shlex.join(command))
        return 0
    account = credentials_account(record)
    if record.account and account != record.account:
        raise DeploymentError(
            f"these AWS credentials are for account {account}, but {request.path.name} records {record.prefix} in "
            f"account {record.account} ({record.region}): nothing was deleted; destroy again with credentials of "
            f"account {record.account} (AWS_PROFILE, `aws sso login`), or name that account's record (--deployment FILE)")
    where = f"{record.region} (account {account})"
    if not confirmed and input(f"Delete {', '.join(chosen)} in {where}? [y/N] ").strip().lower() not in ("y", "yes"):
        print("nothing deleted", file=sys.stderr)
        return 1
    code = run(command)
    if code == 0 and request.path.exists():
        if stacks:
            save(load(request.path).without(chosen), request.path)
        else:
            request.path.unlink()
            print(f"{record.prefix}'s stacks are gone from {record.region}: removed {request.path}", file=sys.stderr)
    return code


def credentials_account(record: Deployment) -> str:
    """The account of the AWS credentials this command runs with (STS, in the deployment's region): `cdk destroy`
    deletes in whichever account they are for, and the stack names alone would match a deployment of the same
    prefix there."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    try:
        return boto3.Session(region_name=record.region).client("sts").get_caller_identity()["Account"]
    except NoCredentialsError:
        raise DeploymentError(f"no AWS credentials: log in to the account of {record.prefix} (`aws sso login`, "
                              "`aws configure` or AWS_PROFILE); nothing was deleted") from None
    except (BotoCoreError, ClientError) as error:
        raise DeploymentError(f"the AWS credentials do not work in {record.region}: {str(error).splitlines()[0]}; "
                              "nothing was deleted") from None


def image(request: Request, *, published: bool) -> int:
    """Start the image pipeline's build, or print the AMI id it published last."""
    record = recorded(request, "image")
    if published:
        return execute(["aws", "ssm", "get-parameter", "--region", record.region, "--name", record.ami_parameter,
                        "--query", "Parameter.Value", "--output", "text"], request.print_only)
    project = record.resources.get("image_project")
    if not project:
        raise DeploymentError(f"{request.path.name} has no image project of {record.prefix} yet (the image stack's "
                              "ProjectName output): deploy it first, `python -m stacks.deployment deploy image`")
    return execute(["aws", "codebuild", "start-build", "--region", record.region, "--project-name", project],
                   request.print_only)


def images(request: Request, *, remove: bool, keep: int) -> int:
    """Each image the pipeline built for the deployment, kept (and why) or not; `remove`: deregister those
    not kept and delete their snapshots (stacks/images.py)."""
    record = recorded(request, "images")
    if keep < 0:
        raise DeploymentError(f"--keep {keep}: give how many of the newest images to keep, 0 or more")
    if request.print_only:
        print(shlex.join(listing_command(record.region, record.prefix)))
        return 0
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    removed = snapshots = 0
    try:
        session = boto3.Session(region_name=record.region)
        ec2, ssm_client = session.client("ec2"), session.client("ssm")
        found = built_images(ec2, record.prefix)
        decisions = plan(found, images_in_use(ec2, ssm_client, record.ami_parameter,
                                              [image.image_id for image in found]), keep)
        for image, why in decisions:
            if why:
                verdict = f"kept: {why}"
            elif remove:
                prune(ec2, image)
                removed, snapshots = removed + 1, snapshots + len(image.snapshots)
                verdict = f"deregistered, {len(image.snapshots)} snapshot(s) deleted"
            else:
                verdict = "not kept (--prune removes it)"
            print(f"{image.image_id}  {image.created}  {image.name}  {verdict}")
    except (BotoCoreError, ClientError) as error:
        raise DeploymentError(f"images of {record.prefix} in {record.region}: {str(error).splitlines()[0]}"
                              f"{f' (after {removed} deregistered)' if removed else ''}") from None
    left = sum(1 for _, why in decisions if not why) - removed
    print(f"{len(decisions)} image(s) tagged {BUILD_TAG_KEY}={record.prefix} in {record.region}: "
          f"{removed} deregistered with {snapshots} snapshot(s), {left} more not kept", file=sys.stderr)
    return 0


def login_node_finder(record: Deployment) -> list[str]:
    """backend=pcs: the AWS CLI call that prints a running login node's instance id."""
    key, _, value = record.login_node_tag.partition("=")
    return ["aws", "ec2", "describe-instances", "--region", record.region, "--filters",
            f"Name=tag:{key},Values={value}", "Name=instance-state-name,Values=running",
            "--query", "Reservations[0].Instances[0].InstanceId", "--output", "text"]


def ssm(request: Request, target: str | None) -> int:
    """A Session Manager shell on the head node (backend=pcs: a running login node), in the deployment's region."""
    record = recorded(request, "ssm")
    session = ["aws", "ssm", "start-session", "--region", record.region, "--target"]
    if target is None and record.backend == "pcs":
        finder = login_node_finder(record)
        if request.print_only:
            print(f'{shlex.join(session)} "$({shlex.join(finder)})"')
            return 0
        target = capture(finder)
        if not target.startswith("i-"):
            raise DeploymentError(f"no running login node tagged {record.login_node_tag} in {record.region}: "
                                  "check the cluster's login node group (aws pcs list-compute-node-groups)")
    if target is None:
        target = record.resources.get("head_node_instance_id", "")
        if not target:
            raise DeploymentError(f"{request.path.name} has no head node of {record.prefix} yet (the cluster "
                                  "stack's HeadNodeInstanceId output): `python -m stacks.deployment update` "
                                  "records it once the cluster exists, or give --target ID")
    return execute([*session, target], request.print_only, replace_process=True)


def show(request: Request, name: str | None) -> int:
    """Print the record, or one value of it (for the shell: REGION=$(... show region))."""
    record = recorded(request, "show")
    values = {key: value for key, value in asdict(record).items() if isinstance(value, str)}
    if name is None:
        print(json.dumps(record.to_json(), indent=2))
        return 0
    known = [*values, *RESOURCES]
    if name not in known:
        raise DeploymentError(f"no value {name!r} in a deployment record; choose one of {', '.join(known)}")
    value = {**values, **record.resources}.get(name)
    if not value:
        raise DeploymentError(f"{request.path.name} holds no {name} of {record.prefix}: {missing_because(name)}")
    print(value)
    return 0


def upload_target(path: Path | None, region: str | None) -> tuple[str, str]:
    """The data bucket and its region, for `python -m training upload-data` given no --bucket."""
    path = path or DEFAULT_RECORD
    record = load(path)
    if record is None:
        raise DeploymentError(f"no bucket: pass --bucket (the storage stack's BucketName output), set SCDINO_BUCKET, "
                              f"or deploy with `python -m stacks.deployment deploy`, which records it in {path}")
    if region and region != record.region:
        raise DeploymentError(f"--region {region}: {path.name} records the deployment {record.prefix} and its bucket in "
                              f"{record.region}; leave --region out, or give --bucket for a bucket elsewhere")
    bucket = record.resources.get("bucket")
    if not bucket:
        raise DeploymentError(f"{path.name} holds no bucket of {record.prefix}: {missing_because('bucket')}")
    return bucket, record.region


def missing_because(name: str) -> str:
    """Why a record lacks a value, and what records it."""
    if name in RESOURCES:
        stack = RESOURCES[name][0]
        return f"it comes with the {stack} stack's outputs (`python -m stacks.deployment deploy {stack}`)"
    if name == "account":
        return "it is read from the ARNs among the outputs once a stack holding one is deployed (or set -c account=)"
    return "backend=parallelcluster has no login node group (its head node is `ssm`'s target)"


def run(command: Sequence[str]) -> int:
    """Run a command from the repository root, in this terminal; its exit status (130 on Ctrl-C)."""
    program = find_program(command[0])
    try:
        return subprocess.run([program, *command[1:]], cwd=REPO_ROOT, check=False).returncode
    except KeyboardInterrupt:
        return 130


def capture(command: Sequence[str]) -> str:
    result = subprocess.run([find_program(command[0]), *command[1:]], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines() or [f"exit status {result.returncode}"]
        raise DeploymentError(f"{shlex.join(command[:3])} failed: {lines[-1]}")
    return result.stdout.strip()


def execute(command: list[str], print_only: bool, *, replace_process: bool = False) -> int:
    """Print the command (--print), or run it; an interactive one replaces this process (the terminal is its)."""
    if print_only:
        print(shlex.join(command))
        return 0
    if replace_process:
        os.execv(find_program(command[0]), command)
    return run(command)


def find_program(name: str) -> str:
    """The program's path; the pinned CDK CLI or the AWS CLI missing is one line with the fix."""
    if name == "npx" and not (REPO_ROOT / "node_modules" / ".bin" / "cdk").exists():
        raise DeploymentError("the pinned CDK CLI is missing (node_modules/.bin/cdk): run `make install`")
    found = shutil.which(name)
    if found is None:
        fix = ("install the AWS CLI v2 and, for ssm, the Session Manager plugin (docs/deploy.md, Prerequisites)"
               if name == "aws" else "install it")
        raise DeploymentError(f"{name} is not on PATH: {fix}")
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m stacks.deployment", description=__doc__.split("\n\n")[0])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--deployment", type=Path, default=DEFAULT_RECORD, metavar="FILE",
                        help="the deployment record (default: deployment.json at the repository root)")
    common.add_argument("--print", dest="print_only", action="store_true",
                        help="print the command lines instead of running them (no AWS call, nothing recorded)")
    context = argparse.ArgumentParser(add_help=False)
    context.add_argument("-c", "--context", action="append", default=[], metavar="KEY=VALUE",
                         help="a CDK context value, as `cdk -c` takes it (e.g. -c cluster.max_nodes=4)")
    region = argparse.ArgumentParser(add_help=False)
    region.add_argument("--region", help="refuse unless the recorded deployment is in this region")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, text in (("deploy", "cdk deploy, recording the deployment (default: every stack)"),
                       ("update", "cdk deploy of the recorded deployment's cluster stack")):
        command = sub.add_parser(name, parents=[common, context], help=text, description=text)
        if name == "deploy":
            command.add_argument("stacks", nargs="*", metavar="STACK", help=f"some of {', '.join(STACKS)}")
        command.add_argument("--no-rollback", action="store_true", help="keep what failed, to read why (cdk's)")
        command.add_argument("--force", action="store_true", help="deploy even if the templates did not change "
                             "(after an image build: the cluster reads the AMI parameter again)")
    command = sub.add_parser("destroy", parents=[common, context], help="cdk destroy of the recorded deployment")
    command.add_argument("stacks", nargs="*", metavar="STACK", help=f"some of {', '.join(STACKS)} (default: all)")
    command.add_argument("--yes", action="store_true", help="do not ask before deleting")
    command = sub.add_parser("image", parents=[common, region], help="start the GPU image build")
    command.add_argument("--published", action="store_true", help="print the AMI id the pipeline published instead")
    command = sub.add_parser("images", parents=[common, region],
                             help="the GPU images the pipeline built, and which an --prune would remove")
    command.add_argument("--prune", action="store_true",
                         help="deregister the images not kept and delete their snapshots")
    command.add_argument("--keep", type=int, default=KEEP,
                         help=f"how many of the newest images to keep besides those in use (default {KEEP})")
    command = sub.add_parser("ssm", parents=[common, region], help="a shell on the head node or PCS login node")
    command.add_argument("--target", help="another instance id of the deployment (e.g. a login node)")
    command = sub.add_parser("show", parents=[common], help="the record, or one value of it")
    command.add_argument("name", nargs="?", help="region, prefix, account, backend, bucket, head_node_instance_id, ...")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv, extra = list(sys.argv[1:] if argv is None else argv), []
    if "--" in argv:  # what follows goes to the CDK CLI as it is
        argv, extra = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    args = build_parser().parse_args(argv)
    try:
        given = context_pairs(getattr(args, "context", []), example="region=us-west-2")
        if getattr(args, "region", None):
            given["region"] = args.region
        request = Request(path=args.deployment, given=given, print_only=args.print_only)
        if args.command in ("deploy", "update"):
            options = [*(["--no-rollback"] if args.no_rollback else []), *(["--force"] if args.force else []), *extra]
            return deploy(request, getattr(args, "stacks", []), options, update=args.command == "update")
        if args.command == "destroy":
            return destroy(request, args.stacks, extra, confirmed=args.yes)
        if args.command == "image":
            return image(request, published=args.published)
        if args.command == "images":
            return images(request, remove=args.prune, keep=args.keep)
        if args.command == "ssm":
            return ssm(request, args.target)
        return show(request, args.name)
    except (DeploymentError, DottedKeyError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
