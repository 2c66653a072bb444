"""Storage stack: encryption, bucket hardening, FSx PERSISTENT_2 linked to the bucket, retention."""

from __future__ import annotations

import pytest
from aws_cdk.assertions import Match

from tests.support.cdk_synth import one, resources

pytestmark = pytest.mark.slow

# Renaming these would make CloudFormation replace the data: they must never change.
STABLE_LOGICAL_IDS = {
    "DataBucketE3889A50": "AWS::S3::Bucket",
    "DataFileSystemD6B5DF42": "AWS::FSx::FileSystem",
    "DataRepositoryAssociation": "AWS::FSx::DataRepositoryAssociation",
    "StorageKeyB6649B55": "AWS::KMS::Key",
}


def test_logical_ids_of_stateful_resources_are_stable(synth):
    for logical_id, resource_type in STABLE_LOGICAL_IDS.items():
        assert synth.json["storage"]["Resources"][logical_id]["Type"] == resource_type


def test_kms_key_rotates(synth):
    synth.templates["storage"].has_resource_properties("AWS::KMS::Key", {"EnableKeyRotation": True})


def test_data_bucket_is_encrypted_versioned_private_logged(synth):
    bucket = synth.json["storage"]["Resources"]["DataBucketE3889A50"]["Properties"]
    assert bucket["BucketEncryption"]["ServerSideEncryptionConfiguration"][0][
        "ServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"
    assert bucket["VersioningConfiguration"] == {"Status": "Enabled"}
    assert bucket["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True, "BlockPublicPolicy": True, "IgnorePublicAcls": True, "RestrictPublicBuckets": True}
    assert bucket["LoggingConfiguration"]["DestinationBucketName"] == {"Ref": "AccessLogsBucket83982689"}


def test_every_bucket_denies_insecure_transport(synth):
    policies = resources(synth.json["storage"], "AWS::S3::BucketPolicy")
    assert len(policies) == 2
    for policy in policies.values():
        statements = policy["Properties"]["PolicyDocument"]["Statement"]
        assert any(s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
                   for s in statements)


def test_file_system_is_persistent_2_encrypted_with_settings(synth):
    synth.templates["storage"].has_resource_properties("AWS::FSx::FileSystem", {
        "FileSystemType": "LUSTRE", "FileSystemTypeVersion": "2.15", "StorageCapacity": 1200,
        "KmsKeyId": {"Ref": "StorageKeyB6649B55"},
        "LustreConfiguration": {"DeploymentType": "PERSISTENT_2", "PerUnitStorageThroughput": 250,
                                "DataCompressionType": "LZ4"},
        "SecurityGroupIds": [Match.object_like({"Fn::ImportValue": Match.string_like_regexp("FsxSecurityGroup")})],
    })


def test_association_links_fsx_data_path_to_the_bucket_prefix_both_ways(synth):
    dra = synth.json["storage"]["Resources"]["DataRepositoryAssociation"]["Properties"]
    assert dra["FileSystemPath"] == "/data"
    assert dra["DataRepositoryPath"] == {"Fn::Join": ["", ["s3://", {"Ref": "DataBucketE3889A50"}, "/data/"]]}
    assert dra["FileSystemId"] == {"Ref": "DataFileSystemD6B5DF42"}
    assert dra["BatchImportMetaDataOnCreate"] is True
    events = ["NEW", "CHANGED", "DELETED"]
    assert dra["S3"] == {"AutoImportPolicy": {"Events": events}, "AutoExportPolicy": {"Events": events}}


def test_noncurrent_object_versions_expire(synth):
    rules = synth.json["storage"]["Resources"]["DataBucketE3889A50"]["Properties"]["LifecycleConfiguration"]["Rules"]
    assert [rule["NoncurrentVersionExpiration"] for rule in rules] == [{"NoncurrentDays": 30}]
    assert rules[0]["Status"] == "Enabled" and "Prefix" not in rules[0]


def test_node_data_policy_lists_and_reads_the_data_prefix_only(synth):
    """Nodes write through /fsx (FSx exports with its own role); tests/infra/test_node_roles.py holds every
    node role's S3 actions by prefix."""
    policy = one(synth.json["storage"], "AWS::IAM::ManagedPolicy")["Properties"]["PolicyDocument"]
    list_statement, object_statement = policy["Statement"]
    assert list_statement["Action"] == "s3:ListBucket"
    assert list_statement["Condition"] == {"StringLike": {"s3:prefix": ["data/*", "data"]}}
    assert object_statement["Action"] == "s3:GetObject"
    assert object_statement["Resource"] == {
        "Fn::Join": ["", [{"Fn::GetAtt": ["DataBucketE3889A50", "Arn"]}, "/data/*"]]}


def test_deletions_reach_fsx_only_from_the_owner_and_leave_a_restorable_version(synth):
    """The association imports DELETED on purpose (storage_stack._EVENTS): the bucket refuses node roles a
    deletion, so the deletions it carries onto /fsx are the owner's; a deletion exported from /fsx is a delete
    marker over a version the lifecycle keeps storage.noncurrent_version_days (30)."""
    storage = synth.json["storage"]
    dra = storage["Resources"]["DataRepositoryAssociation"]["Properties"]["S3"]
    assert "DELETED" in dra["AutoImportPolicy"]["Events"] and "DELETED" in dra["AutoExportPolicy"]["Events"]
    (policy,) = [p for p in resources(storage, "AWS::S3::BucketPolicy").values()
                 if p["Properties"]["Bucket"] == {"Ref": "DataBucketE3889A50"}]
    (denial,) = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if "ArnLike" in s.get("Condition", {})]
    assert denial["Effect"] == "Deny" and {"s3:DeleteObject", "s3:DeleteObjectVersion"} <= set(denial["Action"])
    bucket = storage["Resources"]["DataBucketE3889A50"]["Properties"]
    assert bucket["VersioningConfiguration"] == {"Status": "Enabled"}
    (rule,) = bucket["LifecycleConfiguration"]["Rules"]
    assert rule["NoncurrentVersionExpiration"] == {"NoncurrentDays": 30} and "ExpirationInDays" not in rule


def test_stateful_resources_are_retained_and_protected_by_default(synth):
    for logical_id in STABLE_LOGICAL_IDS:
        resource = synth.json["storage"]["Resources"][logical_id]
        assert resource["DeletionPolicy"] == "Retain", logical_id
        assert resource["UpdateReplacePolicy"] == "Retain", logical_id
    assert synth.stacks.storage.termination_protection is True


def test_demo_setting_makes_storage_deletable(demo_synth):
    template = demo_synth.json["storage"]
    for logical_id in ("DataBucketE3889A50", "DataFileSystemD6B5DF42"):
        assert template["Resources"][logical_id]["DeletionPolicy"] == "Delete"
    # A versioned bucket is emptied by CDK's auto-delete custom resource before deletion.
    assert resources(template, "Custom::S3AutoDeleteObjects")
    assert demo_synth.stacks.storage.termination_protection is False
