"""Settings: defaults work, overrides are typed, and every wrong value names its setting."""

from __future__ import annotations

import pytest

from stacks.shared.settings import Settings, SettingsError, build_settings, load_settings_file, setting_keys


def test_defaults_build_a_small_cluster():
    settings = build_settings()
    assert settings == Settings()
    assert settings.cluster.presets == ("g4dn.12xlarge",)
    assert (settings.cluster.min_nodes, settings.cluster.max_nodes) == (0, 2)
    assert settings.storage.retain is True


def test_context_strings_are_coerced_and_later_layers_win():
    settings = build_settings(
        {"cluster": {"max_nodes": 8, "presets": ["p4d.24xlarge"]}},
        {"cluster.max_nodes": "4", "storage.retain": "false", "cluster.presets": "g4dn.12xlarge, p5.48xlarge"})
    assert settings.cluster.max_nodes == 4
    assert settings.storage.retain is False
    assert settings.cluster.presets == ("g4dn.12xlarge", "p5.48xlarge")


def test_settings_file_layer(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("region: eu-west-1\nnetwork:\n  availability_zone: eu-west-1b\ncluster:\n  min_nodes: 1\n")
    settings = build_settings(load_settings_file(str(path)))
    assert (settings.region, settings.network.availability_zone, settings.cluster.min_nodes) == (
        "eu-west-1", "eu-west-1b", 1)


@pytest.mark.parametrize("layer, named", [
    ({"cluster.max_nodes": "many"}, "setting cluster.max_nodes: expected an integer"),
    ({"cluster.min_nodes": 3}, "setting cluster.max_nodes: must be >= 1 and >= cluster.min_nodes (3)"),
    ({"cluster.presets": "g5.48xlarge"}, "setting cluster.presets: unknown preset 'g5.48xlarge'"),
    ({"cluster.presets": ""}, "setting cluster.presets: choose at least one"),
    ({"cluster.name": "My_Cluster"}, "setting cluster.name: must start with a letter"),
    ({"cluster.custom_ami": "ami-12"}, "setting cluster.custom_ami:"),
    ({"storage.fsx_capacity_gib": 2000}, "setting storage.fsx_capacity_gib: PERSISTENT_2 takes 1200"),
    ({"storage.fsx_throughput_per_tib": 200}, "setting storage.fsx_throughput_per_tib: must be one of"),
    ({"storage.retain": "maybe"}, "setting storage.retain: expected true or false"),
    ({"storage.data_prefix": "data/raw"}, "setting storage.data_prefix:"),
    ({"network.availability_zone": "eu-west-1a"}, "setting network.availability_zone: 'eu-west-1a' is not in"),
    ({"network.vpc_cidr": "10.0.0.0/8"}, "setting network.vpc_cidr: prefix length"),
    ({"image.os": "alinux2"}, "setting image.os: must be one of"),
    ({"region": "mars"}, "setting region:"),
    ({"cluster.name": "storage"}, "setting cluster.name: ParallelCluster names its own stack after the cluster (scdino-storage)"),
    ({"image.os": "rocky9"}, "setting image.os: rocky9 cannot work: ParallelCluster publishes no official rocky9 AMI"),
    ({"image.os": "ubuntu2404"}, "setting image.os: ubuntu2404 cannot work: its archive has no python3.11"),
    ({"storage.noncurrent_version_days": 0}, "setting storage.noncurrent_version_days: must be 1..3650"),
    ({"cluster.max_nodez": 3}, "setting cluster.max_nodez: unknown setting"),
    ({"cluster.alarm_email": "ops at example.org"}, "setting cluster.alarm_email: expected empty or an e-mail"),
])
def test_wrong_values_name_the_setting(layer, named):
    with pytest.raises(SettingsError) as error:
        build_settings(layer)
    message = str(error.value)
    assert message.startswith(named), message
    assert "\n" not in message


def test_missing_or_bad_settings_file(tmp_path):
    with pytest.raises(SettingsError, match="setting settings: file .* does not exist"):
        load_settings_file(str(tmp_path / "none.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(SettingsError, match="mapping at the top level"):
        load_settings_file(str(bad))


def test_every_key_is_documented_in_settings_dataclasses():
    keys = setting_keys()
    assert "cluster.presets" in keys and "storage.retain" in keys and len(keys) == len(set(keys))


PCS = {"backend": "pcs"}
SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:db-AbCdEf"


@pytest.mark.parametrize("layer, named", [
    ({"backend": "pbs"}, "setting backend: must be one of ('parallelcluster', 'pcs') (e.g. -c backend=pcs), got 'pbs'"),
    ({**PCS, "cluster.pcs_size": "TINY"}, "setting cluster.pcs_size: must be one of ('SMALL', 'MEDIUM', 'LARGE')"),
    ({**PCS, "cluster.name": "n" * 34}, "setting cluster.name: the cluster name 'scdino-nnnn"),
    ({**PCS, "cluster.slurm_accounting.uri": "db.example.internal:3306", "cluster.slurm_accounting.user_name": "slurm",
      "cluster.slurm_accounting.password_secret_arn": SECRET},
     "setting cluster.slurm_accounting: PCS runs its own accounting database"),
    ({**PCS, "cluster.gpu_health_checks": "true"}, "setting cluster.gpu_health_checks: ParallelCluster's DCGM check"),
    ({**PCS, "image.os": "rhel9"}, "setting image.os: the PCS image starts from AWS's Deep Learning Base GPU AMI"),
    ({**PCS, "cluster.presets": "g4dn.12xlarge,p5.48xlarge", "cluster.max_nodes": 16},
     "setting cluster.pcs_size: SMALL manages up to 32 instances, the node groups may run 33"),
    ({"cluster.capacity_type": "SPOT", "cluster.capacity_reservation_id": "cr-0123456789abcdef0"},
     "setting cluster.capacity_reservation_id: Spot instances cannot run in a capacity reservation"),
    ({**PCS, "cluster.pcs_size": "MEDIUM", "cluster.name": "n" * 27},
     "setting cluster.name: the cluster name 'scdino-nnnnnnnnnnnnnnnnnnnnnnnnnnn-medium' (prefix-name, then the size"),
    ({"image.pcs_slurm_version": "23.11"}, "setting image.pcs_slurm_version: must be one of PCS's Slurm releases"),
    ({"cluster.scaledown_idle_minutes_per_queue": "g4dn.12xlarge=5"},
     "setting cluster.scaledown_idle_minutes_per_queue: ParallelCluster stops idle nodes after one time"),
    ({**PCS, "cluster.scaledown_idle_minutes_per_queue": "p5.48xlarge=5"},
     "setting cluster.scaledown_idle_minutes_per_queue: 'p5.48xlarge=5' names no queue of this cluster"),
    ({**PCS, "cluster.scaledown_idle_minutes_per_queue": "g4dn.12xlarge=0"},
     "setting cluster.scaledown_idle_minutes_per_queue: 'g4dn.12xlarge=0': MINUTES must be a whole number >= 1"),
    ({**PCS, "cluster.scaledown_idle_minutes_per_queue": "g4dn.12xlarge=5,gpu-g4dn12xl=6"},
     "setting cluster.scaledown_idle_minutes_per_queue: names queue gpu-g4dn12xl twice"),
    ({**PCS, "cluster.scaledown_idle_minutes_per_queue": "g4dn.12xlarge=5", "image.pcs_slurm_version": "25.05"},
     "setting cluster.scaledown_idle_minutes_per_queue: PCS node groups take their own idle time from Slurm 25.11"),
    ({**PCS, "cluster.login_node_instance_type": "x9abcdefghijklmnop.48xlarge"},
     "setting cluster.login_node_instance_type: the PCS node group name 'login-x9abcdefghijklmnop48xl' it gives is longer"),
])
def test_what_a_back_end_cannot_do_is_refused_naming_the_setting_and_the_fix(layer, named):
    with pytest.raises(SettingsError) as error:
        build_settings(layer)
    assert str(error.value).startswith(named), str(error.value)


def test_pcs_names_carry_what_cannot_change_in_place_and_keep_the_defaults_names():
    """Size (the cluster) and instance type (login and cpu-spot groups) are create-only in PCS: the name follows
    them, so the replacement a deploy creates never meets the old resource's name; the defaults keep the names
    deployments had before."""
    default = build_settings(PCS)
    assert (default.pcs_cluster_name, default.pcs_login_group, default.pcs_cpu_spot_group) == ("scdino-hpc", "login", "")
    other = build_settings({**PCS, "cluster.pcs_size": "LARGE", "cluster.login_node_instance_type": "c6i.2xlarge",
                            "cluster.cpu_spot_instance_type": "c6i.8xlarge"})
    assert (other.pcs_cluster_name, other.pcs_login_group, other.pcs_cpu_spot_group) == (
        "scdino-hpc-large", "login-c6i2xl", "cpu-spot-c6i8xl")
    assert build_settings({**PCS, "cluster.scaledown_idle_minutes_per_queue": "g4dn.12xlarge=3"}).cluster \
        .idle_minutes_by_queue == {"gpu-g4dn12xl": 3}


def test_pcs_boots_the_pipeline_image_has_a_login_node_and_its_own_ami_parameter():
    pcs = build_settings(PCS)
    assert (pcs.node_ami, pcs.pcs_login_nodes, pcs.ami_parameter) == ("ssm", 1, "/scdino/ami/gpu-pcs")
    assert build_settings({**PCS, "cluster.custom_ami": "ami-0123456789abcdef0"}).node_ami == "ami-0123456789abcdef0"
    default = build_settings()
    assert (default.backend, default.node_ami, default.ami_parameter) == ("parallelcluster", "", "/scdino/ami/gpu")
    assert build_settings({**PCS, "cluster.presets": "g4dn.12xlarge,p5.48xlarge", "cluster.max_nodes": 16,
                           "cluster.pcs_size": "MEDIUM"}).pcs_instances_max == 33
