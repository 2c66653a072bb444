"""The GPU images a deployment's pipeline built, and their removal with their snapshots.

    .venv/bin/python -m stacks.deployment images                   # each image: kept (why) or to prune
    .venv/bin/python -m stacks.deployment images --prune           # deregister those, delete their snapshots
    .venv/bin/python -m stacks.deployment images --prune --keep 0  # after destroy: every image not in use

Packer tags every image and snapshot it makes with `scdino:image-build=<prefix>` (ami/gpu-image.pkr.hcl), and
neither CloudFormation nor `destroy` removes them: each image bills for its snapshot until deregistered and
the snapshot deleted. An image is kept while it is one of the `keep` newest (default 2: the active one and the
previous, to roll back to), while the AMI parameter names it (the published one), while an instance of any
state but terminated runs it, or while the latest or default version of a launch template launches it (the
cluster's queues and node groups, before their next update). AWS Data Lifecycle Manager would not do: its AMI
policies deregister only the images they create from instances themselves, not Packer's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from stacks.shared.constants import BUILD_TAG_KEY

KEEP = 2
"""Images kept by age alone: the active one and the previous."""


@dataclass(frozen=True)
class Image:
    """One image the pipeline built: what `describe-images` says of it."""

    image_id: str
    name: str
    created: str
    """CreationDate, ISO 8601 (sorts as time)."""
    snapshots: tuple[str, ...]


def built_images(ec2: Any, prefix: str) -> list[Image]:
    """This account's images tagged as built for `prefix`, newest first (by creation time, then by name,
    whose Packer timestamp orders two images of one second)."""
    found = []
    for page in ec2.get_paginator("describe_images").paginate(
            Owners=["self"], Filters=[{"Name": f"tag:{BUILD_TAG_KEY}", "Values": [prefix]}]):
        for image in page["Images"]:
            snapshots = tuple(mapping["Ebs"]["SnapshotId"] for mapping in image.get("BlockDeviceMappings", [])
                              if mapping.get("Ebs", {}).get("SnapshotId"))
            found.append(Image(image["ImageId"], image.get("Name", ""), image["CreationDate"], snapshots))
    return sorted(found, key=lambda image: (image.created, image.name), reverse=True)


def images_in_use(ec2: Any, ssm: Any, parameter: str, image_ids: Iterable[str]) -> dict[str, str]:
    """{image id: what uses it} among `image_ids`: the AMI parameter, instances, launch templates."""
    wanted, used = set(image_ids), {}
    if not wanted:
        return used
    try:
        published = ssm.get_parameter(Name=parameter)["Parameter"]["Value"]
        if published in wanted:
            used[published] = f"the AMI parameter {parameter} names it"
    except ssm.exceptions.ParameterNotFound:
        pass  # the image stack is destroyed: nothing is published
    states = ["pending", "running", "shutting-down", "stopping", "stopped"]
    for page in ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": "image-id", "Values": sorted(wanted)}, {"Name": "instance-state-name", "Values": states}]):
        for reservation in page["Reservations"]:
            for instance in reservation["Instances"]:
                used.setdefault(instance["ImageId"], f"instance {instance['InstanceId']} runs it")
    for page in ec2.get_paginator("describe_launch_templates").paginate():
        for template in page["LaunchTemplates"]:
            versions = ec2.describe_launch_template_versions(LaunchTemplateId=template["LaunchTemplateId"],
                                                             Versions=["$Latest", "$Default"])
            for version in versions["LaunchTemplateVersions"]:
                image_id = version["LaunchTemplateData"].get("ImageId")
                if image_id in wanted:
                    used.setdefault(image_id, f"launch template {template['LaunchTemplateName']} launches it")
    return used


def plan(images: list[Image], used: dict[str, str], keep: int) -> list[tuple[Image, str]]:
    """Each image (newest first) with why it stays, or "" for one to prune."""
    return [(image, used.get(image.image_id) or (f"one of the {keep} newest" if rank < keep else ""))
            for rank, image in enumerate(images)]


def prune(ec2: Any, image: Image) -> None:
    """Deregister the image, then delete its snapshots (EC2 refuses to delete a snapshot an image still uses)."""
    ec2.deregister_image(ImageId=image.image_id)
    for snapshot in image.snapshots:
        ec2.delete_snapshot(SnapshotId=snapshot)


def listing_command(region: str, prefix: str) -> list[str]:
    """The AWS CLI call that lists the same images (what `--print` shows)."""
    return ["aws", "ec2", "describe-images", "--region", region, "--owners", "self",
            "--filters", f"Name=tag:{BUILD_TAG_KEY},Values={prefix}",
            "--query", "sort_by(Images,&CreationDate)[].[ImageId,CreationDate,Name]", "--output", "text"]
