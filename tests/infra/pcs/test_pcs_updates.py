"""What a deploy does to a PCS cluster that is already deployed, read from two synthesised templates the way
CloudFormation reads a change: a resource is replaced when one of its create-only properties changes, or
when such a property refers to a resource that is replaced (its id or ARN changes); otherwise a changed
resource is updated in place. The create-only and identifier properties come from the resource schemas
CloudFormation publishes, as cfn-lint ships them, not from a list kept here.

A replacement is created before the old resource is deleted, so it must not keep a name that has to be
unique: CloudFormation itself refuses to replace a resource whose identifier the template gives ("cannot
update a stack when a custom-named resource requires replacing"), PCS takes a cluster name once per region
and a node group or queue name once per cluster.

Cases (against conftest's pcs_synth, every preset and the Spot CPU queue): a newer Slurm release is an
update of the cluster alone; another size replaces the cluster under another name, and its node groups,
queues and log delivery follow it; the idle times and the login nodes' count are updates, another login or
CPU instance type replaces that group under another name, and plan's standing cost counts what is
deployed. Two controls show the check refusing a replacement that keeps its name."""

from __future__ import annotations

import copy
import json

import pytest
from cfnlint.schema import PROVIDER_SCHEMA_MANAGER

from stacks.pcs.scheduler_logs import LOG_TYPE
from stacks.shared.presets import PRESETS
from stacks.shared.settings import build_settings
from tests.support.cdk_synth import cdk_json_context, resources, synthesize
from training.planning.inputs import PlanSettings
from training.planning.standing import HOURS_PER_MONTH, standing_items

pytestmark = pytest.mark.slow

PCS = {"backend": "pcs", "cluster.presets": ",".join(PRESETS), "cluster.cpu_spot_instance_type": "c6i.8xlarge"}
"""conftest's pcs_synth: the deployed cluster every case changes."""
NEWER_SLURM = {"image.pcs_slurm_version": "26.05"}
LARGER = {"cluster.pcs_size": "MEDIUM"}
IDLE = {"cluster.scaledown_idle_minutes": "15", "cluster.scaledown_idle_minutes_per_queue": "p5.48xlarge=3,cpu-spot=2",
        "cluster.login_nodes": "2", "cluster.login_node_instance_type": "c6i.2xlarge",
        "cluster.cpu_spot_instance_type": "c6i.4xlarge"}
NAMES_UNIQUE_IN = {"AWS::PCS::Cluster": "", "AWS::PCS::ComputeNodeGroup": "ClusterId", "AWS::PCS::Queue": "ClusterId"}
"""PCS's names: a cluster's once per region (""), a node group's or queue's once per cluster."""
MISSING = object()


def _schema(resource_type: str) -> dict:
    return PROVIDER_SCHEMA_MANAGER.get_resource_schema("us-east-1", resource_type).schema


def _at(properties: dict, pointer: str):
    """The value at a schema pointer (/properties/A/B), MISSING where the template leaves it out."""
    value = properties
    for part in pointer.split("/")[2:]:
        if not isinstance(value, dict) or part not in value:
            return MISSING
        value = value[part]
    return value


def _refers_to(value) -> set[str]:
    """The logical ids a value reads (Ref, Fn::GetAtt, Fn::Sub's ${Id} and ${Id.Attr})."""
    if isinstance(value, list):
        return set().union(*map(_refers_to, value)) if value else set()
    if not isinstance(value, dict):
        return set()
    found = set().union(*map(_refers_to, value.values())) if value else set()
    if isinstance(value.get("Ref"), str):
        found.add(value["Ref"])
    if isinstance(value.get("Fn::GetAtt"), list):
        found.add(value["Fn::GetAtt"][0])
    sub = value.get("Fn::Sub")
    if isinstance(sub, str) or (isinstance(sub, list) and isinstance(sub[0], str)):
        text = sub if isinstance(sub, str) else sub[0]
        found |= {part.split("}", 1)[0].split(".", 1)[0] for part in text.split("${")[1:]}
    return found


def change_plan(before: dict, after: dict) -> dict[str, str]:
    """{logical id: add, remove, update or replace} for the resources a deploy from `before` to `after` touches."""
    old, new = before["Resources"], after["Resources"]
    plan = {key: "add" for key in new.keys() - old.keys()} | {key: "remove" for key in old.keys() - new.keys()}
    both = sorted(old.keys() & new.keys())
    changed = True
    while changed:
        changed = False
        replaced = {key for key, action in plan.items() if action in ("replace", "add")}
        for key in both:
            was, now = old[key].get("Properties", {}), new[key].get("Properties", {})
            create_only = _schema(new[key]["Type"]).get("createOnlyProperties", [])
            if any(_at(was, path) != _at(now, path) or _refers_to(_at(now, path)) & replaced for path in create_only):
                action = "replace"
            elif was != now or _refers_to(now) & replaced:
                action = "update"
            else:
                continue
            if plan.get(key) != action and plan.get(key) != "replace":
                plan[key], changed = action, True
    return plan


def refusals(before: dict, after: dict, plan: dict[str, str]) -> list[str]:
    """The replacements that cannot be carried out: a kept identifier the template gives, or a kept PCS name
    whose scope (the region, or a cluster not replaced with it) still holds the old resource."""
    old, new = before["Resources"], after["Resources"]
    found = []
    for key in (key for key, action in plan.items() if action == "replace"):
        resource_type, was, now = new[key]["Type"], old[key]["Properties"], new[key]["Properties"]
        schema = _schema(resource_type)
        given = [path for path in schema.get("primaryIdentifier", []) if path not in schema.get("readOnlyProperties", [])]
        if any(_at(now, path) is not MISSING and _at(was, path) == _at(now, path) for path in given):
            found.append(f"{key}: CloudFormation cannot replace a custom-named resource")
        if resource_type in NAMES_UNIQUE_IN and "Name" in now and was.get("Name") == now["Name"]:
            parent = NAMES_UNIQUE_IN[resource_type]
            if not parent or not {plan.get(ref) for ref in _refers_to(now[parent])} & {"replace", "add"}:
                found.append(f"{key}: PCS already has a {resource_type} named {now['Name']} where it would be created")
    return found


@pytest.fixture(scope="module")
def variants(tmp_path_factory) -> dict:
    """The cluster stack after each change (each a synthesis of the whole app, about 10 s)."""
    return {label: synthesize(tmp_path_factory.mktemp(f"cdk-out-{label}"), PCS, layer)
            for label, layer in (("slurm", NEWER_SLURM), ("size", LARGER), ("idle", IDLE))}


def _by_type(template: dict, plan: dict[str, str], resource_type: str) -> dict[str, str]:
    return {key: action for key, action in plan.items() if template["Resources"][key]["Type"] == resource_type}


def test_the_check_reads_create_only_properties_from_cloudformation_s_schemas():
    cluster = _schema("AWS::PCS::Cluster")
    assert set(cluster["createOnlyProperties"]) == {"/properties/Name", "/properties/Networking", "/properties/Size"}
    assert "/properties/ClusterId" in _schema("AWS::PCS::ComputeNodeGroup")["createOnlyProperties"]
    assert "/properties/InstanceConfigs" in _schema("AWS::PCS::ComputeNodeGroup")["createOnlyProperties"]
    assert _schema("AWS::Logs::DeliverySource")["primaryIdentifier"] == ["/properties/Name"]


def test_a_newer_slurm_release_updates_the_cluster_in_place_and_the_image_builds_it(pcs_synth, variants):
    before, after = pcs_synth.json["cluster"], variants["slurm"].json["cluster"]
    plan = change_plan(before, after)
    assert plan == {"Cluster": "update"}
    assert after["Resources"]["Cluster"]["Properties"]["Scheduler"] == {"Type": "SLURM", "Version": "26.05"}
    assert after["Resources"]["Cluster"]["Properties"]["Name"] == before["Resources"]["Cluster"]["Properties"]["Name"]
    build = json.dumps(variants["slurm"].json["image"])
    assert 'pcs_slurm_version=26.05' in build and 'pcs_slurm_version=25.11' in json.dumps(pcs_synth.json["image"])


def test_another_size_replaces_the_cluster_under_another_name_and_its_groups_and_queues_follow(pcs_synth, variants):
    before, after = pcs_synth.json["cluster"], variants["size"].json["cluster"]
    plan = change_plan(before, after)
    assert (before["Resources"]["Cluster"]["Properties"]["Name"],
            after["Resources"]["Cluster"]["Properties"]["Name"]) == ("scdino-hpc", "scdino-hpc-medium")
    assert plan["Cluster"] == "replace" and refusals(before, after, plan) == []
    groups, queues = (resources(after, kind) for kind in ("AWS::PCS::ComputeNodeGroup", "AWS::PCS::Queue"))
    assert len(groups) == len(PRESETS) + 2 and len(queues) == len(PRESETS) + 1
    for key, resource in {**groups, **queues}.items():
        # Created on the new cluster, under the names slurm/ knows, before the old ones are deleted.
        assert plan[key] == "replace" and resource["Properties"]["ClusterId"] == {"Fn::GetAtt": ["Cluster", "Id"]}
        assert resource["Properties"]["Name"] == before["Resources"][key]["Properties"]["Name"]
    logs = {value["Type"]: (key, plan.get(key)) for key, value in after["Resources"].items()
            if value["Type"].startswith("AWS::Logs::Deliver")}
    assert {kind: action for kind, (_, action) in logs.items()} == {  # the destination and its log group stay
        "AWS::Logs::DeliverySource": "replace", "AWS::Logs::Delivery": "replace", "AWS::Logs::DeliveryDestination": None}
    (source,) = resources(after, "AWS::Logs::DeliverySource").values()
    assert source["Properties"]["Name"] == "scdino-hpc-medium-scheduler-logs"
    # Nothing else is replaced: the launch templates, roles, log groups and the deploy bucket stay.
    assert {key for key, action in plan.items() if action == "replace"} == {
        "Cluster", *groups, *queues, *[key for key, action in logs.values() if action]}
    assert {action for key, action in plan.items() if action != "replace"} <= {"update"}


def test_a_replacement_that_kept_the_cluster_s_name_is_refused(pcs_synth, variants):
    """The control: the size change as the stack was before the name carried the size."""
    before, after = pcs_synth.json["cluster"], copy.deepcopy(variants["size"].json["cluster"])
    after["Resources"]["Cluster"]["Properties"]["Name"] = "scdino-hpc"
    found = refusals(before, after, change_plan(before, after))
    assert found == ["Cluster: PCS already has a AWS::PCS::Cluster named scdino-hpc where it would be created"]


def test_idle_times_and_the_login_count_are_updates_a_new_instance_type_a_new_group(pcs_synth, variants):
    before, after = pcs_synth.json["cluster"], variants["idle"].json["cluster"]
    plan = change_plan(before, after)
    assert plan["Cluster"] == "update" and refusals(before, after, plan) == []
    assert after["Resources"]["Cluster"]["Properties"]["SlurmConfiguration"]["ScaleDownIdleTimeInSeconds"] == 900
    groups = {value["Properties"]["Name"]: (key, value["Properties"])
              for key, value in resources(after, "AWS::PCS::ComputeNodeGroup").items()}
    idle = {name: props.get("SlurmConfiguration", {}).get("ScaleDownIdleTimeInSeconds") for name, (_, props) in groups.items()}
    assert idle == {**{PRESETS[name].queue_name: 900 for name in PRESETS}, "gpu-p548xl": 180, "cpu-spot-c6i4xl": 120,
                    "login-c6i2xl": None}
    login_key, login = groups["login-c6i2xl"]
    assert login["ScalingConfiguration"] == {"MinInstanceCount": 2, "MaxInstanceCount": 2}
    assert login["InstanceConfigs"] == [{"InstanceType": "c6i.2xlarge"}]
    assert before["Resources"][login_key]["Properties"]["Name"] == "login"  # the same logical id, renamed
    assert _by_type(after, plan, "AWS::PCS::ComputeNodeGroup") == {
        key: ("replace" if name in ("login-c6i2xl", "cpu-spot-c6i4xl") else "update") for name, (key, _) in groups.items()}
    # The queue follows its new group in place; the partitions keep their names.
    assert set(_by_type(after, plan, "AWS::PCS::Queue").values()) == {"update"}


def test_a_new_instance_type_under_the_old_group_name_is_refused(pcs_synth, variants):
    """The control: the login group's new type under its old name, in the same cluster."""
    before, after = pcs_synth.json["cluster"], copy.deepcopy(variants["idle"].json["cluster"])
    (login,) = [value for value in resources(after, "AWS::PCS::ComputeNodeGroup").values()
                if value["Properties"]["Name"] == "login-c6i2xl"]
    login["Properties"]["Name"] = "login"
    found = refusals(before, after, change_plan(before, after))
    assert len(found) == 1 and "named login where" in found[0], found


def test_the_standing_cost_counts_the_login_nodes_deployed(variants):
    """plan's idle cost (training/planning/standing.py) for the changed settings: the login group's count and
    type, and its root volumes' size, as the template deploys them."""
    after = variants["idle"].json["cluster"]
    (login,) = [value["Properties"] for value in resources(after, "AWS::PCS::ComputeNodeGroup").values()
                if value["Properties"]["Name"].startswith("login")]
    data = after["Resources"][login["CustomLaunchTemplate"]["TemplateId"]["Ref"]]["Properties"]["LaunchTemplateData"]
    (root,) = data["BlockDeviceMappings"]
    count, instance_type = login["ScalingConfiguration"]["MaxInstanceCount"], login["InstanceConfigs"][0]["InstanceType"]
    items = standing_items(PlanSettings.of(build_settings(cdk_json_context()["scdino"], PCS, IDLE)))
    (nodes,) = [item for item in items if item.resource.startswith("login nodes (")]
    (volumes,) = [item for item in items if item.resource.startswith("login nodes' root volumes")]
    assert nodes.resource == f"login nodes ({count} x {instance_type})" and nodes.quantity == count * HOURS_PER_MONTH
    assert volumes.quantity == count * root["Ebs"]["VolumeSize"]


def test_the_scheduler_logs_of_each_cluster_reach_a_log_group_with_retention_and_the_logs_key(pcs_synth):
    cluster = pcs_synth.json["cluster"]
    (source,) = resources(cluster, "AWS::Logs::DeliverySource").values()
    assert source["Properties"]["ResourceArn"] == {"Fn::GetAtt": ["Cluster", "Arn"]}
    assert source["Properties"]["LogType"] == LOG_TYPE == "PCS_SCHEDULER_LOGS"
    (destination_id, destination), = resources(cluster, "AWS::Logs::DeliveryDestination").items()
    (delivery,) = resources(cluster, "AWS::Logs::Delivery").values()
    assert delivery["Properties"]["DeliveryDestinationArn"] == {"Fn::GetAtt": [destination_id, "Arn"]}
    assert delivery["Properties"]["DeliverySourceName"] == {"Ref": next(iter(resources(cluster, "AWS::Logs::DeliverySource")))}
    group_id = destination["Properties"]["DestinationResourceArn"]["Fn::GetAtt"][0]
    group = cluster["Resources"][group_id]
    assert group["Properties"]["LogGroupName"] == "/aws/vendedlogs/pcs/scdino-hpc/scheduler"
    assert group["Properties"]["RetentionInDays"] == 30 and group["DeletionPolicy"] == "Delete"
    monitoring = [value for key, value in resources(cluster, "AWS::Logs::LogGroup").items() if key.startswith("Monitoring")]
    assert group["Properties"]["KmsKeyId"] == monitoring[0]["Properties"]["KmsKeyId"]
    assert cluster["Outputs"]["SchedulerLogGroup"]["Value"] == {"Ref": group_id}


def test_only_cloudwatch_logs_delivery_service_may_write_the_scheduler_log_group(pcs_synth):
    cluster = pcs_synth.json["cluster"]
    (policy_id, policy), = resources(cluster, "AWS::Logs::ResourcePolicy").items()
    text = "".join(part if isinstance(part, str) else "<token>"
                   for part in policy["Properties"]["PolicyDocument"]["Fn::Join"][1])
    (statement,) = json.loads(text)["Statement"]
    assert statement["Principal"] == {"Service": "delivery.logs.amazonaws.com"}
    assert sorted(statement["Action"]) == ["logs:CreateLogStream", "logs:PutLogEvents"]
    assert statement["Resource"] == (
        "arn:aws:logs:us-east-1:<token>:log-group:/aws/vendedlogs/pcs/scdino-hpc/scheduler:log-stream:*")
    assert statement["Condition"] == {"StringEquals": {"aws:SourceAccount": "<token>"},
                                      "ArnLike": {"aws:SourceArn": "arn:aws:logs:us-east-1:<token>:*"}}
    (destination,) = resources(cluster, "AWS::Logs::DeliveryDestination").values()
    assert policy_id in destination["DependsOn"]


def test_node_groups_wait_for_their_role_s_grant_on_the_cluster(pcs_synth):
    """A node registers with the cluster as it boots: after a replacement, with the new cluster, whose ARN the
    role's policy names only once updated."""
    cluster = pcs_synth.json["cluster"]
    for group in resources(cluster, "AWS::PCS::ComputeNodeGroup").values():
        profile = group["Properties"]["IamInstanceProfileArn"]["Fn::GetAtt"][0]
        kind = "LoginNodes" if profile.startswith("LoginNodes") else "ComputeNodes"
        (policy,) = [key for key in resources(cluster, "AWS::IAM::Policy") if key.startswith(f"{kind}RoleDefaultPolicy")]
        assert policy in group["DependsOn"], group["Properties"]["Name"]
