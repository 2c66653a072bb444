"""What cluster nodes install, at fixed keys of a bucket the cluster stack owns.

    s3://<bucket>/bootstrap/on-node-configured.sh   the node action (bootstrap/)
    s3://<bucket>/bootstrap/current.json            {"bundle": "s3://<bucket>/bundles/<id>.zip", "id": "<id>",
                                                     "monitoring": {gpu_namespace, training_namespace, log_group},
                                                     "cluster": {"presets": [...]}}  (presets.node_shape)
    s3://<bucket>/bootstrap/cluster-env.py          renders "cluster" into the site file slurm/env.sh reads
    s3://<bucket>/bootstrap/cloudwatch-agent.json   the CloudWatch agent template GPU nodes fill and append
    s3://<bucket>/bundles/<id>.zip                  training/ + slurm/ + configs/ + requirements (one per deploy)

The cluster configuration names only the first two, so a change in training/ or slurm/ leaves the
head node's OnNodeConfigured untouched; `cdk deploy` rewrites the pointer, and nodes follow it. The
pointer also carries the cluster's shape, so a change of `cluster.presets` reaches the nodes the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import aws_s3_deployment as s3_deployment
from constructs import Construct

from stacks.shared.common import retention
from stacks.shared.constants import BOOTSTRAP_SCRIPT_KEY, BUNDLE_KEY_PREFIX, BUNDLE_POINTER_KEY
from stacks.shared.nag import acknowledge, log_cdk_handler, skip_checkov_on_cdk_handler
from stacks.shared.storage_stack import DEPLOY_BUCKET_LOG_PREFIX

REPO_ROOT = Path(__file__).resolve().parents[2]
BOOTSTRAP_DIR = REPO_ROOT / "bootstrap"
# What the nodes install: the code, the Slurm scripts, the configs, the examples the guides run and the
# pinned requirements; everything else in the repository (virtualenvs, node_modules, tests, infra code)
# stays out of the bundle.
BUNDLE_CONTENTS = ["training", "slurm", "configs", "examples", "requirements.txt", "requirements-dali.txt",
                   "pyproject.toml"]
BUNDLE_EXCLUDE = ["*", ".*", *[f"!{item}" for item in BUNDLE_CONTENTS], *[f"!{item}/**" for item in BUNDLE_CONTENTS],
                  "**/__pycache__", "**/*.pyc", "**/*.egg-info"]
NONCURRENT_VERSION_DAYS = 30
"""How long a replaced version of a deploy-bucket object (the pointer, the bootstrap files) stays recoverable."""


def _prefix(key: str) -> str:
    return key.rsplit("/", 1)[0] + "/"


class NodeBundle(Construct):
    """The deploy bucket, the bundle copied into it (kept per id) and the bootstrap files with the pointer."""

    def __init__(self, scope: Construct, construct_id: str, *, log_retention_days: int, logs_key: kms.IKey,
                 access_logs_bucket_name: str, monitoring: dict[str, str], cluster: dict[str, Any],
                 rest: dict[str, Any] | None = None) -> None:
        super().__init__(scope, construct_id)
        self.bucket = self._bucket(access_logs_bucket_name)
        log_cdk_handler(cdk.Stack.of(self), "Custom::S3AutoDeleteObjectsCustomResourceProvider",
                        retention_days=log_retention_days, key=logs_key)
        # The copy handler's own log group, named by CloudFormation and deleted with the stack. CDK's
        # managed one (/aws/lambda/<handler>) is retained on destroy, and on a first deploy the
        # handler can create that name itself before CloudFormation does, which fails the deploy
        # with "already exists" (aws/aws-cdk#34612): a group the function's LoggingConfig names is
        # created before the function, so the handler never creates one.
        self.log_group = logs.LogGroup(self, "DeployLogs", retention=retention(log_retention_days),
                                       encryption_key=logs_key, removal_policy=cdk.RemovalPolicy.DESTROY)
        bundle = s3_assets.Asset(self, "BundleAsset", path=str(REPO_ROOT), exclude=BUNDLE_EXCLUDE)
        self.bundle_id = bundle.asset_hash
        # Old bundles stay (no prune): a node that read the previous pointer can still download its bundle.
        bundles = s3_deployment.BucketDeployment(
            self, "Bundle", destination_bucket=self.bucket, destination_key_prefix=BUNDLE_KEY_PREFIX,
            sources=[s3_deployment.Source.bucket(bundle.bucket, bundle.s3_object_key)],
            extract=False, prune=False, retain_on_delete=False, log_group=self.log_group)
        bundle_uri = f"s3://{self.bucket.bucket_name}/{cdk.Fn.select(0, bundles.object_keys)}"
        self.bootstrap = s3_deployment.BucketDeployment(
            self, "Bootstrap", destination_bucket=self.bucket,
            destination_key_prefix=_prefix(BOOTSTRAP_SCRIPT_KEY), retain_on_delete=False, log_group=self.log_group,
            sources=[s3_deployment.Source.asset(str(BOOTSTRAP_DIR)),
                     s3_deployment.Source.json_data(BUNDLE_POINTER_KEY.rsplit("/", 1)[1],
                                                    {"bundle": bundle_uri, "id": self.bundle_id,
                                                     "monitoring": monitoring, "cluster": cluster,
                                                     **({"rest": rest} if rest else {})})])
        self.bootstrap.node.add_dependency(bundles)
        self.read_policy = self._read_policy()
        self._acknowledge_deployment_handler()

    def _bucket(self, access_logs_bucket_name: str) -> s3.Bucket:
        """Versioned (a pointer rewritten by a bad deploy can be restored), access-logged into the storage
        stack's access-log bucket, emptied and deleted with the cluster stack."""
        logs_bucket = s3.Bucket.from_bucket_name(self, "AccessLogs", access_logs_bucket_name)
        bucket = s3.Bucket(
            self, "Bucket", encryption=s3.BucketEncryption.S3_MANAGED, enforce_ssl=True, versioned=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL, removal_policy=cdk.RemovalPolicy.DESTROY,
            auto_delete_objects=True, server_access_logs_bucket=logs_bucket,
            server_access_logs_prefix=DEPLOY_BUCKET_LOG_PREFIX,
            lifecycle_rules=[s3.LifecycleRule(noncurrent_version_expiration=cdk.Duration.days(NONCURRENT_VERSION_DAYS))])
        cdk.Annotations.of(bucket).acknowledge_warning(
            "@aws-cdk/aws-s3:accessLogsPolicyNotAdded",
            "The storage stack's access-log bucket policy already lets S3 log delivery write under deploy-bucket/.")
        skip_checkov_on_cdk_handler(cdk.Stack.of(self), "Custom::S3AutoDeleteObjectsCustomResourceProvider",
                                    "CDK's handler that empties the deploy bucket when the cluster stack is deleted")
        return bucket

    def _read_policy(self) -> iam.ManagedPolicy:
        """Read access to the bucket as a managed policy, for nodes whose ParallelCluster Iam has no
        S3Access (login nodes); under /parallelcluster/ so that ParallelCluster's provider may attach it."""
        policy = iam.ManagedPolicy(self, "ReadPolicy", path="/parallelcluster/", statements=[
            iam.PolicyStatement(actions=["s3:GetObject"], resources=[self.bucket.arn_for_objects("*")]),
            iam.PolicyStatement(actions=["s3:ListBucket"], resources=[self.bucket.bucket_arn]),
        ])
        stack = cdk.Stack.of(self)
        acknowledge(policy, f"IAM5[Resource::<{stack.get_logical_id(self.bucket.node.default_child)}.Arn>/*]",
                    "Read-only, on every object of this deploy bucket, which holds only the node bootstrap files "
                    "and bundles.")
        return policy

    def _acknowledge_deployment_handler(self) -> None:
        """cdk-nag findings on the Lambda CDK's BucketDeployment brings with it (one per stack, not our code)."""
        stack = cdk.Stack.of(self)
        assets_bucket = (f"arn:{stack.partition}:s3:::cdk-{cdk.DefaultStackSynthesizer.DEFAULT_QUALIFIER}-assets-"
                         f"<AWS::AccountId>-{stack.region}/*")
        own_bucket = f"<{stack.get_logical_id(self.bucket.node.default_child)}.Arn>/*"
        findings = {
            "IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole]":
                "CDK's BucketDeployment handler writes its own CloudWatch logs; the AWS managed policy does just that.",
            "L1": "CDK's BucketDeployment handler: its runtime is chosen by the pinned aws-cdk-lib release.",
            f"IAM5[Resource::{assets_bucket}]":
                "CDK's BucketDeployment handler reads the staged assets (bundle, bootstrap files) from CDK's own "
                "assets bucket; read-only.",
            f"IAM5[Resource::{own_bucket}]":
                "CDK's BucketDeployment handler writes and prunes objects of this stack's deploy bucket only.",
        }
        for action in ("s3:GetBucket*", "s3:GetObject*", "s3:List*", "s3:Abort*", "s3:DeleteObject*"):
            findings[f"IAM5[Action::{action}]"] = (
                "CDK's read grant on the assets bucket and read/write grant on the deploy bucket, given to "
                "CDK's BucketDeployment handler; the resources are those two buckets only.")
        for finding, reason in findings.items():
            acknowledge(stack, finding, reason)
        skip_checkov_on_cdk_handler(
            stack, "Custom::CDKBucketDeployment", "CDK's BucketDeployment handler (copies the bundle and bootstrap files)",
            extra={"CKV_AWS_173": "CDK's BucketDeployment handler: its only environment variable is the path of "
                                  "the CA bundle (AWS_CA_BUNDLE), nothing confidential to encrypt with a customer key."})
