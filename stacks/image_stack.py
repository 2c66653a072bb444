"""Image: CodeBuild runs Packer on ami/ and publishes the GPU AMI id to an SSM parameter."""

from __future__ import annotations

from pathlib import Path

import aws_cdk as cdk
from aws_cdk import aws_codebuild as codebuild
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from stacks.nag import acknowledge
from stacks.settings import PCLUSTER_VERSION, ImageSettings

AMI_DIR = Path(__file__).resolve().parents[1] / "ami"
PACKER_VERSION = "1.11.2"

# What Packer's amazon-ebs builder calls (its documented minimal policy, creating and tagging
# only what a build needs); EC2 does not scope most of these by resource.
PACKER_EC2_ACTIONS = [
    "ec2:AttachVolume", "ec2:AuthorizeSecurityGroupIngress", "ec2:CopyImage", "ec2:CreateImage",
    "ec2:CreateKeyPair", "ec2:CreateSecurityGroup", "ec2:CreateSnapshot", "ec2:CreateTags",
    "ec2:CreateVolume", "ec2:DeleteKeyPair", "ec2:DeleteSecurityGroup", "ec2:DeleteSnapshot",
    "ec2:DeleteVolume", "ec2:DeregisterImage", "ec2:DescribeImageAttribute", "ec2:DescribeImages",
    "ec2:DescribeInstances", "ec2:DescribeInstanceStatus", "ec2:DescribeRegions",
    "ec2:DescribeSecurityGroups", "ec2:DescribeSnapshots", "ec2:DescribeSubnets", "ec2:DescribeTags",
    "ec2:DescribeVolumes", "ec2:DescribeVpcs", "ec2:DetachVolume", "ec2:GetPasswordData",
    "ec2:ModifyImageAttribute", "ec2:ModifyInstanceAttribute", "ec2:ModifySnapshotAttribute",
    "ec2:RegisterImage", "ec2:RunInstances", "ec2:StopInstances", "ec2:TerminateInstances",
]


def _build_spec(settings: ImageSettings, subnet_id: str) -> codebuild.BuildSpec:
    """Install a pinned Packer, build from the ami/ asset, publish the AMI id."""
    packer_vars = " ".join([
        '-var "region=${AWS_REGION}"', f'-var "subnet_id={subnet_id}"',
        f'-var "pcluster_version={PCLUSTER_VERSION}"', f'-var "os={settings.os}"',
        f'-var "instance_type={settings.build_instance_type}"', '-var "ssh_source_cidr=${BUILDER_IP}/32"',
    ])
    return codebuild.BuildSpec.from_object({
        "version": "0.2",
        "env": {"shell": "bash"},
        "phases": {
            "install": {"commands": [
                "curl -fsSLO https://releases.hashicorp.com/packer/${PACKER_VERSION}/packer_${PACKER_VERSION}_linux_amd64.zip",
                "curl -fsSLO https://releases.hashicorp.com/packer/${PACKER_VERSION}/packer_${PACKER_VERSION}_SHA256SUMS",
                "grep linux_amd64.zip packer_${PACKER_VERSION}_SHA256SUMS | sha256sum -c -",
                "unzip -o packer_${PACKER_VERSION}_linux_amd64.zip -d /usr/local/bin",
            ]},
            "build": {"commands": [
                "export BUILDER_IP=$(curl -fsS https://checkip.amazonaws.com)",
                "packer init .",
                f"packer validate {packer_vars} .",
                f"packer build -color=false {packer_vars} .",
                "AMI_ID=$(jq -r '.builds[-1].artifact_id' packer-manifest.json | cut -d: -f2)",
                'aws ssm put-parameter --overwrite --type String --name "${AMI_PARAMETER}" --value "${AMI_ID}"',
                'echo "published ${AMI_ID} to ${AMI_PARAMETER}"',
            ]},
        },
    })


class ImageStack(cdk.Stack):
    """The GPU image pipeline; run on demand (`aws codebuild start-build`), rebuildable, nothing stateful."""

    def __init__(self, scope: Construct, construct_id: str, *, settings: ImageSettings,
                 build_subnet_id: str, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        source = s3_assets.Asset(self, "PackerTemplate", path=str(AMI_DIR))
        self.ami_parameter = ssm.StringParameter(
            self, "AmiIdParameter", parameter_name=settings.ami_parameter, string_value="none",
            description="scDINO GPU AMI id, written by the image pipeline's CodeBuild project")
        key = kms.Key(self, "BuildKey", enable_key_rotation=True, removal_policy=cdk.RemovalPolicy.DESTROY,
                      description="scDINO: image pipeline build artifacts and logs")
        self.project = codebuild.Project(
            self, "ImageBuild",
            description="Packer build of the scDINO GPU AMI on top of the official ParallelCluster AMI",
            source=codebuild.Source.s3(bucket=source.bucket, path=source.s3_object_key),
            environment=codebuild.BuildEnvironment(build_image=codebuild.LinuxBuildImage.STANDARD_7_0,
                                                   compute_type=codebuild.ComputeType.SMALL),
            environment_variables={
                "PACKER_VERSION": codebuild.BuildEnvironmentVariable(value=PACKER_VERSION),
                "AMI_PARAMETER": codebuild.BuildEnvironmentVariable(value=settings.ami_parameter),
            },
            build_spec=_build_spec(settings, build_subnet_id),
            encryption_key=key,
            timeout=cdk.Duration.hours(3),
            logging=codebuild.LoggingOptions(cloud_watch=codebuild.CloudWatchLoggingOptions(
                log_group=logs.LogGroup(self, "BuildLogs", retention=logs.RetentionDays.ONE_MONTH,
                                        removal_policy=cdk.RemovalPolicy.DESTROY))))
        self._grant_packer()
        cdk.CfnOutput(self, "StartBuildCommand",
                      value=f"aws codebuild start-build --project-name {self.project.project_name}")
        cdk.CfnOutput(self, "AmiParameterName", value=self.ami_parameter.parameter_name)

    def _grant_packer(self) -> None:
        """EC2 actions Packer needs, and write access to the one SSM parameter it publishes."""
        role = self.project.role
        if role is None:
            raise RuntimeError("CodeBuild project has no role to grant Packer's permissions to")
        role.add_to_principal_policy(iam.PolicyStatement(actions=PACKER_EC2_ACTIONS, resources=["*"]))
        self.ami_parameter.grant_write(role)
        acknowledge(self.project, "IAM5[Resource::*]",
                    "Packer's amazon-ebs builder creates and tags its own temporary instance, key pair, "
                    "security group, volumes and the AMI, whose ids are unknown beforehand; the action list is "
                    "Packer's documented minimum.")
        self._acknowledge_codebuild_grants()

    def _acknowledge_codebuild_grants(self) -> None:
        """The wildcards CDK's CodeBuild and S3-source grants generate, each scoped to this project."""
        project_id = self.get_logical_id(self.project.node.default_child)
        for action in ("s3:GetBucket*", "s3:GetObject*", "s3:List*"):
            acknowledge(self.project, f"IAM5[Action::{action}]",
                        "CDK's read grant on the bootstrap assets bucket so CodeBuild can fetch the ami/ "
                        "source asset; read-only.")
        for action in ("kms:GenerateDataKey*", "kms:ReEncrypt*"):
            acknowledge(self.project, f"IAM5[Action::{action}]",
                        "CDK's grant on this project's own encryption key (build artifacts and logs).")
        acknowledge(self.project, f"IAM5[Resource::arn:aws:logs:{self.region}:<AWS::AccountId>:log-group:"
                                  f"/aws/codebuild/<{project_id}>:*]",
                    "Log streams of this project's own CodeBuild log group, created per build.")
        acknowledge(self.project, f"IAM5[Resource::arn:aws:codebuild:{self.region}:<AWS::AccountId>:"
                                  f"report-group/<{project_id}>-*]",
                    "Test report groups of this project only, created per build by CodeBuild.")
