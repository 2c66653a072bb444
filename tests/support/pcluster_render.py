"""Run by the aws-parallelcluster virtualenv: ParallelCluster 3.16's own create path renders the cluster stack.

    .venv-pcluster/bin/python tests/support/pcluster_render.py < request.json > summary.json

On a `Custom::PclusterCluster` create, the provider's Lambda adds tags to the configuration and calls
`pcluster.lib.create_cluster`, that is `Cluster(name, yaml.dump(config)).create()`: load the schema, validate,
upload the configuration with its implied values (what the nodes read) and the instance types data to the
cluster bucket, build the CloudFormation template with CDK v1, upload it and its nested stacks, and call
CreateStack. This script runs that same `create()`, with validators suppressed (SuppressValidators ALL: they
need live AWS answers; tests/support/pcluster_check.py runs the ones that do not). Every AWS API operation it
makes is answered here, at botocore's one entry point, by fixed answers: ParallelCluster's own client
wrappers, caches and bucket code all run. An operation with no answer fails, naming itself.

stdin: {"cluster_name": str, "outdir": str, "renders": {label: {"region": str, "zone": str, "config": {...}}}}
  (zone: the availability zone of the configuration's subnets)
stdout: {label: {"seconds": float, "files": [path, ...], "operations": ["service:Operation", ...]}}
Each render writes under outdir/<label>/ what ParallelCluster put in its bucket, by key below the cluster's
artifact directory (templates/aws-parallelcluster.cfn.yaml; assets/<id>.json, the nested stacks;
configs/cluster-config-with-implied-values.yaml, which the nodes read; configs/instance-types-data.json; but
not custom_resources/, ParallelCluster's own Lambda code), versions.json (each object's S3 key and version
id) and create_stack.json (CreateStack's arguments).
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"  # no credential look-up on the network either

import yaml  # noqa: E402
from botocore.client import BaseClient  # noqa: E402
from botocore.exceptions import ClientError  # noqa: E402
from botocore.response import StreamingBody  # noqa: E402
from pcluster.aws.aws_api import AWSApi  # noqa: E402
from pcluster.aws.common import Cache  # noqa: E402
from pcluster.config.common import AllValidatorsSuppressor  # noqa: E402
from pcluster.constants import PCLUSTER_BUCKET_REQUIRED_BOOTSTRAP_FEATURES  # noqa: E402
from pcluster.models.cluster import Cluster  # noqa: E402

ACCOUNT = "111122223333"
"""The account the answers speak for (a documentation placeholder)."""
PROVIDER_TAG = {"Key": "parallelcluster:custom_resource", "Value": "cluster"}
"""The tag the provider's Lambda appends to the configuration's Tags (after the stack's own tags)."""
ROOT_DEVICE = {"alinux2023": "/dev/xvda", "ubuntu2204": "/dev/sda1", "rhel9": "/dev/sda1"}
"""Root device name of ParallelCluster's official AMI per OS we offer (DescribeImages' RootDeviceName)."""

# DescribeInstanceTypes answers for the types our presets and defaults use, as the authors know them from
# EC2's instance-type pages (not read from AWS here). The network cards decide how many EFA interfaces
# ParallelCluster puts in a compute launch template (each card is answered with room for two interfaces,
# so that card 0 takes its ENA and an EFA-only one, as on these types); EFA and GPUs what dna.json and
# Slurm's gres.conf get.
_INSTANCE_FACTS = {
    # type: (vCPUs, NVIDIA GPUs, EFA, network cards, instance store, memory MiB)
    "c6i.xlarge": (4, 0, False, 1, False, 8192),
    "c6i.2xlarge": (8, 0, False, 1, False, 16384),
    "c6i.8xlarge": (32, 0, False, 1, False, 65536),
    "g4dn.12xlarge": (48, 4, True, 1, True, 196608),
    "g5.12xlarge": (48, 4, True, 1, True, 196608),
    "g6e.12xlarge": (48, 4, True, 1, True, 393216),
    "p4d.24xlarge": (96, 8, True, 4, True, 1179648),
    "p5.48xlarge": (192, 8, True, 32, True, 2097152),
    "p5en.48xlarge": (192, 8, True, 16, True, 2097152),
}


class NoAnswer(AssertionError):
    """ParallelCluster made an AWS call this script has no fixed answer for."""


def instance_type(name: str) -> dict:
    """One DescribeInstanceTypes entry, shaped as EC2 returns it."""
    if name not in _INSTANCE_FACTS:
        raise NoAnswer(f"no answer for instance type {name}: add it to _INSTANCE_FACTS in tests/support/pcluster_render.py")
    vcpus, gpus, efa, cards, storage, memory = _INSTANCE_FACTS[name]
    network = {"EfaSupported": efa, "MaximumNetworkCards": cards,
               "NetworkCards": [{"NetworkCardIndex": index, "MaximumNetworkInterfaces": 2} for index in range(cards)]}
    if efa:
        network["EfaInfo"] = {"MaximumEfaInterfaces": cards}
    data = {"InstanceType": name, "NetworkInfo": network, "InstanceStorageSupported": storage,
            "VCpuInfo": {"DefaultVCpus": vcpus, "DefaultCores": vcpus // 2, "DefaultThreadsPerCore": 2},
            "ProcessorInfo": {"SupportedArchitectures": ["x86_64"]}, "MemoryInfo": {"SizeInMiB": memory},
            "EbsInfo": {"EbsOptimizedSupport": "default"}, "SupportedUsageClasses": ["on-demand", "spot"]}
    if gpus:
        data["GpuInfo"] = {"Gpus": [{"Name": "GPU", "Manufacturer": "NVIDIA", "Count": gpus}]}
    return data


def _body(data: bytes) -> StreamingBody:
    return StreamingBody(io.BytesIO(data), len(data))


class FixedAws:
    """The AWS account a render talks to: one method per API operation, named `<service>_<Operation>`,
    each a fixed answer. The cluster bucket lives in memory; CreateStack is recorded, not run."""

    def __init__(self, config: dict, region: str, zone: str):
        self.region, self.zone = region, zone
        self.os = config["Image"]["Os"]
        self.reservations = _reservations(config)
        self.objects: dict[str, bytes] = {}
        self.versions: dict[str, str] = {}
        self.created: list[dict] = []
        self.operations: set[str] = set()

    def answer(self, service: str, operation: str, params: dict) -> dict:
        handler = getattr(self, f"{service}_{operation}", None)
        if handler is None:
            raise NoAnswer(f"ParallelCluster called {service} {operation}({sorted(params)}), which has no fixed "
                           f"answer: add a method {service}_{operation} to FixedAws in tests/support/pcluster_render.py")
        self.operations.add(f"{service}:{operation}")
        return handler(**params)

    # -- identity and the cluster's CloudFormation stack ------------------------------------------------------ #

    def sts_GetCallerIdentity(self):
        return {"Account": ACCOUNT, "Arn": f"arn:aws:iam::{ACCOUNT}:role/provider", "UserId": "AROASTUB"}

    def cloudformation_DescribeStacks(self, StackName):
        raise ClientError({"Error": {"Code": "ValidationError", "Message": f"Stack with id {StackName} does not exist"}},
                          "DescribeStacks")

    def cloudformation_CreateStack(self, **arguments):
        self.created.append(arguments)
        return {"StackId": f"arn:aws:cloudformation:{self.region}:{ACCOUNT}:stack/{arguments['StackName']}/stub"}

    # -- the cluster bucket: it exists, it is bootstrapped, and what is put is kept -------------------------- #

    def s3_HeadBucket(self, Bucket, ExpectedBucketOwner=None):
        return {}

    def s3_HeadObject(self, Bucket, Key):
        return {"ContentLength": len(self._object(Key))}

    def s3_GetObject(self, Bucket, Key, VersionId=None):
        return {"Body": _body(self._object(Key))}

    def s3_PutObject(self, Bucket, Key, Body, **_extra):
        data = Body if isinstance(Body, bytes) else Body.encode() if isinstance(Body, str) else Body.read()
        self.objects[Key] = data
        self.versions[Key] = f"version-{len(self.versions) + 1}"
        return {"VersionId": self.versions[Key], "ETag": '"stub"'}

    def s3_ListObjects(self, Bucket, Prefix, **_paging):
        return {"Contents": [], "IsTruncated": False}

    def s3_ListObjectVersions(self, Bucket, Prefix, **_paging):
        return {"Versions": [], "DeleteMarkers": [], "IsTruncated": False}

    def _object(self, key: str) -> bytes:
        if key.endswith("/.bootstrapped"):
            return json.dumps({"bootstrapped_features": PCLUSTER_BUCKET_REQUIRED_BOOTSTRAP_FEATURES}).encode()
        if key not in self.objects:
            raise ClientError({"Error": {"Code": "404", "Message": "Not Found"}}, "HeadObject")
        return self.objects[key]

    # -- EC2 and FSx look-ups --------------------------------------------------------------------------------- #

    def ec2_DescribeImages(self, Filters=None, ImageIds=None, Owners=None, IncludeDeprecated=None):
        """The official AMI of the OS (found by name), or any AMI by id, with the OS's root device."""
        image_id = ImageIds[0] if ImageIds else f"ami-0{sorted(ROOT_DEVICE).index(self.os) + 1:016x}"
        device = ROOT_DEVICE[self.os]
        return {"Images": [{"ImageId": image_id, "Name": f"aws-parallelcluster-stub-{self.os}", "State": "available",
                            "Architecture": "x86_64", "CreationDate": "2026-10-01T00:00:00.000Z",
                            "RootDeviceName": device,
                            "BlockDeviceMappings": [{"DeviceName": device, "Ebs": {"VolumeSize": 40}}]}]}

    def ec2_DescribeInstanceTypes(self, InstanceTypes):
        return {"InstanceTypes": [instance_type(name) for name in InstanceTypes]}

    def ec2_DescribeSubnets(self, SubnetIds):
        return {"Subnets": [{"SubnetId": subnet, "AvailabilityZone": self.zone, "VpcId": "vpc-0123456789abcdef0",
                             "CidrBlock": "10.0.16.0/20", "MapPublicIpOnLaunch": False} for subnet in SubnetIds]}

    def ec2_DescribeRouteTables(self, Filters):
        """Our nodes' subnet is private: its route table sends the internet through a NAT gateway."""
        return {"RouteTables": [{"RouteTableId": "rtb-0123456789abcdef0", "VpcId": "vpc-0123456789abcdef0",
                                 "Routes": [{"DestinationCidrBlock": "10.0.0.0/16", "GatewayId": "local"},
                                            {"DestinationCidrBlock": "0.0.0.0/0",
                                             "NatGatewayId": "nat-0123456789abcdef0"}]}]}

    def ec2_DescribeCapacityReservations(self, CapacityReservationIds):
        """Each reservation a compute resource targets: active, in the subnet's zone, of that resource's type."""
        return {"CapacityReservations": [
            {"CapacityReservationId": cr, "AvailabilityZone": self.zone, "State": "active", "OwnerId": ACCOUNT,
             "CapacityReservationArn": f"arn:aws:ec2:{self.region}:{ACCOUNT}:capacity-reservation/{cr}",
             **self.reservations[cr]} for cr in CapacityReservationIds]}

    def fsx_DescribeFileSystems(self, FileSystemIds):
        return {"FileSystems": [
            {"FileSystemId": fs, "FileSystemType": "LUSTRE", "DNSName": f"{fs}.fsx.{self.region}.amazonaws.com",
             "LustreConfiguration": {"MountName": "abcdefgh", "DeploymentType": "PERSISTENT_2"},
             "SubnetIds": ["subnet-0123456789abcdef0"], "VpcId": "vpc-0123456789abcdef0"} for fs in FileSystemIds]}


def _reservations(config: dict) -> dict[str, dict]:
    """DescribeCapacityReservations' facts for each reservation a compute resource targets."""
    found = {}
    for queue in config["Scheduling"]["SlurmQueues"]:
        for resource in queue["ComputeResources"]:
            target = resource.get("CapacityReservationTarget", {}).get("CapacityReservationId")
            if target:
                block = queue.get("CapacityType") == "CAPACITY_BLOCK"
                found[target] = {"InstanceType": resource["InstanceType"], "TotalInstanceCount": resource["MaxCount"],
                                 "ReservationType": "capacity-block" if block else "default"}
    return found


def render(cluster_name: str, region: str, zone: str, config: dict) -> tuple[FixedAws, float]:
    """ParallelCluster's own create of `config`, as the provider's Lambda runs it, against FixedAws."""
    os.environ["AWS_DEFAULT_REGION"] = region
    AWSApi.reset()  # its clients and caches are per region and per answer set
    Cache.clear_all()
    config = {**config, "Tags": [*config.get("Tags", []), PROVIDER_TAG]}
    aws = FixedAws(config, region, zone)
    BaseClient._make_api_call = lambda client, operation, params: aws.answer(
        client.meta.service_model.service_name, operation, params)
    started = time.perf_counter()
    Cluster(cluster_name, yaml.dump(config)).create(validator_suppressors={AllValidatorsSuppressor()})
    return aws, time.perf_counter() - started


def write(aws: FixedAws, outdir: Path) -> list[str]:
    """The bucket's objects under outdir, by key below the artifact directory (nested stacks get `.json`),
    their S3 version ids (versions.json), and the CreateStack call (create_stack.json)."""
    written, versions = [], {}
    for key, body in aws.objects.items():
        relative = key.split("/", 4)[-1]  # parallelcluster/<version>/clusters/<name>-<suffix>/<relative>
        if relative.startswith("custom_resources/"):
            continue  # ParallelCluster's own Lambda code, the same for every configuration
        if relative.startswith("assets/"):
            relative += ".json"
        path = outdir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
        versions[relative] = {"key": key, "version": aws.versions[key]}
        written.append(relative)
    (outdir / "versions.json").write_text(json.dumps(versions, indent=1))
    (outdir / "create_stack.json").write_text(json.dumps(aws.created, indent=1, default=str))
    return written


def main() -> None:
    request = json.load(sys.stdin)
    summary = {}
    for label, case in request["renders"].items():
        try:
            aws, seconds = render(request["cluster_name"], case["region"], case["zone"], case["config"])
        except Exception as error:
            raise SystemExit(f"render {label}: ParallelCluster's create failed: {error}") from error
        files = write(aws, Path(request["outdir"]) / label)
        summary[label] = {"seconds": round(seconds, 2), "files": files, "operations": sorted(aws.operations)}
    json.dump(summary, sys.stdout)


if __name__ == "__main__":
    main()
