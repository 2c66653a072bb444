"""Which availability zones offer every instance type the cluster needs, before a deploy.

    .venv/bin/python -m stacks.pick_az --region us-west-2 --instance-types p5.48xlarge,c6i.2xlarge

Synthesis never calls AWS, so the zone is a setting (`network.availability_zone`); this command asks
EC2 (`DescribeInstanceTypeOfferings`, zone locations) with the credentials of your shell and prints
the zones offering all the types, then the option to pass to `cdk deploy`. Zone names map to
physical zones per account, so ask with the account you deploy to. Exit status: 0 found, 1 no zone
offers them all, 2 the question could not be asked (credentials, region, endpoint).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import boto3
from botocore.exceptions import BotoCoreError, ClientError


def offered_zones(ec2, instance_types: Sequence[str]) -> dict[str, set[str]]:
    """{instance type: zones of the client's region offering it}; a type offered nowhere maps to {}."""
    zones: dict[str, set[str]] = {instance_type: set() for instance_type in instance_types}
    pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
        LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": list(instance_types)}])
    for page in pages:
        for offering in page["InstanceTypeOfferings"]:
            zones.setdefault(offering["InstanceType"], set()).add(offering["Location"])
    return zones


def common_zones(zones: dict[str, set[str]]) -> list[str]:
    """The zones offering every type, in name order."""
    return sorted(set.intersection(*zones.values())) if zones else []


def _where(zones: dict[str, set[str]]) -> str:
    return "; ".join(f"{name} in {', '.join(sorted(found)) or 'no zone'}" for name, found in zones.items())


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m stacks.pick_az", description=__doc__.split("\n\n")[0])
    parser.add_argument("--region", required=True, help="region to deploy to, e.g. us-west-2")
    parser.add_argument("--instance-types", required=True,
                        help="comma-separated: the GPU presets, the head node's type, any CPU or login type")
    parser.add_argument("--endpoint-url", help="EC2 endpoint to ask instead of AWS's (tests, private endpoints)")
    args = parser.parse_args(argv)
    args.instance_types = list(dict.fromkeys(t.strip() for t in args.instance_types.split(",") if t.strip()))
    if not args.instance_types:
        parser.error("--instance-types: name at least one instance type")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        ec2 = boto3.client("ec2", region_name=args.region, endpoint_url=args.endpoint_url)
        zones = offered_zones(ec2, args.instance_types)
    except (BotoCoreError, ClientError) as error:
        print(f"error: cannot ask EC2 in {args.region}: {str(error).splitlines()[0]}", file=sys.stderr)
        return 2
    found = common_zones(zones)
    if not found:
        print(f"error: no availability zone of {args.region} offers all of {', '.join(args.instance_types)} "
              f"({_where(zones)}); choose other types or another region", file=sys.stderr)
        return 1
    print(f"zones of {args.region} offering {', '.join(args.instance_types)}: {', '.join(found)}")
    print(f"suggested (the first; any of them works): -c region={args.region} -c network.availability_zone={found[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
