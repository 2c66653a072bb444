"""Names every back end and the nodes agree on: mount points, paths the GPU image creates, the deploy
bucket's fixed keys, the AWS managed policies the nodes get and the CPU queue's name.

The ParallelCluster configuration, the AWS PCS stack, the node bundle, the bootstrap script and the
Slurm scripts all use these; a test compares the shell scripts' copies with them.
"""

from __future__ import annotations

# Mount points shared by the cluster config, the bootstrap script and the Slurm scripts.
FSX_MOUNT_DIR = "/fsx"
APPS_MOUNT_DIR = "/apps"
SCRATCH_DIR = "/scratch"
BUNDLE_DIR = "/apps/scdino"

# Paths the GPU image (ami/scripts) creates and the bootstrap and Slurm scripts use.
IMAGE_VENV = "/opt/scdino-venv"
NCCL_TESTS_BIN = "/opt/nccl-tests/bin/all_reduce_perf"

# Fixed keys in the cluster's deploy bucket. The node actions name only these, so the rendered
# configuration stays the same when training/ or slurm/ change (ParallelCluster refuses a change
# of the head node's OnNodeConfigured); the pointer file names the bundle to install.
BOOTSTRAP_SCRIPT_KEY = "bootstrap/on-node-configured.sh"
BUNDLE_POINTER_KEY = "bootstrap/current.json"
BUNDLE_KEY_PREFIX = "bundles/"

BUILD_TAG_KEY = "scdino:image-build"
"""Tag Packer puts on its build instance, the AMI and its snapshots (run_tags, tags, snapshot_tags), valued
with the prefix: the image pipeline's role may stop, terminate, deregister or delete only what carries it,
and `python -m stacks.deployment images` finds a deployment's images by it."""

NODE_GROUP_TAG = "scdino:node-group"
"""Tag on every PCS node: <cluster>/<node group>, how the login node is found (the ConnectCommand output,
`python -m stacks.deployment ssm`)."""

SSM_POLICY = "AmazonSSMManagedInstanceCore"
"""AWS managed policy Session Manager needs on an instance (ParallelCluster's provider may attach it)."""
CLOUDWATCH_AGENT_POLICY = "CloudWatchAgentServerPolicy"
"""AWS managed policy the CloudWatch agent needs to put GPU metrics and the training's log lines (compute
nodes, stacks/shared/monitoring.py); ParallelCluster's provider may attach it."""
DEFAULT_USERS = {"alinux2023": "ec2-user", "rhel9": "ec2-user", "ubuntu2204": "ubuntu"}
"""Each image.os's default user (uid and gid 1000 on each), who the Slurm REST API's jobs run as: the user a
Session Manager shell becomes with `sudo -iu`, the owner of what a remote run writes."""
CPU_SPOT_QUEUE = "cpu-spot"
"""The Slurm partition of Spot CPU nodes, for the steps that need no GPU (both back ends)."""
