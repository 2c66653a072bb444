"""Network stack: one AZ, endpoints, flow logs, and the security-group rules EFA and Lustre need."""

from __future__ import annotations

import pytest

from tests.support.cdk_synth import resources, run_pcluster

pytestmark = pytest.mark.slow


def test_vpc_spans_the_one_configured_zone_with_public_and_private_subnets(synth):
    subnets = resources(synth.json["network"], "AWS::EC2::Subnet")
    assert len(subnets) == 2
    assert {s["Properties"]["AvailabilityZone"] for s in subnets.values()} == {"us-east-1a"}
    # The NAT gateway (billed hourly) belongs to the cluster stack, not to the long-lived network.
    synth.templates["network"].resource_count_is("AWS::EC2::NatGateway", 0)
    synth.templates["network"].resource_count_is("AWS::EC2::InternetGateway", 1)


def test_gateway_endpoints_for_s3_and_dynamodb(synth):
    endpoints = resources(synth.json["network"], "AWS::EC2::VPCEndpoint")
    services = sorted(str(e["Properties"]["ServiceName"]) for e in endpoints.values())
    assert len(services) == 2 and "dynamodb" in services[0] and ".s3" in services[1]
    assert {e["Properties"]["VpcEndpointType"] for e in endpoints.values()} == {"Gateway"}


def test_flow_logs_go_to_a_log_group_with_retention(synth):
    synth.templates["network"].has_resource_properties("AWS::EC2::FlowLog", {"TrafficType": "ALL"})
    synth.templates["network"].has_resource_properties("AWS::Logs::LogGroup", {"RetentionInDays": 30})


def _group_id(synth, name: str) -> dict:
    groups = resources(synth.json["network"], "AWS::EC2::SecurityGroup")
    (logical_id,) = [key for key in groups if key.startswith(name)]
    return {"Fn::GetAtt": [logical_id, "GroupId"]}


def test_cluster_group_allows_all_traffic_within_itself_both_ways(synth):
    cluster = _group_id(synth, "ClusterSecurityGroup")
    for rule_type in ("AWS::EC2::SecurityGroupIngress", "AWS::EC2::SecurityGroupEgress"):
        peer_key = "SourceSecurityGroupId" if rule_type.endswith("Ingress") else "DestinationSecurityGroupId"
        synth.templates["network"].has_resource_properties(
            rule_type, {"IpProtocol": "-1", "GroupId": cluster, peer_key: cluster})


def test_fsx_group_opens_lustre_ports_to_cluster_nodes_only(synth):
    cluster, fsx = _group_id(synth, "ClusterSecurityGroup"), _group_id(synth, "FsxSecurityGroup")
    for low, high in ((988, 988), (1018, 1023)):
        synth.templates["network"].has_resource_properties("AWS::EC2::SecurityGroupIngress", {
            "IpProtocol": "tcp", "FromPort": low, "ToPort": high, "GroupId": fsx,
            "SourceSecurityGroupId": cluster})
        # ParallelCluster's FSx validator also wants the file system's group to reach the nodes.
        synth.templates["network"].has_resource_properties("AWS::EC2::SecurityGroupEgress", {
            "IpProtocol": "tcp", "FromPort": low, "ToPort": high, "GroupId": fsx,
            "DestinationSecurityGroupId": cluster})
    ingress = resources(synth.json["network"], "AWS::EC2::SecurityGroupIngress")
    sources = {(r["Properties"]["FromPort"], r["Properties"]["ToPort"], r["Properties"]["SourceSecurityGroupId"]
                ["Fn::GetAtt"][0]) for r in ingress.values() if r["Properties"]["GroupId"] == fsx}
    cluster_id, fsx_id = cluster["Fn::GetAtt"][0], fsx["Fn::GetAtt"][0]
    # From the cluster: exactly the Lustre ports; otherwise only the file servers among themselves.
    assert {(low, high) for low, high, source in sources if source == cluster_id} == {(988, 988), (1018, 1023)}
    assert {source for _, _, source in sources} == {cluster_id, fsx_id}


def test_no_ingress_from_anywhere_in_any_stack(synth, demo_synth):
    for result in (synth, demo_synth):
        for name, template in result.json.items():
            for logical_id, resource in template["Resources"].items():
                rules = list(resource["Properties"].get("SecurityGroupIngress", [])) if resource["Type"] == \
                    "AWS::EC2::SecurityGroup" else []
                if resource["Type"] == "AWS::EC2::SecurityGroupIngress":
                    rules.append(resource["Properties"])
                for rule in rules:
                    assert rule.get("CidrIp") != "0.0.0.0/0", f"{name}/{logical_id} is open to the internet"
                    assert rule.get("CidrIpv6") != "::/0", f"{name}/{logical_id} is open to the internet"



# --- the synthesised rules, as ParallelCluster's ExistingFsxNetworkingValidator reads them ----------

GROUP_IDS = {"ClusterSecurityGroup": "sg-0c1c1c1c1c1c1c1c1", "FsxSecurityGroup": "sg-0f5f5f5f5f5f5f5f5"}
# ParallelCluster gives the head node and each queue a group of its own beside AdditionalSecurityGroups.
NODES = [["sg-0aaaaaaaaaaaaaaa1", GROUP_IDS["ClusterSecurityGroup"]],
         ["sg-0aaaaaaaaaaaaaaa2", GROUP_IDS["ClusterSecurityGroup"]]]


def _group(reference) -> str:
    (name,) = [name for name in GROUP_IDS if name in str(reference)]
    return GROUP_IDS[name]


def _permission(rule: dict, peer_key: str, cidr_key: str) -> dict:
    permission = {"IpProtocol": str(rule["IpProtocol"]), "FromPort": rule.get("FromPort"), "ToPort": rule.get("ToPort")}
    if peer_key in rule:
        permission["UserIdGroupPairs"] = [{"GroupId": _group(rule[peer_key])}]
    if cidr_key in rule:
        permission["IpRanges"] = [{"CidrIp": rule[cidr_key]}]
    return permission


def security_groups_as_ec2_describes_them(result) -> dict[str, dict]:
    """Every rule of the two groups, from whichever stack's template holds it, in EC2's response shape."""
    groups = {group_id: {"IpPermissions": [], "IpPermissionsEgress": []} for group_id in GROUP_IDS.values()}
    for template in result.json.values():
        for logical_id, resource in template["Resources"].items():
            properties = resource.get("Properties", {})
            if resource["Type"] == "AWS::EC2::SecurityGroup" and any(name in logical_id for name in GROUP_IDS):
                group = groups[_group(logical_id)]
                group["IpPermissions"] += [_permission(r, "SourceSecurityGroupId", "CidrIp")
                                           for r in properties.get("SecurityGroupIngress", [])]
                group["IpPermissionsEgress"] += [_permission(r, "DestinationSecurityGroupId", "CidrIp")
                                                 for r in properties.get("SecurityGroupEgress", [])]
            elif resource["Type"] == "AWS::EC2::SecurityGroupIngress":
                groups[_group(properties["GroupId"])]["IpPermissions"].append(
                    _permission(properties, "SourceSecurityGroupId", "CidrIp"))
            elif resource["Type"] == "AWS::EC2::SecurityGroupEgress":
                groups[_group(properties["GroupId"])]["IpPermissionsEgress"].append(
                    _permission(properties, "DestinationSecurityGroupId", "CidrIp"))
    return groups


def test_parallelcluster_accepts_the_file_system_security_groups(synth):
    groups = security_groups_as_ec2_describes_them(synth)
    fsx = GROUP_IDS["FsxSecurityGroup"]
    without_lustre_ingress = {**groups, fsx: {**groups[fsx], "IpPermissions": [
        rule for rule in groups[fsx]["IpPermissions"] if rule.get("FromPort") != 988]}}
    result = run_pcluster({"fsx_networking": {
        label: {"groups": value, "fsx_groups": [fsx], "nodes": NODES}
        for label, value in (("synthesized", groups), ("without-988-ingress", without_lustre_ingress))}})
    assert result["fsx_networking"]["synthesized"] == []
    (failure,) = result["fsx_networking"]["without-988-ingress"]
    assert failure[0] == "ERROR" and "988" in failure[1]
