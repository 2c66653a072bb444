"""Run by the aws-parallelcluster virtualenv: validate cluster configurations with ParallelCluster's schema.

stdin: {"<label>": <cluster config dict>, ...}; stdout: {"<label>": [<error>, ...], ...}.
The schema load and the name validators are offline; no AWS call is made.
"""

import json
import os
import sys

os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

from marshmallow import ValidationError  # noqa: E402
from pcluster.schemas.cluster_schema import ClusterSchema  # noqa: E402
from pcluster.validators.cluster_validators import NameValidator  # noqa: E402


def check(config):
    try:
        loaded = ClusterSchema(cluster_name="scdino").load(config)
    except ValidationError as error:
        return [json.dumps(error.messages, sort_keys=True, default=str)]
    errors = []
    for queue in loaded.scheduling.queues:
        names = [queue.name] + [resource.name for resource in queue.compute_resources]
        for name in names:
            errors.extend(failure.message for failure in NameValidator().execute(name=name))
    return errors


def main():
    configs = json.load(sys.stdin)
    json.dump({label: check(config) for label, config in configs.items()}, sys.stdout)


if __name__ == "__main__":
    main()
