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

from stacks.shared.common import allow_cloudwatch_logs
from stacks.shared.constants import BUILD_TAG_KEY
from stacks.shared.nag import acknowledge
from stacks.shared.network_stack import NetworkOutputs
from stacks.shared.settings import PCLUSTER_VERSION, ImageSettings

REPO_ROOT = Path(__file__).resolve().parents[2]
# The build reads ami/ and the pinned requirements the image's Python environment is built from.
BUILD_SOURCES = ["ami", "requirements.txt", "requirements-dali.txt"]
BUILD_EXCLUDE = ["*", ".*", *[f"!{item}" for item in BUILD_SOURCES], *[f"!{item}/**" for item in BUILD_SOURCES]]
PACKER_VERSION = "1.11.2"
PACKER_BUILDS = {"parallelcluster": "parallelcluster.amazon-ebs.gpu", "pcs": "pcs.amazon-ebs.pcs"}
"""The build of ami/gpu-image.pkr.hcl each back end's nodes boot (`packer build -only=...`)."""
PACKER_READ_ACTIONS = [
    "ec2:DescribeImageAttribute", "ec2:DescribeImages", "ec2:DescribeInstances", "ec2:DescribeInstanceStatus",
    "ec2:DescribeRegions", "ec2:DescribeSecurityGroups", "ec2:DescribeSnapshots", "ec2:DescribeSubnets",
    "ec2:DescribeTags", "ec2:DescribeVolumes", "ec2:DescribeVpcs",
]


def _build_spec(settings: ImageSettings, backend: str, subnet_id: str, build_tag: str) -> codebuild.BuildSpec:
    """Install a pinned Packer, build the back end's image from the ami/ asset, publish the AMI id."""
    packer_vars = " ".join([
        f"-only={PACKER_BUILDS[backend]}",
        '-var "region=${AWS_REGION}"', f'-var "subnet_id={subnet_id}"',
        f'-var "pcluster_version={PCLUSTER_VERSION}"', f'-var "os={settings.os}"',
        f'-var "instance_type={settings.build_instance_type}"', '-var "ssh_source_cidr=${BUILDER_IP}/32"',
        f'-var "build_tag={build_tag}"',
        *([f'-var "pcs_slurm_version={settings.pcs_slurm_version}"'] if backend == "pcs" else []),
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
                "packer init ami",
                f"packer validate {packer_vars} ami",
                f"packer build -color=false {packer_vars} ami",
                "AMI_ID=$(jq -r '.builds[-1].artifact_id' packer-manifest.json | cut -d: -f2)",
                'aws ssm put-parameter --overwrite --type String --name "${AMI_PARAMETER}" --value "${AMI_ID}"',
                'echo "published ${AMI_ID} to ${AMI_PARAMETER}"',
            ]},
        },
    })


class ImageStack(cdk.Stack):
    """The GPU image pipeline; run on demand (`aws codebuild start-build`), rebuildable, nothing stateful."""

    def __init__(self, scope: Construct, construct_id: str, *, env: cdk.Environment, description: str,
                 settings: ImageSettings, backend: str, ami_parameter: str, build_tag: str,
                 network: NetworkOutputs) -> None:
        super().__init__(scope, construct_id, env=env, description=description)
        build_subnet_id = network.public_subnet.subnet_id
        source = s3_assets.Asset(self, "PackerTemplate", path=str(REPO_ROOT), exclude=BUILD_EXCLUDE)
        self.ami_parameter = ssm.StringParameter(
            self, "AmiIdParameter", parameter_name=ami_parameter, string_value="none",
            description="scDINO GPU AMI id, written by the image pipeline's CodeBuild project"
            + (" (AWS PCS image)" if backend == "pcs" else ""))
        key = kms.Key(self, "BuildKey", enable_key_rotation=True, removal_policy=cdk.RemovalPolicy.DESTROY,
                      description="scDINO: image pipeline build artifacts and logs")
        allow_cloudwatch_logs(key)
        self.project = codebuild.Project(
            self, "ImageBuild",
            description=("Packer build of the scDINO GPU AMI for AWS PCS on top of AWS's Deep Learning Base GPU AMI"
                         if backend == "pcs" else
                         "Packer build of the scDINO GPU AMI on top of the official ParallelCluster AMI"),
            source=codebuild.Source.s3(bucket=source.bucket, path=source.s3_object_key),
            environment=codebuild.BuildEnvironment(build_image=codebuild.LinuxBuildImage.STANDARD_7_0,
                                                   compute_type=codebuild.ComputeType.SMALL),
            environment_variables={
                "PACKER_VERSION": codebuild.BuildEnvironmentVariable(value=PACKER_VERSION),
                "AMI_PARAMETER": codebuild.BuildEnvironmentVariable(value=ami_parameter),
            },
            build_spec=_build_spec(settings, backend, build_subnet_id, build_tag),
            encryption_key=key,
            timeout=cdk.Duration.hours(3),
            logging=codebuild.LoggingOptions(cloud_watch=codebuild.CloudWatchLoggingOptions(
                log_group=logs.LogGroup(self, "BuildLogs", retention=logs.RetentionDays.ONE_MONTH,
                                        encryption_key=key, removal_policy=cdk.RemovalPolicy.DESTROY))))
        self._grant_packer(build_tag=build_tag, subnet_id=build_subnet_id, vpc_id=network.vpc.vpc_id)
        cdk.CfnOutput(self, "ProjectName", value=self.project.project_name)
        cdk.CfnOutput(self, "StartBuildCommand",
                      value=f"aws codebuild start-build --region {self.region} --project-name {self.project.project_name}")
        cdk.CfnOutput(self, "AmiParameterName", value=self.ami_parameter.parameter_name)

    def _grant_packer(self, *, build_tag: str, subnet_id: str, vpc_id: str) -> None:
        """What Packer's amazon-ebs builder calls, each write scoped by tag, VPC or name, in this region only.

        The root volume is encrypted at launch, so Packer needs no CopyImage/ModifyImageAttribute
        (encrypt_boot's copy) and nothing Windows-only (GetPasswordData)."""
        role = self.project.role
        if role is None:
            raise RuntimeError("CodeBuild project has no role to grant Packer's permissions to")
        for statement in self._packer_statements(build_tag, subnet_id, vpc_id):
            role.add_to_principal_policy(statement)
        self.ami_parameter.grant_write(role)
        self._acknowledge_codebuild_grants()

    def _packer_statements(self, build_tag: str, subnet_id: str, vpc_id: str) -> list[iam.PolicyStatement]:
        arn = f"arn:{self.partition}:ec2:{self.region}"
        own = f"{arn}:{self.account}"
        vpc_arn = f"{own}:vpc/{vpc_id}"
        tagged = {"StringEquals": {f"aws:ResourceTag/{BUILD_TAG_KEY}": build_tag}}
        tagging = {"StringEquals": {f"aws:RequestTag/{BUILD_TAG_KEY}": build_tag}}
        new_image = [f"{arn}::image/*", f"{arn}::snapshot/*"]
        statements = [
            (PACKER_READ_ACTIONS, ["*"], {"StringEquals": {"aws:RequestedRegion": self.region}},
             "EC2 Describe calls take no resource ARN; they are read-only and limited to this region."),
            (["ec2:RunInstances"], [f"{own}:instance/*"], tagging,
             "Packer's build instance, whose id is unknown beforehand; it must be launched with the build tag."),
            (["ec2:RunInstances"], [f"{arn}::image/*", f"{own}:subnet/{subnet_id}", f"{own}:network-interface/*",
                                    f"{own}:volume/*", f"{own}:security-group/*", f"{own}:key-pair/packer_*"], None,
             "What the build instance is launched from and with (the base AMI, its new root volume, network "
             "interface, Packer's temporary key pair and security group); the instance itself must carry the tag."),
            (["ec2:CreateTags"], [f"{own}:instance/*", f"{own}:security-group/*", f"{own}:key-pair/packer_*",
                                  *new_image], tagging,
             "Packer tags what it creates (instance, AMI, snapshots); every tag request must carry the build tag."),
            (["ec2:StopInstances", "ec2:TerminateInstances", "ec2:CreateImage"], [f"{own}:instance/*"], tagged,
             "Only instances carrying this prefix's build tag (Packer's build instance)."),
            (["ec2:CreateImage"], new_image, None,
             "The AMI and snapshots CreateImage makes, whose ids are unknown beforehand."),
            (["ec2:DeregisterImage", "ec2:DeleteSnapshot"], new_image, tagged,
             "Packer's clean-up of a failed or forced build, only on images and snapshots carrying the build tag."),
            (["ec2:CreateKeyPair", "ec2:DeleteKeyPair"], [f"{own}:key-pair/packer_*"], None,
             "Packer's temporary key pair, named packer_<uuid>."),
            (["ec2:CreateSecurityGroup"], [vpc_arn, f"{own}:security-group/*"], None,
             "Packer's temporary security group, in this deployment's VPC (CreateSecurityGroup checks the VPC)."),
            (["ec2:AuthorizeSecurityGroupIngress", "ec2:DeleteSecurityGroup"], [f"{own}:security-group/*"],
             {"ArnEquals": {"ec2:Vpc": vpc_arn}},
             "Packer's temporary security group: only groups in this deployment's VPC."),
        ]
        result = []
        for actions, resources, conditions, reason in statements:
            result.append(iam.PolicyStatement(actions=actions, resources=resources, conditions=conditions))
            for resource in resources:
                if "*" in resource:
                    acknowledge(self.project, f"IAM5[Resource::{self._nag_arn(resource)}]", reason)
        return result

    def _nag_arn(self, arn: str) -> str:
        """An ARN as cdk-nag prints it: the account as <AWS::AccountId> (the region is known at synth)."""
        return arn.replace(self.account, "<AWS::AccountId>")

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
