"""Small helpers shared by the stacks."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct

_RETENTION = {
    1: logs.RetentionDays.ONE_DAY, 3: logs.RetentionDays.THREE_DAYS, 5: logs.RetentionDays.FIVE_DAYS,
    7: logs.RetentionDays.ONE_WEEK, 14: logs.RetentionDays.TWO_WEEKS, 30: logs.RetentionDays.ONE_MONTH,
    60: logs.RetentionDays.TWO_MONTHS, 90: logs.RetentionDays.THREE_MONTHS,
    120: logs.RetentionDays.FOUR_MONTHS, 150: logs.RetentionDays.FIVE_MONTHS,
    180: logs.RetentionDays.SIX_MONTHS, 365: logs.RetentionDays.ONE_YEAR,
    400: logs.RetentionDays.THIRTEEN_MONTHS, 545: logs.RetentionDays.EIGHTEEN_MONTHS,
    731: logs.RetentionDays.TWO_YEARS, 1827: logs.RetentionDays.FIVE_YEARS, 3653: logs.RetentionDays.TEN_YEARS,
}

LOG_RETENTION_DAYS = tuple(sorted(_RETENTION))

CLOUDWATCH_LOGS_KEY_ACTIONS = ["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*",
                               "kms:Describe*"]
"""What CloudWatch Logs needs of a customer key to encrypt and read a log group (AWS's "Encrypt log data
in CloudWatch Logs using AWS Key Management Service")."""


def retention(days: int) -> logs.RetentionDays:
    """CloudWatch Logs retention for a day count already validated by the settings."""
    return _RETENTION[days]


def allow_cloudwatch_logs(key: kms.Key) -> None:
    """Let CloudWatch Logs use `key` for this account's log groups in this region, and only for those
    (the encryption context CloudWatch Logs sends names the log group)."""
    stack = cdk.Stack.of(key)
    key.add_to_resource_policy(iam.PolicyStatement(
        principals=[iam.ServicePrincipal(f"logs.{stack.region}.amazonaws.com")],
        actions=CLOUDWATCH_LOGS_KEY_ACTIONS, resources=["*"],
        conditions={"ArnLike": {"kms:EncryptionContext:aws:logs:arn":
                                f"arn:{stack.partition}:logs:{stack.region}:{stack.account}:log-group:*"}}))


def logs_key(scope: Construct, construct_id: str, *, description: str) -> kms.Key:
    """A rotated customer key for a stack's log groups, deleted with the stack (as its log groups are)."""
    key = kms.Key(scope, construct_id, enable_key_rotation=True, removal_policy=cdk.RemovalPolicy.DESTROY,
                  description=description)
    allow_cloudwatch_logs(key)
    return key
