"""Run by the aws-parallelcluster virtualenv: ParallelCluster 3.16's own code on our configurations.

stdin: a JSON object with any of
  "schema":     {label: config}            -> {label: [error, ...]}  (schema load + name validators)
  "patches":    {label: [base, target(, fleet_running)]} -> {label: {"changes": [[path, policy], ...], "allowed": bool}}
                                              (the compute fleet runs unless fleet_running is false)
  "ami_tags":   {label: {tag: value}}      -> {label: [(level, message), ...]}  (CustomAmiTagValidator)
  "os_ami":     {label: [os, custom_ami]}  -> {label: [(level, message), ...]}  (OsCustomAmiValidator)
  "cluster_names": [name, ...]             -> {name: [(level, message), ...]}  (ClusterNameValidator)
  "fsx_networking": {label: {"groups": {id: {IpPermissions, IpPermissionsEgress}}, "fsx_groups": [id],
                    "nodes": [[id, ...], ...]}}  -> {label: [(level, message), ...]}  (ExistingFsxNetworkingValidator)
  "queues":     {label: config}            -> {label: [(level, message), ...]}  (per-queue validators that
                                              need no AWS call: ComputeResourceSize, EfaPlacementGroup)
  "accounting": {label: [cluster_name, config]} -> {label: [(level, message), ...]}  (Slurm database: its URI
                                              and secret validators, secret described by a stub; ClusterNameValidator)
  "constants":  [name, ...]                -> {name: value}                    (pcluster.constants)
  "version":    true                       -> the installed aws-parallelcluster version
stdout: the same keys with the results. AWS calls are stubbed; none is made.
"""

import importlib.metadata
import json
import os
import sys
from types import SimpleNamespace
from unittest import mock

os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"  # no credential lookup on the network either


def _refuse_aws_call(client, operation_name, _params):
    """Any boto3 call ParallelCluster's code tries raises here, before anything leaves the machine."""
    raise NoCredentialsError()

from botocore.client import BaseClient  # noqa: E402
from botocore.exceptions import NoCredentialsError  # noqa: E402
from marshmallow import ValidationError  # noqa: E402
from pcluster import constants  # noqa: E402
from pcluster.config.config_patch import ConfigPatch  # noqa: E402
from pcluster.schemas.cluster_schema import ClusterSchema  # noqa: E402
from pcluster.validators import cluster_validators, database_validators, directory_service_validators  # noqa: E402

CLUSTER_NAME = "scdino-hpc"
SLURM = SimpleNamespace(settings=SimpleNamespace(database=None, external_slurmdbd=None))
"""Slurm settings as ClusterNameValidator reads them: no accounting database."""


def schema_errors(config):
    try:
        loaded = ClusterSchema(cluster_name=CLUSTER_NAME).load(config)
    except ValidationError as error:
        return [json.dumps(error.messages, sort_keys=True, default=str)]
    errors = []
    for queue in loaded.scheduling.queues:
        for name in [queue.name] + [resource.name for resource in queue.compute_resources]:
            errors.extend(failure.message for failure in cluster_validators.NameValidator().execute(name=name))
    return errors


class RunningCluster:
    """What ConfigPatch's update-policy checks ask of an existing cluster: one whose compute fleet runs
    (or is stopped, with fleet_running=False)."""

    name = CLUSTER_NAME
    stack_name = CLUSTER_NAME
    head_node_instance = SimpleNamespace(state="running")

    def __init__(self, fleet_running=True):
        self.fleet_running = fleet_running

    def has_running_capacity(self, *_args, **_kwargs):
        return self.fleet_running

    @staticmethod
    def has_running_login_nodes(*_args, **_kwargs):
        return False


def patch(base, target, fleet_running=True):
    config_patch = ConfigPatch(RunningCluster(fleet_running), base, target)
    allowed, _rows = config_patch.check()
    changes = [[".".join([*map(str, change.path), change.key]), change.update_policy.name]
               for change in config_patch.changes]
    return {"changes": changes, "allowed": allowed}


def failures(validator, **kwargs):
    return [[failure.level.name, failure.message] for failure in validator.execute(**kwargs)]


def ami_tag_failures(tags):
    image = SimpleNamespace(tags=[{"Key": key, "Value": value} for key, value in tags.items()])
    api = SimpleNamespace(ec2=SimpleNamespace(describe_image=lambda ami_id: image))
    with mock.patch.object(cluster_validators.AWSApi, "instance", return_value=api):
        return failures(cluster_validators.CustomAmiTagValidator(), custom_ami="ami-0123456789abcdef0")


def accounting_failures(cluster_name, config):
    """The validators ParallelCluster registers for Scheduling/SlurmSettings/Database, and the cluster
    name rule that depends on it; Secrets Manager's DescribeSecret answers as for an existing secret."""
    loaded = ClusterSchema(cluster_name=cluster_name).load(config)
    database = loaded.scheduling.settings.database
    found = failures(database_validators.DatabaseUriValidator(), uri=database.uri)
    secrets = SimpleNamespace(describe_secret=lambda arn: {"ARN": arn})
    with mock.patch.object(directory_service_validators.AWSApi, "instance",
                           return_value=SimpleNamespace(secretsmanager=secrets)):
        found += failures(directory_service_validators.PasswordSecretArnValidator(),
                          password_secret_arn=database.password_secret_arn, region=loaded.region)
    return found + failures(cluster_validators.ClusterNameValidator(), name=cluster_name, scheduling=loaded.scheduling)


def queue_failures(config):
    loaded = ClusterSchema(cluster_name=CLUSTER_NAME).load(config)
    found = []
    for queue in loaded.scheduling.queues:
        for resource in queue.compute_resources:
            found += failures(cluster_validators.ComputeResourceSizeValidator(), min_count=resource.min_count,
                              max_count=resource.max_count, capacity_type=queue.capacity_type)
            found += failures(
                cluster_validators.EfaPlacementGroupValidator(), efa_enabled=resource.efa.enabled,
                placement_group_key=queue.get_placement_group_settings_for_compute_resource(resource).get("key"),
                placement_group_disabled=queue.get_chosen_placement_group_setting_for_compute_resource(
                    resource).enabled is False,
                # multi_az_enabled maps subnets to zones through EC2; one subnet is one zone.
                multi_az_enabled=len(queue.networking.subnet_ids) > 1, capacity_type=queue.capacity_type,
                queue_name=queue.name)
    return found


def fsx_networking_failures(case):
    """ExistingFsxNetworkingValidator on one Lustre file system in the cluster's VPC whose interface
    carries `fsx_groups`, with EC2's answers about the groups taken from `groups`."""
    vpc, interface = "vpc-0123456789abcdef0", "eni-0123456789abcdef0"
    file_system = SimpleNamespace(file_system_id="fs-0123456789abcdef0", file_cache_id=None, vpc_id=vpc,
                                  network_interface_ids=[interface], file_storage_type="LUSTRE")
    ec2 = SimpleNamespace(
        get_subnet_vpc=lambda subnet_id: vpc,
        get_subnet_cidr=lambda subnet_id: "10.0.16.0/20",
        describe_network_interfaces=lambda ids: [
            {"NetworkInterfaceId": interface, "VpcId": vpc, "Groups": [{"GroupId": g} for g in case["fsx_groups"]]}],
        describe_security_groups=lambda ids: [{"GroupId": g, **case["groups"][g]} for g in ids])
    api = SimpleNamespace(ec2=ec2, fsx=SimpleNamespace(get_file_systems_info=lambda ids: [file_system]))
    with mock.patch.object(cluster_validators.AWSApi, "instance", return_value=api):
        return failures(cluster_validators.ExistingFsxNetworkingValidator(), file_storage_ids=[file_system.file_system_id],
                        subnet_ids=["subnet-0123456789abcdef0"],
                        security_groups_by_nodes={frozenset(groups) for groups in case["nodes"]})


def main():
    BaseClient._make_api_call = _refuse_aws_call
    request = json.load(sys.stdin)
    result = {
        "schema": {label: schema_errors(config) for label, config in request.get("schema", {}).items()},
        "patches": {label: patch(*pair) for label, pair in request.get("patches", {}).items()},
        "ami_tags": {label: ami_tag_failures(tags) for label, tags in request.get("ami_tags", {}).items()},
        "os_ami": {label: failures(cluster_validators.OsCustomAmiValidator(), os=os_name, custom_ami=ami)
                   for label, (os_name, ami) in request.get("os_ami", {}).items()},
        "cluster_names": {name: failures(cluster_validators.ClusterNameValidator(), name=name, scheduling=SLURM)
                          for name in request.get("cluster_names", [])},
        "constants": {name: getattr(constants, name) for name in request.get("constants", [])},
        "version": importlib.metadata.version("aws-parallelcluster") if request.get("version") else None,
        "fsx_networking": {label: fsx_networking_failures(case)
                           for label, case in request.get("fsx_networking", {}).items()},
        "queues": {label: queue_failures(config) for label, config in request.get("queues", {}).items()},
        "accounting": {label: accounting_failures(*case) for label, case in request.get("accounting", {}).items()},
    }
    json.dump(result, sys.stdout, default=str)


if __name__ == "__main__":
    main()
