"""Typed deployment settings: one frozen tree, validated on construction.

Sources, lowest precedence first: the dataclass defaults, the `scdino` object of cdk.json's
context, a YAML file (`-c settings=path.yaml`), then single keys (`-c cluster.max_nodes=4`).
Only app.py gathers those sources; everything else receives a `Settings`.
"""

from __future__ import annotations

import ipaddress
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from stacks.shared.constants import CPU_SPOT_QUEUE
from stacks.shared.presets import PRESETS
from training.config.dotted import CONTEXT, ConversionError, dotted_keys, flatten_dotted, set_dotted
from training.costs.instances import compute_resource_name

PCLUSTER_VERSION = "3.16.1"
"""The ParallelCluster release deployed (provider template, base AMI, AMI tags) and whose own code checks the
configuration offline (requirements-pcluster.txt). 3.16.3 is newer, but PyPI offered no 3.16.2/3.16.3 on
2026-11-24, so its code could not check this app: docs/deploy.md says how to move on."""
SUPPORTED_OSES = ("alinux2023", "ubuntu2204", "rhel9")
# Oses ParallelCluster 3.16 accepts that this project cannot run, and why (named in the error).
REFUSED_OSES = {
    "rocky9": "ParallelCluster publishes no official rocky9 AMI for the head node and the image pipeline to start from",
    "ubuntu2404": "its archive has no python3.11, which the node environment (bootstrap/, ami/) is built with",
}
STACKS = ("network", "storage", "image", "cluster")
"""The four stacks of a deployment, each named `<prefix>-<stack>` (Settings.stack_names)."""
BACKENDS = ("parallelcluster", "pcs")
"""What runs Slurm: ParallelCluster's head node (custom resource), or AWS PCS's managed controller."""
PCS_SLURM_VERSION = "25.11"
"""The Slurm release PCS runs and the PCS image installs by default (ParallelCluster 3.16.1 ships 25.11.8 too)."""
PCS_SLURM_VERSIONS = ("24.11", "25.05", "25.11", "26.05")
"""Slurm releases PCS creates clusters with (CreateCluster's values in botocore's PCS model, 2026-11). A deploy
moves a cluster to a newer one in place (UpdateCluster: AWS::PCS::Cluster's Scheduler is not create-only),
never to an older one."""
PCS_GROUP_IDLE_SLURM = "25.11"
"""The first release whose PCS node groups take their own ScaleDownIdleTimeInSeconds (PCS API reference)."""
PCS_SIZES = {"SMALL": 32, "MEDIUM": 512, "LARGE": 2048}
"""PCS controller sizes and the instances each manages (aws_pcs.CfnCluster's `size`: SMALL 32 nodes and
256 jobs, MEDIUM 512 and 8,192, LARGE 2,048 and 16,384); the fee is per size (training/costs/prices.py)."""
PCS_CLUSTER_NAME_MAX = 40
"""PCS's limit on cluster names (the CloudFormation schema's `[A-Za-z][A-Za-z0-9-]{1,40}`)."""
PCS_GROUP_NAME_MAX = 25
"""PCS's limit on node group and queue names (botocore's PCS model: 3..25 characters)."""
DEFAULT_PCS_SIZE = "SMALL"
DEFAULT_LOGIN_INSTANCE_TYPE = "c6i.xlarge"
PCS_OSES = {"alinux2023": "Amazon Linux 2023", "ubuntu2204": "Ubuntu 22.04"}
PCS_CAPACITY_BLOCK_FAMILIES = ("p4d", "p5", "p5e", "p5en", "p6-b200", "p6-b300")
"""Instance families whose Capacity Blocks PCS supports (AWS PCS User Guide, "Using Amazon EC2 Capacity
Blocks for ML with AWS PCS", limitations)."""
"""Oses of AWS's Deep Learning Base GPU AMI, which the PCS image starts from (ami/pcs-image.pkr.hcl)."""
CLUSTER_NAME_MAX = 60
"""ParallelCluster's limit on cluster names (PCLUSTER_NAME_MAX_LENGTH; a test reads it from its code)."""
CLUSTER_NAME_MAX_ACCOUNTING = 40
"""Its shorter limit when Slurm accounting is on (PCLUSTER_NAME_MAX_LENGTH_SLURM_ACCOUNTING)."""
FSX_THROUGHPUTS = (125, 250, 500, 1000)
_LOG_RETENTIONS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1827, 3653)
_NAME = re.compile(r"^[a-z][a-z0-9-]*$")
_AZ = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$")
_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d$")
_INSTANCE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9]+$")
_AMI = re.compile(r"^ami-([0-9a-f]{8}|[0-9a-f]{17})$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[A-Za-z]{2,}$")
_RESERVATION = re.compile(r"^cr-([0-9a-f]{8}|[0-9a-f]{17})$")
CAPACITY_TYPES = ("ONDEMAND", "SPOT", "CAPACITY_BLOCK")
_DB_URI = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?:(\d{1,5})$")
_DB_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}$")
_DB_NAME = re.compile(r"^[0-9a-z_]{1,64}$")
_SECRET_ARN = re.compile(r"^arn:aws(-[a-z]+)*:secretsmanager:([a-z]{2}(-[a-z]+)+-\d):\d{12}:secret:[A-Za-z0-9/_+=.@-]+$")


class SettingsError(ValueError):
    """A setting has a wrong value; the message names the setting and what is allowed."""


def _fail(key: str, message: str) -> typing.NoReturn:
    raise SettingsError(f"setting {key}: {message}")


def _check(condition: bool, key: str, message: str) -> None:
    if not condition:
        _fail(key, message)


@dataclass(frozen=True)
class NetworkSettings:
    """The VPC: one AZ, because EFA and cluster placement groups cannot span zones."""

    availability_zone: str = "us-east-1a"
    vpc_cidr: str = "10.0.0.0/16"
    flow_log_retention_days: int = 30

    def __post_init__(self) -> None:
        _check(bool(_AZ.match(self.availability_zone)), "network.availability_zone",
               f"expected an availability zone such as us-east-1a, got {self.availability_zone!r}")
        try:
            net = ipaddress.ip_network(self.vpc_cidr)
        except ValueError:
            _fail("network.vpc_cidr", f"expected an IPv4 CIDR such as 10.0.0.0/16, got {self.vpc_cidr!r}")
        _check(16 <= net.prefixlen <= 20, "network.vpc_cidr",
               f"prefix length must be /16../20 to fit two /24+ subnets, got /{net.prefixlen}")
        _check(self.flow_log_retention_days in _LOG_RETENTIONS, "network.flow_log_retention_days",
               f"must be one of CloudWatch's values {_LOG_RETENTIONS}, got {self.flow_log_retention_days}")


@dataclass(frozen=True)
class StorageSettings:
    """The data bucket and the FSx for Lustre file system linked to it."""

    fsx_capacity_gib: int = 1200
    fsx_throughput_per_tib: int = 250
    fsx_compression: str = "LZ4"
    noncurrent_version_days: int = 30
    """Days a replaced or deleted object version of the data bucket is kept (checkpoints are re-exported often)."""
    data_prefix: str = "data"
    """S3 prefix (no slashes) linked to /fsx/<data_prefix> by the data repository association."""
    retain: bool = True
    """Keep bucket and file system on `cdk destroy` (termination protection too); false for throw-away demos."""

    def __post_init__(self) -> None:
        cap = self.fsx_capacity_gib
        _check(cap == 1200 or (cap > 0 and cap % 2400 == 0), "storage.fsx_capacity_gib",
               f"PERSISTENT_2 takes 1200 or a multiple of 2400 GiB, got {cap}")
        _check(self.fsx_throughput_per_tib in FSX_THROUGHPUTS, "storage.fsx_throughput_per_tib",
               f"must be one of {FSX_THROUGHPUTS}, got {self.fsx_throughput_per_tib}")
        _check(1 <= self.noncurrent_version_days <= 3650, "storage.noncurrent_version_days",
               f"must be 1..3650, got {self.noncurrent_version_days}")
        _check(self.fsx_compression in ("LZ4", "NONE"), "storage.fsx_compression",
               f"must be LZ4 or NONE, got {self.fsx_compression!r}")
        _check(bool(re.fullmatch(r"[a-z0-9][a-z0-9_-]*", self.data_prefix)), "storage.data_prefix",
               f"must be one path segment of lowercase letters, digits, '-' or '_', got {self.data_prefix!r}")


@dataclass(frozen=True)
class ImageSettings:
    """The Packer GPU image pipeline (CodeBuild) and where it publishes the AMI id."""

    os: str = "alinux2023"
    """Os of every node: the head node boots ParallelCluster's official AMI of it, the image pipeline builds on it."""
    build_instance_type: str = "g4dn.xlarge"
    pcs_slurm_version: str = PCS_SLURM_VERSION
    """backend=pcs: the Slurm release the PCS image installs and the PCS cluster runs (docs/deploy.md, "Slurm
    version and size of a PCS cluster", says how to move to a newer one)."""

    def __post_init__(self) -> None:
        _check(self.pcs_slurm_version in PCS_SLURM_VERSIONS, "image.pcs_slurm_version",
               f"must be one of PCS's Slurm releases {PCS_SLURM_VERSIONS}, got {self.pcs_slurm_version!r}")
        _check(self.os not in REFUSED_OSES, "image.os",
               f"{self.os} cannot work: {REFUSED_OSES.get(self.os)}; choose one of {SUPPORTED_OSES}")
        _check(self.os in SUPPORTED_OSES, "image.os", f"must be one of {SUPPORTED_OSES}, got {self.os!r}")
        _check(bool(_INSTANCE.match(self.build_instance_type)), "image.build_instance_type",
               f"expected an EC2 instance type such as g4dn.xlarge, got {self.build_instance_type!r}")


@dataclass(frozen=True)
class SlurmAccountingSettings:
    """Slurm accounting (`sacct`, fair share) in a MySQL-compatible database you run; off while `uri` is empty."""

    uri: str = ""
    """host:port of the database, reachable from the cluster's subnet (e.g. an RDS or Aurora MySQL endpoint)."""
    user_name: str = ""
    password_secret_arn: str = ""
    """Secrets Manager secret holding the password as plain text; ParallelCluster lets the head node read it."""
    database_name: str = ""
    """Empty: ParallelCluster's default (derived from the cluster name)."""

    @property
    def enabled(self) -> bool:
        return bool(self.uri)

    def __post_init__(self) -> None:
        key = "cluster.slurm_accounting"
        given = {name: getattr(self, name) for name in ("uri", "user_name", "password_secret_arn")}
        if not any(given.values()) and not self.database_name:
            return
        for name, value in given.items():
            _check(bool(value), f"{key}.{name}", "required when Slurm accounting is configured")
        port = _DB_URI.match(self.uri)
        _check(bool(port) and 1 <= int(port[2]) <= 65535, f"{key}.uri",
               f"expected host:port without a scheme, e.g. db.example.internal:3306, got {self.uri!r}")
        _check(bool(_DB_USER.match(self.user_name)), f"{key}.user_name",
               f"expected 1..32 letters, digits, '_', '.' or '-', got {self.user_name!r}")
        _check(bool(_SECRET_ARN.match(self.password_secret_arn)), f"{key}.password_secret_arn",
               "expected arn:<partition>:secretsmanager:<region>:<account>:secret:<name>, "
               f"got {self.password_secret_arn!r}")
        _check(self.database_name == "" or bool(_DB_NAME.match(self.database_name)), f"{key}.database_name",
               f"expected empty or 1..64 of a-z, 0-9, '_', got {self.database_name!r}")

    @property
    def secret_region(self) -> str:
        match = _SECRET_ARN.match(self.password_secret_arn)
        return match[2] if match else ""


@dataclass(frozen=True)
class ClusterSettings:
    """The Slurm cluster: one queue per preset, shared storage, and a head node (ParallelCluster) or a managed
    controller and login node (PCS)."""

    name: str = "hpc"
    """The cluster is named `<prefix>-<name>` (ParallelCluster names its own stack after it)."""
    head_node_instance_type: str = "c6i.2xlarge"
    presets: tuple[str, ...] = ("g4dn.12xlarge",)
    min_nodes: int = 0
    """Static nodes per queue (billed while the cluster exists)."""
    max_nodes: int = 2
    custom_ami: str = ""
    """Empty: the official ParallelCluster AMI (backend=pcs: the pipeline's, as `ssm`); `ssm`: the AMI the image
    pipeline published; or an ami- id."""
    apps_volume_gib: int = 200
    root_volume_gib: int = 200
    scaledown_idle_minutes: int = 10
    """Minutes an idle dynamic node runs before it is stopped (ParallelCluster's ScaledownIdletime; PCS's
    cluster-wide ScaleDownIdleTimeInSeconds)."""
    scaledown_idle_minutes_per_queue: tuple[str, ...] = ()
    """backend=pcs: QUEUE=MINUTES pairs that override scaledown_idle_minutes for one node group, QUEUE a preset
    (p5.48xlarge) or a queue (gpu-p548xl, cpu-spot), e.g. `p5.48xlarge=3,cpu-spot=2`: idle p5 nodes stop sooner."""
    log_retention_days: int = 30
    capacity_type: str = "ONDEMAND"
    """GPU queues: ONDEMAND, SPOT (interruptible; pretraining resumes from its checkpoints), or CAPACITY_BLOCK
    (EC2 Capacity Blocks for ML: min_nodes == max_nodes, a reservation id)."""
    capacity_reservation_id: str = ""
    """cr-... : GPU nodes launch into this On-Demand Capacity Reservation or Capacity Block (one preset only)."""
    gpu_health_checks: bool = False
    """ParallelCluster's DCGM check of the GPUs before each job on a GPU queue (adds minutes to job start)."""
    cpu_spot_instance_type: str = ""
    """Empty: no CPU queue; else a Spot queue `cpu-spot` of this type for work that needs no GPU (`--partition`)."""
    cpu_spot_max_nodes: int = 4
    login_nodes: int = 0
    """Login nodes (billed while the cluster exists) where users work instead of on the head node."""
    login_node_instance_type: str = DEFAULT_LOGIN_INSTANCE_TYPE
    pcs_size: str = DEFAULT_PCS_SIZE
    """backend=pcs: the managed controller's size, which caps the instances it manages and sets its hourly fee.
    Another size is another cluster: the deploy creates it beside the old one, which it then deletes."""
    alarm_email: str = ""
    """E-mail address subscribed to the alarms' SNS topic (AWS mails a confirmation first); empty: none."""
    slurm_accounting: SlurmAccountingSettings = field(default_factory=SlurmAccountingSettings)

    def __post_init__(self) -> None:
        _check(bool(_NAME.match(self.name)) and len(self.name) <= 40, "cluster.name",
               f"must start with a letter, hold only lowercase letters, digits and '-', <= 40 chars; got {self.name!r}")
        _check(bool(_INSTANCE.match(self.head_node_instance_type)), "cluster.head_node_instance_type",
               f"expected an EC2 instance type such as c6i.2xlarge, got {self.head_node_instance_type!r}")
        _check(len(self.presets) > 0, "cluster.presets", f"choose at least one of {sorted(PRESETS)}")
        for preset in self.presets:
            _check(preset in PRESETS, "cluster.presets", f"unknown preset {preset!r}; choose from {sorted(PRESETS)}")
        _check(len(set(self.presets)) == len(self.presets), "cluster.presets", "lists a preset twice")
        _check(self.min_nodes >= 0, "cluster.min_nodes", f"must be >= 0, got {self.min_nodes}")
        _check(self.max_nodes >= max(self.min_nodes, 1), "cluster.max_nodes",
               f"must be >= 1 and >= cluster.min_nodes ({self.min_nodes}), got {self.max_nodes}")
        _check(self.custom_ami in ("", "ssm") or bool(_AMI.match(self.custom_ami)), "cluster.custom_ami",
               f"must be empty (official AMI), 'ssm' (built image) or an ami- id, got {self.custom_ami!r}")
        for key in ("apps_volume_gib", "root_volume_gib"):
            _check(40 <= getattr(self, key) <= 16384, f"cluster.{key}", f"must be 40..16384, got {getattr(self, key)}")
        _check(self.scaledown_idle_minutes >= 1, "cluster.scaledown_idle_minutes", "must be >= 1")
        self._check_idle_per_queue()
        _check(self.log_retention_days in _LOG_RETENTIONS, "cluster.log_retention_days",
               f"must be one of CloudWatch's values {_LOG_RETENTIONS}, got {self.log_retention_days}")
        self._check_capacity()
        _check(self.cpu_spot_instance_type == "" or bool(_INSTANCE.match(self.cpu_spot_instance_type)),
               "cluster.cpu_spot_instance_type",
               f"expected empty or an EC2 instance type such as c6i.8xlarge, got {self.cpu_spot_instance_type!r}")
        _check(self.cpu_spot_max_nodes >= 1, "cluster.cpu_spot_max_nodes", f"must be >= 1, got {self.cpu_spot_max_nodes}")
        _check(0 <= self.login_nodes <= 10, "cluster.login_nodes", f"must be 0..10, got {self.login_nodes}")
        _check(bool(_INSTANCE.match(self.login_node_instance_type)), "cluster.login_node_instance_type",
               f"expected an EC2 instance type such as c6i.xlarge, got {self.login_node_instance_type!r}")
        _check(self.alarm_email == "" or bool(_EMAIL.match(self.alarm_email)), "cluster.alarm_email",
               f"expected empty or an e-mail address such as ops@example.org, got {self.alarm_email!r}")

    def _check_idle_per_queue(self) -> None:
        key = "cluster.scaledown_idle_minutes_per_queue"
        queues = {PRESETS[name].queue_name for name in self.presets if name in PRESETS}
        queues |= {CPU_SPOT_QUEUE} if self.cpu_spot_instance_type else set()
        seen: set[str] = set()
        for entry in self.scaledown_idle_minutes_per_queue:
            name, _, minutes = entry.partition("=")
            queue = PRESETS[name].queue_name if name in PRESETS else name
            _check(queue in queues, key, f"{entry!r} names no queue of this cluster: write QUEUE=MINUTES with QUEUE "
                   f"one of {sorted(queues)} or its preset")
            _check(minutes.isdigit() and int(minutes) >= 1, key, f"{entry!r}: MINUTES must be a whole number >= 1")
            _check(queue not in seen, key, f"names queue {queue} twice")
            seen.add(queue)

    @property
    def idle_minutes_by_queue(self) -> dict[str, int]:
        """{queue: minutes} of scaledown_idle_minutes_per_queue, presets given as their queue names."""
        pairs = (entry.partition("=") for entry in self.scaledown_idle_minutes_per_queue)
        return {(PRESETS[name].queue_name if name in PRESETS else name): int(minutes) for name, _, minutes in pairs}

    def _check_capacity(self) -> None:
        _check(self.capacity_type in CAPACITY_TYPES, "cluster.capacity_type",
               f"must be one of {CAPACITY_TYPES}, got {self.capacity_type!r}")
        _check(self.capacity_reservation_id == "" or bool(_RESERVATION.match(self.capacity_reservation_id)),
               "cluster.capacity_reservation_id", f"expected empty or cr-..., got {self.capacity_reservation_id!r}")
        _check(not self.capacity_reservation_id or len(self.presets) == 1, "cluster.capacity_reservation_id",
               f"a reservation holds one instance type: choose one preset, got {list(self.presets)}")
        _check(self.capacity_type != "SPOT" or not self.capacity_reservation_id, "cluster.capacity_reservation_id",
               "Spot instances cannot run in a capacity reservation: empty it, or choose ONDEMAND or CAPACITY_BLOCK")
        _check(self.pcs_size in PCS_SIZES, "cluster.pcs_size", f"must be one of {tuple(PCS_SIZES)}, got {self.pcs_size!r}")
        if self.capacity_type == "CAPACITY_BLOCK":
            _check(bool(self.capacity_reservation_id), "cluster.capacity_reservation_id",
                   "required when cluster.capacity_type is CAPACITY_BLOCK")
            _check(self.min_nodes == self.max_nodes, "cluster.min_nodes",
                   f"must equal cluster.max_nodes ({self.max_nodes}) with CAPACITY_BLOCK, got {self.min_nodes}")



@dataclass(frozen=True)
class Settings:
    """Everything a deployment can choose; stack names start with `prefix`."""

    prefix: str = "scdino"
    backend: str = "parallelcluster"
    """parallelcluster: a head node run by ParallelCluster's custom resource; pcs: AWS PCS's managed Slurm
    controller with a login node (docs/deploy.md says when to choose which)."""
    region: str = "us-east-1"
    account: str = ""
    """Empty: account-agnostic stacks, deployed to the account of the CLI's credentials."""
    network: NetworkSettings = field(default_factory=NetworkSettings)
    storage: StorageSettings = field(default_factory=StorageSettings)
    image: ImageSettings = field(default_factory=ImageSettings)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)

    def __post_init__(self) -> None:
        _check(self.backend in BACKENDS, "backend",
               f"must be one of {BACKENDS} (e.g. -c backend=pcs), got {self.backend!r}")
        _check(bool(re.fullmatch(r"[a-z][a-z0-9-]{0,30}", self.prefix)), "prefix",
               "must start with a letter, hold only lowercase letters, digits and '-', <= 31 chars; "
               f"got {self.prefix!r}")
        _check(bool(_REGION.match(self.region)), "region", f"expected a region such as us-east-1, got {self.region!r}")
        _check(self.account == "" or bool(re.fullmatch(r"\d{12}", self.account)), "account",
               "must be empty or 12 digits")
        _check(self.network.availability_zone.startswith(self.region), "network.availability_zone",
               f"{self.network.availability_zone!r} is not in region {self.region!r}")
        _check(self.cluster.name not in STACKS, "cluster.name",
               f"ParallelCluster names its own stack after the cluster ({self.cluster_name}): "
               f"choose a name other than {STACKS}")
        _check(len(self.cluster_name) <= CLUSTER_NAME_MAX, "cluster.name",
               f"the cluster name {self.cluster_name!r} (prefix-name) is longer than {CLUSTER_NAME_MAX} characters")
        self._check_accounting()
        if self.backend == "pcs":
            self._check_pcs()
        else:
            _check(not self.cluster.scaledown_idle_minutes_per_queue, "cluster.scaledown_idle_minutes_per_queue",
                   "ParallelCluster stops idle nodes after one time for the whole cluster (SlurmSettings/"
                   "ScaledownIdletime): leave it empty and set cluster.scaledown_idle_minutes, or use backend=pcs")

    def _check_pcs(self) -> None:
        """What PCS cannot do the ParallelCluster way, each refused with its fix."""
        cluster = self.cluster
        _check(len(self.pcs_cluster_name) <= PCS_CLUSTER_NAME_MAX, "cluster.name",
               f"the cluster name {self.pcs_cluster_name!r} (prefix-name, then the size unless {DEFAULT_PCS_SIZE}) is "
               f"longer than {PCS_CLUSTER_NAME_MAX} characters, PCS's limit")
        for group, setting in ((self.pcs_login_group, "login_node_instance_type"),
                               (self.pcs_cpu_spot_group, "cpu_spot_instance_type")):
            _check(len(group) <= PCS_GROUP_NAME_MAX, f"cluster.{setting}",
                   f"the PCS node group name {group!r} it gives is longer than {PCS_GROUP_NAME_MAX} characters, PCS's "
                   "limit: choose an instance type with a shorter name")
        _check(not cluster.scaledown_idle_minutes_per_queue or slurm_release(self.image.pcs_slurm_version)
               >= slurm_release(PCS_GROUP_IDLE_SLURM), "cluster.scaledown_idle_minutes_per_queue",
               f"PCS node groups take their own idle time from Slurm {PCS_GROUP_IDLE_SLURM} on, image.pcs_slurm_version "
               f"is {self.image.pcs_slurm_version}: leave it empty or choose a newer release")
        _check(not cluster.slurm_accounting.enabled and not cluster.slurm_accounting.database_name,
               "cluster.slurm_accounting", "PCS runs its own accounting database (always on with backend=pcs): leave "
               "cluster.slurm_accounting empty")
        _check(not cluster.gpu_health_checks, "cluster.gpu_health_checks",
               "ParallelCluster's DCGM check before each job has no PCS counterpart: set it false with backend=pcs")
        _check(self.image.os in PCS_OSES, "image.os",
               f"the PCS image starts from AWS's Deep Learning Base GPU AMI, published for {tuple(PCS_OSES)}, "
               f"not {self.image.os!r}")
        if cluster.capacity_type == "CAPACITY_BLOCK":
            families = sorted({name.split(".")[0] for name in cluster.presets} - set(PCS_CAPACITY_BLOCK_FAMILIES))
            _check(not families, "cluster.capacity_type",
                   f"PCS takes Capacity Blocks of {PCS_CAPACITY_BLOCK_FAMILIES} instances only, not {families}: "
                   "choose such a preset, or ONDEMAND")
        managed = self.pcs_instances_max
        limit = PCS_SIZES[cluster.pcs_size]
        _check(managed <= limit, "cluster.pcs_size",
               f"{cluster.pcs_size} manages up to {limit} instances, the node groups may run {managed} (max_nodes per "
               f"preset, cpu_spot_max_nodes, login nodes): choose a larger size of {tuple(PCS_SIZES)} or fewer nodes")

    @property
    def pcs_cluster_name(self) -> str:
        """The PCS cluster's name: cluster_name, with the size after it unless SMALL (scdino-hpc-medium). PCS names
        are unique in a region and CloudFormation replaces a cluster whose size changes, creating the new one
        before it deletes the old: the name changes with the size, so both can exist (the default keeps the name
        clusters had before the size was in it)."""
        size = self.cluster.pcs_size
        return self.cluster_name + ("" if size == DEFAULT_PCS_SIZE else f"-{size.lower()}")

    @property
    def pcs_login_group(self) -> str:
        """The PCS login node group's name: `login`, or `login-<type>` for another type than the default. A node
        group's instance type cannot change in place: CloudFormation creates the new group before it deletes the
        old one, and names are unique in a cluster, so the name follows the type."""
        instance_type = self.cluster.login_node_instance_type
        return "login" + ("" if instance_type == DEFAULT_LOGIN_INSTANCE_TYPE else f"-{compute_resource_name(instance_type)}")

    @property
    def pcs_cpu_spot_group(self) -> str:
        """The PCS node group behind the cpu-spot queue, named after its instance type (see pcs_login_group)."""
        instance_type = self.cluster.cpu_spot_instance_type
        return f"{CPU_SPOT_QUEUE}-{compute_resource_name(instance_type)}" if instance_type else ""

    @property
    def pcs_login_nodes(self) -> int:
        """Login nodes with backend=pcs: at least one, the only way in (PCS has no head node)."""
        return max(1, self.cluster.login_nodes)

    @property
    def pcs_instances_max(self) -> int:
        cluster = self.cluster
        cpu = cluster.cpu_spot_max_nodes if cluster.cpu_spot_instance_type else 0
        return len(cluster.presets) * cluster.max_nodes + cpu + self.pcs_login_nodes

    @property
    def node_ami(self) -> str:
        """The AMI the GPU nodes boot: "" ParallelCluster's official one, "ssm" the pipeline's, or an ami- id.
        PCS has no official image with this stack on it, so with backend=pcs "" means the pipeline's."""
        if self.backend == "pcs" and not self.cluster.custom_ami:
            return "ssm"
        return self.cluster.custom_ami

    def _check_accounting(self) -> None:
        accounting = self.cluster.slurm_accounting
        if not accounting.enabled:
            return
        _check(len(self.cluster_name) <= CLUSTER_NAME_MAX_ACCOUNTING, "cluster.name",
               f"the cluster name {self.cluster_name!r} (prefix-name) is longer than {CLUSTER_NAME_MAX_ACCOUNTING} "
               "characters, ParallelCluster's limit with Slurm accounting")
        _check(accounting.secret_region == self.region, "cluster.slurm_accounting.password_secret_arn",
               f"the secret is in {accounting.secret_region}, the cluster in {self.region}: use a secret of {self.region}")

    @property
    def stack_names(self) -> dict[str, str]:
        """{stack: its CloudFormation name}, e.g. {"network": "scdino-network", ...}: unique per prefix."""
        return {stack: f"{self.prefix}-{stack}" for stack in STACKS}

    @property
    def cluster_name(self) -> str:
        """ParallelCluster's cluster name: unique per prefix, so two deployments in one account do not collide."""
        return f"{self.prefix}-{self.cluster.name}"

    @property
    def ami_parameter(self) -> str:
        """SSM parameter the image pipeline publishes its AMI id to (per prefix and back end: the PCS image
        carries the PCS agent and Slurm, the ParallelCluster one ParallelCluster's own stack)."""
        return f"/{self.prefix}/ami/gpu" + ("-pcs" if self.backend == "pcs" else "")


def slurm_release(version: str) -> tuple[int, ...]:
    """A Slurm release as numbers, so that 25.11 < 26.05 compares as releases do."""
    return tuple(int(part) for part in version.split("."))


def setting_keys(cls: type = Settings) -> list[str]:
    """Every dotted key a user may set, e.g. `cluster.max_nodes`."""
    return dotted_keys(cls)


def build_settings(*layers: Mapping[str, Any]) -> Settings:
    """Merge layers (later wins; nested or dotted keys) into validated `Settings`; values are converted
    as CDK context arrives (`-c` values always as strings)."""
    merged: dict[str, Any] = {}
    known = set(setting_keys())
    for layer in layers:
        for key, value in flatten_dotted(layer).items():
            _check(key in known, key, f"unknown setting; known settings: {', '.join(sorted(known))}")
            merged[key] = value
    tree: dict[str, Any] = {}
    for key, value in merged.items():
        set_dotted(tree, key, value, Settings)
    try:
        return CONTEXT.build(Settings, tree)
    except ConversionError as error:
        _fail(error.key, f"expected {error.expected}, got {error.value!r}")


def load_settings_file(path: str) -> dict[str, Any]:
    """Read a settings YAML file (a mapping shaped like `Settings`)."""
    file = Path(path)
    _check(file.is_file(), "settings", f"file {path!r} does not exist")
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as error:
        _fail("settings", f"{path!r} is not valid YAML: {str(error).splitlines()[0]}")
    _check(isinstance(data, Mapping), "settings", f"{path!r} must hold a mapping at the top level")
    return dict(data)


def settings_from(context: Callable[[str], Any]) -> Settings:
    """Merge defaults (cdk.json's `scdino` object), the settings file (`-c settings=...`) and single
    `-c key=value` overrides, in that order; `context` returns a context value or None, as CDK's
    `node.try_get_context` does (app.py) or a dict of cdk.json and `-c` pairs (`python -m training plan`)."""
    layers = [context("scdino") or {}]
    settings_file = context("settings")
    if settings_file:
        layers.append(load_settings_file(settings_file))
    overrides = {key: context(key) for key in setting_keys()}
    layers.append({key: value for key, value in overrides.items() if value is not None})
    return build_settings(*layers)
