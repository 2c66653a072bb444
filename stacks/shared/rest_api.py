"""The Slurm REST API a laptop reaches over an SSM port forward (`python -m training remote`,
training/remote/): what each back end's cluster stack adds for it.

- PCS runs slurmrestd itself (the cluster's SlurmRest mode STANDARD, Slurm 25.05 or later) on port 6820
  of the controller's private address, and signs nothing for us: clients sign their own JWTs with the
  cluster's key, which PCS keeps in a Secrets Manager secret of this account named pcs!... and tagged
  aws:pcs:cluster-id. `RestClientPolicy` lets a role read that key (of this cluster only), find the
  endpoint (pcs:GetCluster) and open the port forward through a login node.
- ParallelCluster: the head node's bootstrap (bootstrap/slurm-rest.sh) runs slurmrestd on 127.0.0.1:6820
  with JWT auth and writes a token of the cluster's default user into `RestToken`'s secret every 30
  minutes (write policy under /parallelcluster/, which the provider attaches to the head node only);
  `RestClientPolicy` lets a role read that token and open the port forward to the head node.

A token rather than the key on ParallelCluster: the key signs tokens for any user, root included, until
it is replaced; a token is one user's for two hours. Secrets Manager rather than an SSM SecureString:
CloudFormation creates and deletes the secret with the stack (a SecureString cannot be a CloudFormation
resource, and one the head node created would outlive a destroy).

The deployer attaches `RestClientPolicy` (output RestClientPolicyArn) to the role they work with from the
laptop (docs/deploy.md, "From a laptop").
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct

from stacks.shared.constants import DEFAULT_USERS, NODE_GROUP_TAG
from stacks.shared.nag import acknowledge, skip_checkov
from stacks.shared.settings import Settings, slurm_release

REST_PORT = 6820
PCS_REST_SLURM = "25.05"
"""The first Slurm release PCS runs the REST API for."""
TOKEN_RENEW_MINUTES = 30
TOKEN_LIFESPAN_SECONDS = 7200
"""The head node's token: renewed every 30 minutes, valid two hours (a laptop holding one keeps working
across a missed renewal or two)."""


def pcs_rest_api(settings: Settings) -> bool:
    """Whether the PCS cluster gets the managed REST API: from Slurm 25.05 on (image.pcs_slurm_version)."""
    return slurm_release(settings.image.pcs_slurm_version) >= slurm_release(PCS_REST_SLURM)


def head_node_pointer(settings: Settings, secret_arn: str) -> dict:
    """The bundle pointer's "rest" entry: what the head node's bootstrap needs to run slurmrestd and renew the
    token (bootstrap/slurm-rest.sh)."""
    return {"token_secret": secret_arn, "user": DEFAULT_USERS[settings.image.os], "port": REST_PORT,
            "renew_minutes": TOKEN_RENEW_MINUTES, "lifespan_seconds": TOKEN_LIFESPAN_SECONDS}


def _finding_arn(stack: cdk.Stack, service: str, rest: str, *, account: bool = True) -> str:
    """An ARN of this stack as cdk-nag writes it in a finding: literal partition and region where the stack
    has them, <AWS::...> where they are pseudo parameters."""
    partition = "<AWS::Partition>" if cdk.Token.is_unresolved(stack.partition) else stack.partition
    region = "<AWS::Region>" if cdk.Token.is_unresolved(stack.region) else stack.region
    owner = ("<AWS::AccountId>" if cdk.Token.is_unresolved(stack.account) else stack.account) if account else ""
    return f"arn:{partition}:{service}:{region}:{owner}:{rest}"


def _acknowledge_own_sessions(policy: iam.ManagedPolicy) -> None:
    stack = cdk.Stack.of(policy)
    acknowledge(policy, f"IAM5[Resource::{_finding_arn(stack, 'ssm', 'session/<aws:userid>-*')}]",
                "Session Manager names each session <caller's user id>-<random>: this lets a caller end or resume its "
                "own sessions only.")


def _session_statements(partition: str, region: str, account: str, document: str,
                        instance_condition: dict | None, instance_arns: list[str]) -> list[iam.PolicyStatement]:
    """Session Manager port forwards with one document to the instances given, and ending one's own sessions."""
    return [
        iam.PolicyStatement(actions=["ssm:StartSession"], resources=instance_arns, conditions=instance_condition),
        iam.PolicyStatement(actions=["ssm:StartSession"],
                            resources=[f"arn:{partition}:ssm:{region}::document/{document}"]),
        iam.PolicyStatement(actions=["ssm:TerminateSession", "ssm:ResumeSession"],
                            resources=[f"arn:{partition}:ssm:{region}:{account}:session/${{aws:userid}}-*"]),
    ]


class HeadNodeRestToken(Construct):
    """ParallelCluster: the secret the head node writes its token into, the head node's write policy, and the
    laptop's read policy."""

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        self.secret = secretsmanager.Secret(
            self, "Token", description="scDINO: the Slurm REST API token the head node renews (bootstrap/slurm-rest.sh)",
            removal_policy=cdk.RemovalPolicy.DESTROY)
        acknowledge(self.secret, "SMG4", f"The head node replaces the value every {TOKEN_RENEW_MINUTES} minutes with a "
                    f"token that expires after {TOKEN_LIFESPAN_SECONDS // 3600} hours (its own rotation); a rotation "
                    "Lambda would only overwrite it with a string Slurm refuses.")
        skip_checkov(self.secret.node.default_child, {"CKV_AWS_149": (
            "Encrypted with Secrets Manager's AWS managed key: the value is a token that expires two hours after the "
            "head node wrote it; a customer managed key would add a key-month and KMS grants to the head node and "
            "every client role, while who may read the value is already this stack's two policies.")})
        self.write_policy = iam.ManagedPolicy(self, "WritePolicy", path="/parallelcluster/", statements=[
            iam.PolicyStatement(actions=["secretsmanager:PutSecretValue"], resources=[self.secret.secret_arn])])
        self.client_policy = iam.ManagedPolicy(self, "ClientPolicy", description=(
            "scDINO: python -m training remote (read the Slurm REST API token, port-forward to the head node)"))
        self.client_policy.add_statements(iam.PolicyStatement(actions=["secretsmanager:GetSecretValue"],
                                                              resources=[self.secret.secret_arn]))

    def allow_port_forward(self, head_node_id: str) -> None:
        """The client policy may open port forwards to this head node (its id comes with the cluster)."""
        stack = cdk.Stack.of(self)
        instance = f"arn:{stack.partition}:ec2:{stack.region}:{stack.account}:instance/{head_node_id}"
        for statement in _session_statements(stack.partition, stack.region, stack.account,
                                             "AWS-StartPortForwardingSession", None, [instance]):
            self.client_policy.add_statements(statement)
        _acknowledge_own_sessions(self.client_policy)


class PcsRestClientPolicy(Construct):
    """PCS: the laptop's policy: this cluster's JWT key, its endpoints, port forwards through its login nodes."""

    def __init__(self, scope: Construct, construct_id: str, *, cluster_arn: str, cluster_id: str,
                 login_tag: str) -> None:
        super().__init__(scope, construct_id)
        stack = cdk.Stack.of(self)
        partition, region, account = stack.partition, stack.region, stack.account
        self.policy = iam.ManagedPolicy(self, "Policy", description=(
            "scDINO: python -m training remote (the PCS cluster's JWT key and endpoints, port forwards through its "
            "login nodes)"), statements=[
            iam.PolicyStatement(actions=["pcs:GetCluster"], resources=[cluster_arn]),
            iam.PolicyStatement(
                actions=["secretsmanager:GetSecretValue"],
                resources=[f"arn:{partition}:secretsmanager:{region}:{account}:secret:pcs!*"],
                conditions={"StringEquals": {"secretsmanager:ResourceTag/aws:pcs:cluster-id": cluster_id}}),
            iam.PolicyStatement(actions=["ec2:DescribeInstances"], resources=["*"]),
            *_session_statements(partition, region, account, "AWS-StartPortForwardingSessionToRemoteHost",
                                 {"StringEquals": {f"ssm:resourceTag/{NODE_GROUP_TAG}": login_tag}},
                                 [f"arn:{partition}:ec2:{region}:{account}:instance/*"]),
        ])
        acknowledge(self.policy, f"IAM5[Resource::{_finding_arn(stack, 'secretsmanager', 'secret:pcs!*')}]",
                    "PCS names its cluster secrets pcs!<id> and reports the JWT key's ARN only at "
                    "run time (pcs get-cluster); the condition on its aws:pcs:cluster-id tag keeps this to the JWT "
                    "and auth keys of this cluster.")
        acknowledge(self.policy, "IAM5[Resource::*]", "ec2:DescribeInstances has no resource-level permissions; it "
                    "finds a running login node by its tag (python -m training remote tunnel).")
        acknowledge(self.policy, f"IAM5[Resource::{_finding_arn(stack, 'ec2', 'instance/*')}]",
                    f"Login nodes come and go with their node group: sessions are allowed only to instances tagged "
                    f"{NODE_GROUP_TAG}={login_tag}.")
        _acknowledge_own_sessions(self.policy)
