"""Storage (stateful): KMS key, data bucket, FSx for Lustre linked to the bucket's data prefix."""

from __future__ import annotations

from dataclasses import dataclass

import aws_cdk as cdk
from aws_cdk import aws_fsx as fsx
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

from stacks.shared.common import allow_cloudwatch_logs
from stacks.shared.constants import FSX_MOUNT_DIR
from stacks.shared.nag import acknowledge, log_cdk_handler, skip_checkov, skip_checkov_on_cdk_handler
from stacks.shared.network_stack import NetworkOutputs
from stacks.shared.settings import StorageSettings

_EVENTS = ["NEW", "CHANGED", "DELETED"]
"""Both ways, deletions included, on purpose. Auto-import of DELETED carries a deletion in the bucket onto
/fsx: only the owner (the deployer's credentials) can delete there, as no node role may (`NODE_ROLE_PATHS`),
so it carries the owner's deletions only, and a dataset removed from the bucket stops taking file-system
space. Auto-export of DELETED carries what a node deletes on /fsx, under the file system's POSIX permissions,
into the bucket as a delete marker: the versioned bucket keeps the object as a noncurrent version for
`storage.noncurrent_version_days`, so the owner can restore it (docs/deploy.md, Security)."""
NODE_ROLE_PATHS = ("/parallelcluster/", "/aws-pcs/")
"""IAM paths of the node roles: ParallelCluster puts its node roles under /parallelcluster/<cluster>/, PCS takes
only roles under /aws-pcs/ (stacks/pcs/nodes.py). The data bucket's policy refuses any role under them a write
or a deletion, whatever policy a role is given later; FSx's own service-linked role, which imports and exports
for the association, is not under them."""
NODE_DENIED_ACTIONS = ["s3:DeleteObject", "s3:DeleteObjectVersion", "s3:PutObject", "s3:PutLifecycleConfiguration",
                       "s3:PutBucketVersioning", "s3:PutBucketPolicy", "s3:DeleteBucketPolicy"]
"""What no node role may do on the data bucket: write or delete an object or a version, or change what keeps
the versions (versioning, lifecycle, the policy itself)."""
HANDLER_LOG_RETENTION_DAYS = 30
"""The throw-away variant's bucket-emptying handler runs when the stack is deleted; its log group goes with it."""
DATA_BUCKET_LOG_PREFIX = "data-bucket/"
DEPLOY_BUCKET_LOG_PREFIX = "deploy-bucket/"
"""Where the access-log bucket keeps the cluster stack's deploy bucket's server access logs."""
_LOG_LOOP_REASON = ("This bucket is the server access log target of the data and deploy buckets; logging it into "
                    "itself would loop.")


@dataclass(frozen=True)
class StorageOutputs:
    """What the cluster stacks take from the storage stack (stacks/app_builder.py passes it to each)."""

    file_system: fsx.LustreFileSystem
    """Mounted on /fsx by every node: ParallelCluster takes its id, PCS's node script its DNS and mount names."""
    data_policy: iam.IManagedPolicy
    """Attached to every node role: list and read under the data prefix, nothing else."""
    access_logs_bucket: s3.IBucket
    """Where the cluster's deploy bucket writes its server access logs (under `DEPLOY_BUCKET_LOG_PREFIX`)."""


class StorageStack(cdk.Stack):
    """What outlives the cluster: retained and termination-protected unless `storage.retain` is false.

    Construct ids here are part of the data's identity: renaming one would make CloudFormation
    replace the bucket or file system (a test pins their logical ids).
    """

    def __init__(self, scope: Construct, construct_id: str, *, env: cdk.Environment, description: str,
                 settings: StorageSettings, network: NetworkOutputs) -> None:
        super().__init__(scope, construct_id, env=env, description=description, termination_protection=settings.retain)
        self._settings = settings
        self._removal = cdk.RemovalPolicy.RETAIN if settings.retain else cdk.RemovalPolicy.DESTROY
        self.key = kms.Key(self, "StorageKey", enable_key_rotation=True, removal_policy=self._removal,
                           description="scDINO: FSx for Lustre encryption at rest")
        self.access_logs_bucket = self._access_logs_bucket()
        self.bucket = self._data_bucket()
        if not settings.retain:
            skip_checkov_on_cdk_handler(self, "Custom::S3AutoDeleteObjectsCustomResourceProvider",
                                        "CDK's handler that empties the buckets when the stack is deleted")
            # The stack's one key serves its log group too: a key of its own would bill for a stack deleted whole.
            allow_cloudwatch_logs(self.key)
            log_cdk_handler(self, "Custom::S3AutoDeleteObjectsCustomResourceProvider",
                            retention_days=HANDLER_LOG_RETENTION_DAYS, key=self.key)
        self.file_system = fsx.LustreFileSystem(
            self, "DataFileSystem",
            vpc=network.vpc, vpc_subnet=network.private_subnet, security_group=network.fsx_security_group,
            kms_key=self.key,
            storage_capacity_gib=settings.fsx_capacity_gib,
            file_system_type_version=fsx.FileSystemTypeVersion.V_2_15,
            lustre_configuration=fsx.LustreConfiguration(
                deployment_type=fsx.LustreDeploymentType.PERSISTENT_2,
                per_unit_storage_throughput=settings.fsx_throughput_per_tib,
                data_compression_type=fsx.LustreDataCompressionType[settings.fsx_compression]),
            removal_policy=self._removal)
        self.data_path = f"{FSX_MOUNT_DIR}/{settings.data_prefix}"
        self._link_bucket()
        self.data_policy = self._data_policy()
        self.outputs = StorageOutputs(file_system=self.file_system, data_policy=self.data_policy,
                                      access_logs_bucket=self.access_logs_bucket)
        cdk.CfnOutput(self, "BucketName", value=self.bucket.bucket_name)
        cdk.CfnOutput(self, "FileSystemId", value=self.file_system.file_system_id)
        upload_uri = f"s3://{self.bucket.bucket_name}/{settings.data_prefix}/my-dataset/"
        cdk.CfnOutput(self, "UploadCommand", description="Copy a local dataset where the cluster sees it",
                      value=f"aws s3 sync ./my-dataset {upload_uri}")

    def _access_logs_bucket(self) -> s3.Bucket:
        """The server access logs of the data bucket and of the cluster's deploy bucket, kept a year; versioned
        so that a deleted or overwritten log object stays recoverable for `noncurrent_version_days`."""
        bucket = s3.Bucket(
            self, "AccessLogsBucket", encryption=s3.BucketEncryption.S3_MANAGED, enforce_ssl=True, versioned=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL, removal_policy=self._removal,
            auto_delete_objects=not self._settings.retain, object_ownership=s3.ObjectOwnership.BUCKET_OWNER_PREFERRED,
            lifecycle_rules=[s3.LifecycleRule(
                expiration=cdk.Duration.days(365),
                noncurrent_version_expiration=cdk.Duration.days(self._settings.noncurrent_version_days))])
        acknowledge(bucket, "S1", _LOG_LOOP_REASON)
        skip_checkov(bucket.node.default_child, {"CKV_AWS_18": _LOG_LOOP_REASON})
        # The deploy bucket lives in the cluster stack, deployed after this one: its name is not known here,
        # so S3's log delivery may write under its prefix from any bucket of this account.
        bucket.add_to_resource_policy(iam.PolicyStatement(
            principals=[iam.ServicePrincipal("logging.s3.amazonaws.com")], actions=["s3:PutObject"],
            resources=[bucket.arn_for_objects(f"{DEPLOY_BUCKET_LOG_PREFIX}*")],
            conditions={"StringEquals": {"aws:SourceAccount": self.account}}))
        return bucket

    def _data_bucket(self) -> s3.Bucket:
        """SSE-S3 rather than SSE-KMS: FSx's per-file-system service-linked role must read the bucket,
        and a customer key would need that role (named after the file system id) in its key policy.
        Its policy refuses every node role a write or a deletion (`NODE_ROLE_PATHS`)."""
        bucket = s3.Bucket(
            self, "DataBucket", encryption=s3.BucketEncryption.S3_MANAGED, enforce_ssl=True, versioned=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL, removal_policy=self._removal,
            auto_delete_objects=not self._settings.retain, server_access_logs_bucket=self.access_logs_bucket,
            server_access_logs_prefix=DATA_BUCKET_LOG_PREFIX,
            lifecycle_rules=[s3.LifecycleRule(
                noncurrent_version_expiration=cdk.Duration.days(self._settings.noncurrent_version_days),
                abort_incomplete_multipart_upload_after=cdk.Duration.days(7))])
        bucket.add_to_resource_policy(iam.PolicyStatement(
            effect=iam.Effect.DENY, principals=[iam.AnyPrincipal()], actions=NODE_DENIED_ACTIONS,
            resources=[bucket.bucket_arn, bucket.arn_for_objects("*")],
            conditions={"ArnLike": {"aws:PrincipalArn": [f"arn:{self.partition}:iam::{self.account}:role{path}*"
                                                         for path in NODE_ROLE_PATHS]}}))
        return bucket

    def _link_bucket(self) -> None:
        """Data repository association: s3://bucket/<prefix>/ <-> /fsx/<prefix>, imported and exported both ways."""
        association = fsx.CfnDataRepositoryAssociation(
            self, "DataRepositoryAssociation",
            file_system_id=self.file_system.file_system_id,
            file_system_path=f"/{self._settings.data_prefix}",
            data_repository_path=f"s3://{self.bucket.bucket_name}/{self._settings.data_prefix}/",
            batch_import_meta_data_on_create=True,
            s3=fsx.CfnDataRepositoryAssociation.S3Property(
                auto_import_policy=fsx.CfnDataRepositoryAssociation.AutoImportPolicyProperty(events=_EVENTS),
                auto_export_policy=fsx.CfnDataRepositoryAssociation.AutoExportPolicyProperty(events=_EVENTS)))
        association.apply_removal_policy(self._removal)

    def _data_policy(self) -> iam.ManagedPolicy:
        """What cluster nodes may do on the bucket: list and read under the data prefix, nothing else.

        Nodes write through the file system: what a job writes under /fsx/<prefix>/ (the users' work
        folders and their runs, /fsx/<prefix>/work) reaches s3://<bucket>/<prefix>/ by the association's
        export, which FSx makes with its own service-linked role (AWSServiceRoleForFSxS3Access_<file system>),
        under the file system's POSIX permissions. A write with a node role would bypass those: every user
        of a node holds the role's credentials, and an overwrite of another user's object would reach their
        /fsx file by the auto-import of CHANGED. Uploads and deletions in the bucket are the owner's.

        Under the IAM path /parallelcluster/: ParallelCluster's provider may attach to node roles only
        policies whose ARN matches policy/parallelcluster* (or a few AWS managed ones); the name is
        left to CloudFormation, so it is unique per stack (and thus per prefix and region)."""
        prefix = self._settings.data_prefix
        policy = iam.ManagedPolicy(self, "ClusterDataAccessPolicy", path="/parallelcluster/", statements=[
            iam.PolicyStatement(actions=["s3:ListBucket"], resources=[self.bucket.bucket_arn],
                                conditions={"StringLike": {"s3:prefix": [f"{prefix}/*", prefix]}}),
            iam.PolicyStatement(actions=["s3:GetObject"], resources=[self.bucket.arn_for_objects(f"{prefix}/*")]),
        ])
        acknowledge(policy, f"IAM5[Resource::<{self.get_logical_id(self.bucket.node.default_child)}.Arn>/{prefix}/*]",
                    "Nodes read any object under the data prefix (the datasets and the runs exported there); "
                    "read-only, and the wildcard is confined to that prefix of this one bucket.")
        return policy
