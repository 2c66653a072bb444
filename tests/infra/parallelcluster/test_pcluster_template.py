"""ParallelCluster 3.16.1's own CloudFormation stack for our configurations, rendered offline and checked.

The provider's Lambda turns `Custom::PclusterCluster` into ParallelCluster's cluster stack with
`Cluster.create()`; tests/support/pcluster_render.py runs that code in .venv-pcluster against fixed AWS
answers (tests/support/pcluster_stack.py reads what it uploaded). Rendered once per session, for the
default deployment, every preset on every OS we offer (with every queue option on), and both kinds of
capacity reservation. Checked: cfn-lint, and what a first deploy depends on: the head node runs our
OnNodeConfigured, every preset is a queue with its instance type, EFA and placement, the node roles carry
our policies, FSx for Lustre is at /fsx, the head node is reachable through SSM, and the Slurm settings
are in the configuration the head node generates slurm.conf from. Where the template itself does not
hold a fact (custom actions, Slurm settings), the test follows the node: cfn-init metadata -> dna.json ->
the configuration ParallelCluster uploaded at the key dna.json names.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from stacks.parallelcluster.config import ClusterRefs, build_cluster_config
from stacks.shared.constants import BOOTSTRAP_SCRIPT_KEY, BUNDLE_DIR, BUNDLE_POINTER_KEY, FSX_MOUNT_DIR
from stacks.shared.presets import PRESETS
from stacks.shared.settings import SUPPORTED_OSES, Settings, build_settings
from tests.support.cdk_synth import cdk_json_context
from tests.support.pcluster_stack import (
    Rendered,
    head_node_dna,
    head_node_init,
    joined,
    launch_template_dna,
    policies_of_role,
    queue_launch_templates,
    render_all,
    resources,
    role_of,
    tag,
    user_data,
)

pytestmark = pytest.mark.slow

ACCOUNT = "111122223333"
PIPELINE_AMI = "ami-0123456789abcdef0"
RESERVATION = "cr-0123456789abcdef0"
SECRET_ARN = f"arn:aws:secretsmanager:us-east-1:{ACCOUNT}:secret:scdino-slurmdb-AbCdEf"
SSM_POLICY_ARN = "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"
REFS = ClusterRefs(
    subnet_id="subnet-0123456789abcdef0", security_group_id="sg-0123456789abcdef0",
    file_system_id="fs-0123456789abcdef0", data_policy_arn=f"arn:aws:iam::{ACCOUNT}:policy/parallelcluster/data",
    deploy_bucket="scdino-cluster-nodebundlebucket-0123456789ab", bundle_id="a" * 64,
    deploy_read_policy_arn=f"arn:aws:iam::{ACCOUNT}:policy/parallelcluster/deploy-read",
    agent_limits_policy_arn=f"arn:aws:iam::{ACCOUNT}:policy/parallelcluster/agent-limits",
    rest_token_policy_arn=f"arn:aws:iam::{ACCOUNT}:policy/parallelcluster/rest-token")
EVERY_OPTION = {"cluster.presets": ",".join(PRESETS), "cluster.custom_ami": "ssm", "cluster.gpu_health_checks": "true",
                "cluster.cpu_spot_instance_type": "c6i.8xlarge", "cluster.login_nodes": 1}
ACCOUNTING = {"cluster.slurm_accounting.uri": "slurmdb.example.internal:3306",
              "cluster.slurm_accounting.user_name": "slurm_admin",
              "cluster.slurm_accounting.password_secret_arn": SECRET_ARN}
LAYERS = {
    "default": {},
    **{f"every-preset-{os_name}": {**EVERY_OPTION, "image.os": os_name} for os_name in SUPPORTED_OSES},
    "capacity-block": {"cluster.presets": "p5.48xlarge", "cluster.capacity_type": "CAPACITY_BLOCK",
                       "cluster.capacity_reservation_id": RESERVATION, "cluster.min_nodes": 2, **ACCOUNTING},
    "on-demand-reservation": {"cluster.presets": "p4d.24xlarge", "cluster.capacity_reservation_id": RESERVATION},
}
SETTINGS: dict[str, Settings] = {label: build_settings(cdk_json_context()["scdino"], layer)
                                 for label, layer in LAYERS.items()}
LABELS = sorted(SETTINGS)
# cfn-lint warnings on ParallelCluster's own templates, each read and accepted for the resource types named
# (None: parameters); an error is never accepted.
ACKNOWLEDGED = {
    "W2001": (None, "parameters the template does not use: ParallelCluster stores values there (ConfigVersion, "
                    "OfficialAmi, ResourcesS3Bucket, ...) and reads them back from the stack"),
    "W3011": ({"AWS::Logs::LogGroup"}, "DeletionPolicy Retain without UpdateReplacePolicy: ours (Monitoring/Logs "
                                       "DeletionPolicy: Retain) and the cleanup Lambdas'; an update keeps their names, "
                                       "so none is replaced"),
    "W3687": ({"AWS::EC2::SecurityGroup", "AWS::EC2::SecurityGroupIngress", "AWS::EC2::SecurityGroupEgress"},
              "FromPort/ToPort on all-protocol (-1) rules: EC2 ignores them"),
    "W3010": ({"AWS::EC2::Volume"}, "the shared /apps volume is created in the head node subnet's zone, which "
                                    "ParallelCluster looks up: the `network.availability_zone` setting, fixed on purpose"),
}


def _refs(settings: Settings) -> ClusterRefs:
    """Placeholder ids, and the AMI a deploy would resolve: the pipeline's (SSM), a given id, or none."""
    ami = {"": "", "ssm": PIPELINE_AMI}.get(settings.cluster.custom_ami, settings.cluster.custom_ami)
    return dataclasses.replace(REFS, custom_ami=ami)


@pytest.fixture(scope="session")
def rendered(request, tmp_path_factory) -> dict[str, Rendered]:
    """Every render, from pytest's cache when nothing that decides it changed (else ~16 s on 2 cores)."""
    (cluster_name,) = {settings.cluster_name for settings in SETTINGS.values()}
    cases = {label: {"region": settings.region, "zone": settings.network.availability_zone,
                     "config": build_cluster_config(settings, _refs(settings))} for label, settings in SETTINGS.items()}
    cache = getattr(request.config, "cache", None)  # None under `-p no:cacheprovider`
    directory = cache.mkdir("pcluster-render") if cache else tmp_path_factory.mktemp("pcluster-render")
    return render_all(directory, cluster_name, cases)


OUR_ACTION = {"Script": f"s3://{REFS.deploy_bucket}/{BOOTSTRAP_SCRIPT_KEY}",
              "Args": [f"s3://{REFS.deploy_bucket}/{BUNDLE_POINTER_KEY}", BUNDLE_DIR]}
"""The OnNodeConfigured every node must run: our script, with the bundle pointer and the install dir."""


# --- the renders and cfn-lint --------------------------------------------------------------------------------

def test_every_preset_on_every_os_is_rendered(rendered):
    assert set(rendered) == set(LABELS)
    for os_name in SUPPORTED_OSES:
        every = rendered[f"every-preset-{os_name}"]
        assert every.implied_config["Image"]["Os"] == os_name
        assert set(queue_launch_templates(every)) == {preset.queue_name for preset in PRESETS.values()} | {"cpu-spot"}
    for label in LABELS:
        assert rendered[label].create_stack["StackName"] == SETTINGS[label].cluster_name
        assert "ec2:DescribeInstanceTypes" in rendered[label].operations, "ParallelCluster looked up no instance type"


def _cfn_lint(paths: list[Path]) -> list[dict]:
    cfn_lint = str(Path(sys.executable).parent / "cfn-lint")
    result = subprocess.run([cfn_lint, "--format", "json", "--", *map(str, paths)],
                            capture_output=True, text=True, timeout=600, check=False)
    # Exit status bits: 2 errors, 4 warnings, 8 informational; 1 means cfn-lint itself failed.
    assert not result.returncode & 1, result.stderr[-3000:]
    return json.loads(result.stdout or "[]")


def _resource_type(finding: dict, templates: dict[str, dict]) -> str | None:
    path = finding["Location"]["Path"]
    if not path or path[0] != "Resources":
        return None
    if finding["Filename"] not in templates:
        templates[finding["Filename"]] = yaml.safe_load(Path(finding["Filename"]).read_text())
    return templates[finding["Filename"]]["Resources"][path[1]]["Type"]


def _acknowledged(finding: dict, templates: dict[str, dict]) -> bool:
    """A warning of an ACKNOWLEDGED rule on a resource of the types named there (or on no resource)."""
    if finding["Rule"]["Id"] not in ACKNOWLEDGED:
        return False
    types, _reason = ACKNOWLEDGED[finding["Rule"]["Id"]]
    resource_type = _resource_type(finding, templates)
    return resource_type is None if types is None else resource_type in types


def test_cfn_lint_finds_no_error_and_only_acknowledged_warnings(rendered):
    paths = [path for label in LABELS for path in rendered[label].template_files()]
    findings, templates = _cfn_lint(paths), {}
    errors = [f"{item['Rule']['Id']} {item['Filename']}: {item['Message']}" for item in findings
              if item["Level"] == "Error"]
    assert not errors, "\n".join(errors)
    unacknowledged = [f"{item['Rule']['Id']} {item['Filename']} {item['Location']['Path']}: {item['Message']}"
                      for item in findings if not _acknowledged(item, templates)]
    assert not unacknowledged, "\n".join(unacknowledged)


def test_cfn_lint_catches_a_broken_render(rendered, tmp_path):
    """Control: the same lint run on the default render with an unknown launch template property fails."""
    nested = copy.deepcopy(rendered["default"].nested[0])
    (template,) = resources(nested, "AWS::EC2::LaunchTemplate").values()
    template["Properties"]["LaunchTemplateData"]["InstanceTyp"] = "g4dn.12xlarge"
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(nested))
    assert any(item["Level"] == "Error" for item in _cfn_lint([broken]))


# --- the head node runs our OnNodeConfigured ------------------------------------------------------------------

def _downloaded_config(rendered: Rendered, dna: dict) -> dict:
    """The configuration a node downloads: the object at dna.json's key and version, in the bucket it names."""
    assert dna["cluster_s3_bucket"] == rendered.template["Parameters"]["ResourcesS3Bucket"]["Default"]
    uploaded = rendered.versions["configs/cluster-config-with-implied-values.yaml"]
    assert (dna["cluster_config_s3_key"], dna["cluster_config_version"]) == (uploaded["key"], uploaded["version"])
    return rendered.implied_config


def _reads_deploy_bucket(statements: list[dict]) -> bool:
    """A statement of the role lets it get objects of the deploy bucket (ParallelCluster's S3Access)."""
    return any(statement["Effect"] == "Allow" and "s3:Get*" in statement["Action"]
               and any(joined(resource).endswith(f":s3:::{REFS.deploy_bucket}/*") for resource in statement["Resource"])
               for statement in statements)


@pytest.mark.parametrize("label", LABELS)
def test_the_head_node_fetches_and_runs_our_on_node_configured(rendered, label):
    render = rendered[label]
    script, _ = user_data(render.template["Resources"]["HeadNodeLaunchTemplate"])
    # User data runs cfn-init's default config set of this launch template's metadata...
    assert "cfn-init -s ${AWS::StackName} -v -c default -r HeadNodeLaunchTemplate" in script
    init = head_node_init(render)
    # ... whose post-install step, after the cookbook's configuration, is the custom action runner ...
    steps = init["configSets"]["default"]
    assert "shellRunPostInstall" in steps and "chefConfig" in steps[:steps.index("shellRunPostInstall")], steps
    assert init["shellRunPostInstall"]["commands"]["runpostinstall"]["command"].endswith("fetch_and_run -postinstall")
    # ... which reads the head node's OnNodeConfigured (Script, Args) from the configuration dna.json points to
    # (the cookbook's custom_action_executor.py, given the file the cookbook downloaded from that key).
    dna = head_node_dna(render)
    assert dna["node_type"] == "HeadNode"  # the script's node_type() reads it back from cfnconfig
    assert _downloaded_config(render, dna)["HeadNode"]["CustomActions"]["OnNodeConfigured"] == OUR_ACTION
    role = role_of(render.template, render.template["Resources"]["HeadNodeLaunchTemplate"])
    assert _reads_deploy_bucket(policies_of_role(render.template, role)), "the head node cannot read the deploy bucket"


@pytest.mark.parametrize("label", LABELS)
def test_compute_nodes_fetch_and_run_our_on_node_configured(rendered, label):
    render = rendered[label]
    head = head_node_dna(render)
    queues = {queue["Name"]: queue for queue in _downloaded_config(render, head)["Scheduling"]["SlurmQueues"]}
    launch_templates = queue_launch_templates(render)
    assert set(launch_templates) == {queue["Name"] for queue in render.config["Scheduling"]["SlurmQueues"]}
    for name, (launch_template, nested) in launch_templates.items():
        script, _ = user_data(launch_template)
        assert 'FR_CMD="/opt/parallelcluster/scripts/fetch_and_run"' in script and "${!FR_CMD} -postinstall" in script
        dna = launch_template_dna(launch_template)
        assert dna["node_type"] == "ComputeFleet" and dna["scheduler_queue_name"] == name
        assert (dna["cluster_config_s3_key"], dna["cluster_config_version"]) == (
            head["cluster_config_s3_key"], head["cluster_config_version"])
        assert queues[name]["CustomActions"]["OnNodeConfigured"] == OUR_ACTION
        role = role_of(nested, launch_template)
        assert _reads_deploy_bucket(policies_of_role(nested, role)), f"queue {name} cannot read the deploy bucket"


def _login_launch_template(render: Rendered) -> tuple[dict, dict]:
    (found,) = [(template, nested) for nested in render.nested
                for template in resources(nested, "AWS::EC2::LaunchTemplate").values()
                if tag(template, "parallelcluster:node-type") == "LoginNode"]
    return found


@pytest.mark.parametrize("label", [label for label in LABELS if SETTINGS[label].cluster.login_nodes])
def test_login_nodes_fetch_and_run_our_on_node_configured(rendered, label):
    render = rendered[label]
    launch_template, nested = _login_launch_template(render)
    script, _ = user_data(launch_template)
    assert re.search(r"fetch_and_run -postinstall -c \S+cluster-config.yaml", script)
    dna = launch_template_dna(launch_template)
    assert dna["node_type"] == "LoginNode"
    (pool,) = _downloaded_config(render, head_node_dna(render))["LoginNodes"]["Pools"]
    assert pool["CustomActions"]["OnNodeConfigured"] == OUR_ACTION
    role = nested["Resources"][role_of(nested, launch_template)]
    # Login pools have no S3Access: the deploy bucket is read through our managed policy.
    assert REFS.deploy_read_policy_arn in role["Properties"]["ManagedPolicyArns"]


# --- every preset is a queue with its instance type, EFA and placement -----------------------------------------

def _efa_interfaces(launch_template: dict) -> int:
    interfaces = launch_template["Properties"]["LaunchTemplateData"]["NetworkInterfaces"]
    return sum(interface.get("InterfaceType") in ("efa", "efa-only") for interface in interfaces)


def _placement_group(launch_template: dict, nested: dict) -> dict | None:
    """The placement group resource the launch template places its instances in, if any."""
    group = launch_template["Properties"]["LaunchTemplateData"].get("Placement", {}).get("GroupName")
    return nested["Resources"][group["Ref"]] if group else None


@pytest.mark.parametrize("label", LABELS)
def test_each_enabled_preset_is_a_queue_with_its_instance_type_efa_and_placement(rendered, label):
    render, cluster = rendered[label], SETTINGS[label].cluster
    launch_templates = queue_launch_templates(render)
    assert {PRESETS[name].queue_name for name in cluster.presets} <= set(launch_templates)
    for name in cluster.presets:
        preset = PRESETS[name]
        launch_template, nested = launch_templates[preset.queue_name]
        data = launch_template["Properties"]["LaunchTemplateData"]
        assert data["InstanceType"] == preset.instance_type
        # EFA: one EFA interface per network card ParallelCluster was told the type has.
        cards = render.instance_types[preset.instance_type]["NetworkInfo"]["MaximumNetworkCards"]
        assert _efa_interfaces(launch_template) == (cards if preset.efa else 0)
        assert launch_template_dna(launch_template)["enable_efa"] == ("efa" if preset.efa else "NONE")
        placed = preset.placement_group and not cluster.capacity_reservation_id
        group = _placement_group(launch_template, nested)
        assert (group is not None) == placed, f"{preset.queue_name}: placement group expected {placed}"
        if group:
            assert group["Properties"]["Strategy"] == "cluster"
        # Slurm's gres.conf counts GPUs from the instance types data ParallelCluster uploads.
        (gpus,) = render.instance_types[preset.instance_type]["GpuInfo"]["Gpus"]
        assert gpus["Count"] == preset.gpus_per_node
        assert data["ImageId"] == (_refs(SETTINGS[label]).custom_ami or
                                   render.template["Parameters"]["OfficialAmi"]["Default"])


@pytest.mark.parametrize("label", ["capacity-block", "on-demand-reservation"])
def test_reserved_gpu_nodes_launch_into_the_reservation(rendered, label):
    cluster = SETTINGS[label].cluster
    (name,) = cluster.presets
    launch_template, _ = queue_launch_templates(rendered[label])[PRESETS[name].queue_name]
    data = launch_template["Properties"]["LaunchTemplateData"]
    assert data["CapacityReservationSpecification"] == {"CapacityReservationTarget": {
        "CapacityReservationId": RESERVATION}}
    market = data.get("InstanceMarketOptions", {}).get("MarketType")
    assert market == ("capacity-block" if cluster.capacity_type == "CAPACITY_BLOCK" else None)
    (resource,) = [queue for queue in rendered[label].implied_config["Scheduling"]["SlurmQueues"]
                   if queue["Name"] == PRESETS[name].queue_name][0]["ComputeResources"]
    assert (resource["MinCount"], resource["MaxCount"]) == (cluster.min_nodes, cluster.max_nodes)


def test_the_spot_cpu_queue_is_spot_without_efa_or_placement(rendered):
    for os_name in SUPPORTED_OSES:
        launch_template, nested = queue_launch_templates(rendered[f"every-preset-{os_name}"])["cpu-spot"]
        data = launch_template["Properties"]["LaunchTemplateData"]
        assert data["InstanceMarketOptions"]["MarketType"] == "spot"
        assert data["InstanceType"] == SETTINGS[f"every-preset-{os_name}"].cluster.cpu_spot_instance_type
        assert _efa_interfaces(launch_template) == 0 and _placement_group(launch_template, nested) is None


# --- node roles, FSx, SSM, Slurm --------------------------------------------------------------------------------

def _node_roles(render: Rendered) -> list[tuple[str, dict, list]]:
    """(node, its IAM role, the AdditionalIamPolicies we gave it) for the head node, each queue, each pool."""
    template = render.template
    found = [("HeadNode", template["Resources"][role_of(template, template["Resources"]["HeadNodeLaunchTemplate"])],
              render.config["HeadNode"]["Iam"]["AdditionalIamPolicies"])]
    queues = {queue["Name"]: queue for queue in render.config["Scheduling"]["SlurmQueues"]}
    for name, (launch_template, nested) in queue_launch_templates(render).items():
        found.append((name, nested["Resources"][role_of(nested, launch_template)],
                      queues[name]["Iam"]["AdditionalIamPolicies"]))
    if "LoginNodes" in render.config:
        launch_template, nested = _login_launch_template(render)
        (pool,) = render.config["LoginNodes"]["Pools"]
        found.append(("login", nested["Resources"][role_of(nested, launch_template)],
                      pool["Iam"]["AdditionalIamPolicies"]))
    return found


@pytest.mark.parametrize("label", LABELS)
def test_node_roles_carry_our_policies_and_session_manager(rendered, label):
    for node, role, policies in _node_roles(rendered[label]):
        attached = role["Properties"]["ManagedPolicyArns"]
        missing = [entry["Policy"] for entry in policies if entry["Policy"] not in attached]
        assert not missing, f"{node}: role lacks {missing}"
        assert SSM_POLICY_ARN in attached and REFS.data_policy_arn in attached, node


@pytest.mark.parametrize("label", LABELS)
def test_only_the_head_node_may_write_the_rest_api_token(rendered, label):
    """The head node runs slurmrestd and renews the token into its secret (bootstrap/slurm-rest.sh); no other
    node's role, as ParallelCluster's builder renders them, may write it."""
    roles = {node: role["Properties"]["ManagedPolicyArns"] for node, role, _ in _node_roles(rendered[label])}
    assert [node for node, attached in roles.items() if REFS.rest_token_policy_arn in attached] == ["HeadNode"]


@pytest.mark.parametrize("label", LABELS)
def test_fsx_for_lustre_is_mounted_at_fsx_on_every_node(rendered, label):
    render = rendered[label]
    dnas = [head_node_dna(render)] + [launch_template_dna(template) for template, _ in queue_launch_templates(render).values()]
    if "LoginNodes" in render.config:
        dnas.append(launch_template_dna(_login_launch_template(render)[0]))
    for dna in dnas:
        assert (dna["fsx_fs_ids"], dna["fsx_fs_types"], dna["fsx_shared_dirs"]) == (
            REFS.file_system_id, "LUSTRE", FSX_MOUNT_DIR), dna["node_type"]
        assert dna["fsx_mount_names"] and dna["fsx_dns_names"].startswith(REFS.file_system_id), dna["node_type"]
        assert dna["ebs_shared_dirs"] == "/apps", dna["node_type"]


@pytest.mark.parametrize("label", LABELS)
def test_the_head_node_is_reachable_through_session_manager_only(rendered, label):
    resources_ = rendered[label].template["Resources"]
    data = resources_["HeadNodeLaunchTemplate"]["Properties"]["LaunchTemplateData"]
    assert "KeyName" not in data and data["MetadataOptions"]["HttpTokens"] == "required"
    (interface,) = data["NetworkInterfaces"]
    eni = resources_[interface["NetworkInterfaceId"]["Ref"]]["Properties"]
    assert eni["SubnetId"] == REFS.subnet_id and REFS.security_group_id in eni["GroupSet"]
    (managed,) = [group["Ref"] for group in eni["GroupSet"] if isinstance(group, dict)]
    # The agent reaches Session Manager outbound: the managed group keeps CloudFormation's allow-all egress.
    assert "SecurityGroupEgress" not in resources_[managed]["Properties"]
    assert [rule["CidrIp"] for rule in resources_[managed]["Properties"]["SecurityGroupIngress"]] == [
        SETTINGS[label].network.vpc_cidr]
    role = resources_[role_of(rendered[label].template, resources_["HeadNodeLaunchTemplate"])]
    assert SSM_POLICY_ARN in role["Properties"]["ManagedPolicyArns"]


@pytest.mark.parametrize("label", LABELS)
def test_our_slurm_settings_are_in_the_configuration_the_head_node_generates_slurm_conf_from(rendered, label):
    render, cluster = rendered[label], SETTINGS[label].cluster
    scheduling = _downloaded_config(render, head_node_dna(render))["Scheduling"]
    slurm = scheduling["SlurmSettings"]
    assert (slurm["ScaledownIdletime"], slurm["QueueUpdateStrategy"]) == (cluster.scaledown_idle_minutes, "DRAIN")
    queues = {queue["Name"]: queue for queue in scheduling["SlurmQueues"]}
    # The first queue is Slurm's default partition.
    assert scheduling["SlurmQueues"][0]["Name"] == PRESETS[cluster.presets[0]].queue_name
    for name in cluster.presets:
        assert bool(queues[PRESETS[name].queue_name]["HealthChecks"]["Gpu"]["Enabled"]) == cluster.gpu_health_checks
    if cluster.slurm_accounting.enabled:
        assert slurm["Database"]["Uri"] == cluster.slurm_accounting.uri
        head_role = role_of(render.template, render.template["Resources"]["HeadNodeLaunchTemplate"])
        assert any("secretsmanager:GetSecretValue" in str(statement["Action"]) and statement["Resource"] == SECRET_ARN
                   for statement in policies_of_role(render.template, head_role))
    else:
        assert slurm["Database"] is None


# --- limits a deploy would hit, and names we link to ------------------------------------------------------------

TEMPLATE_URL_MAX_BYTES = 1_000_000
"""CloudFormation: a template given by TemplateURL may hold at most 1 MB (nested stacks included)."""
RESOURCES_MAX = 500
USER_DATA_MAX_BYTES = 16 * 1024
"""EC2: user data at most 16 KB before base64."""
INTRINSIC_BYTES = 128
"""What one Ref or GetAtt inside user data may take once resolved (a stack ARN is about 100)."""


def _user_data_bytes(launch_template: dict) -> int:
    """The user data's size once Fn::Sub has substituted its variables, each intrinsic counted as INTRINSIC_BYTES."""
    script, variables = user_data(launch_template)
    for name, value in variables.items():
        text = joined(value) if isinstance(value, dict) else str(value)
        script = script.replace("${" + name + "}", re.sub(r"<[^<>]*>", "x" * INTRINSIC_BYTES, text))
    return len(re.sub(r"\$\{AWS::[A-Za-z]+\}", "x" * INTRINSIC_BYTES, script).encode())


@pytest.mark.parametrize("label", LABELS)
def test_the_stacks_fit_cloudformation_and_ec2_limits(rendered, label):
    render = rendered[label]
    for path in render.template_files():
        assert path.stat().st_size < TEMPLATE_URL_MAX_BYTES, path.name
    for template in [render.template, *render.nested]:
        assert len(template["Resources"]) <= RESOURCES_MAX
        for name, launch_template in resources(template, "AWS::EC2::LaunchTemplate").items():
            assert _user_data_bytes(launch_template) < USER_DATA_MAX_BYTES, name


def test_our_dashboard_links_to_parallelclusters_own(rendered, synth):
    (dashboard,) = resources(rendered["default"].template, "AWS::CloudWatch::Dashboard").values()
    theirs = joined(dashboard["Properties"]["DashboardName"]).replace("<Ref|AWS::Region>", SETTINGS["default"].region)
    ours = [joined(item["Properties"]["DashboardBody"]) for item in synth.json["cluster"]["Resources"].values()
            if item["Type"] == "AWS::CloudWatch::Dashboard"]
    links = {link for body in ours for link in re.findall(r"#dashboards:name=([^)\\]+)\)", body)}
    assert links == {theirs}, f"our dashboard links to {links}; ParallelCluster names its dashboard {theirs}"
