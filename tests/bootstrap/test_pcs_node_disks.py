"""bootstrap/pcs-node.sh on real block devices: file-backed loop devices stand for the instance-store NVMe
disks, and mkfs.ext4, mount, findmnt, lsblk and blkid are the machine's own. A node boots for the first
time on the Deep Learning AMI (a disk already formatted and mounted where the AMI mounts it), on an image
without that service (one blank disk, or several), on disks that hold something else; then reboots (mounts
gone, disks as they were) and stops and starts (disks blank), as the boot unit runs it. The boot unit and
slurmd's drop-in are checked by systemd-analyze.

Where the machine cannot do the real thing, a fake stands in, and says why: FSx for Lustre cannot be
reached (`mount -t lustre` binds a local directory instead), no systemd runs as PID 1 (systemctl records),
md arrays cannot be created on this kernel (mdadm builds its "array" as a loop device), the deploy bucket
is a directory, and the node bootstrap is a stub (tests/bootstrap/test_bootstrap.py runs the real one).
Needs root (loop devices, mkfs, mount); CI runs as root."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
PCS_NODE = REPO_ROOT / "bootstrap" / "pcs-node.sh"
DISK_BYTES = 8 * 1024 * 1024
"""Big enough for ext4, small enough to cost nothing."""
TOOLS = ("losetup", "mkfs.ext4", "wipefs", "blkid", "findmnt", "lsblk", "mount", "umount", "systemd-analyze")
SETTINGS = {"SCDINO_FSX_DNS": "fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com", "SCDINO_FSX_MOUNT_NAME": "abcdefgh",
            "SCDINO_REGION": "us-east-1", "SCDINO_BOOTSTRAP_URI": "s3://bucket/bootstrap/on-node-configured.sh",
            "SCDINO_POINTER_URI": "s3://bucket/bootstrap/current.json", "SCDINO_NODE_TYPE": "ComputeFleet"}
"""What the user data exports above the node script."""

FAKE_MOUNT = """#!/usr/bin/env bash
# FSx for Lustre cannot be reached from here: `mount -t lustre ... SOURCE TARGET` binds the file system's
# stand-in, $FAKE_LUSTRE_DIR, at TARGET instead. Every other mount is the real one.
if [[ "$1" == -t && "$2" == lustre ]]; then
  [[ -z "${FAKE_LUSTRE_HANGS:-}" ]] || exec sleep 600  # an FSx that never answers
  exec {mount} --bind "${FAKE_LUSTRE_DIR}" "${@: -1}"
fi
exec {mount} "$@"
"""
FAKE_SYSTEMCTL = """#!/usr/bin/env bash
# No systemd runs as PID 1 here: systemctl records what it is asked (the unit files themselves are checked
# with systemd-analyze), and no DLAMI service is at work.
echo "systemctl $*" >> "${FAKE_CALLS}"
[[ "$1" != is-active ]] || { echo inactive; exit 3; }
"""
FAKE_MDADM = """#!/usr/bin/env bash
# md arrays cannot be created on this kernel: --create ARRAY ... DISKS makes the "array" a loop device over
# $FAKE_MD_BACKING (the size of its disks together) and links ARRAY to it; --assemble ARRAY DISKS links it
# again when --create made it from those disks (a reboot), and fails otherwise (blank disks after a stop
# and start).
set -euo pipefail
echo "mdadm $*" >> "${FAKE_CALLS}"
action=$1 array=$2
shift 2
disks=()
for arg in "$@"; do [[ "${arg}" == -* ]] || disks+=("${arg}"); done
case "${action}" in
  --create)
    size=0
    for disk in "${disks[@]}"; do size=$((size + $(blockdev --getsize64 "${disk}"))); done
    rm -f "${FAKE_MD_BACKING}"
    truncate -s "${size}" "${FAKE_MD_BACKING}"
    echo "${disks[*]}" > "${FAKE_MD_MEMBERS}" ;;
  --assemble)
    [[ -s "${FAKE_MD_MEMBERS}" && "$(cat "${FAKE_MD_MEMBERS}")" == "${disks[*]}" ]] || exit 1 ;;
  *) exit 2 ;;
esac
ln -sfn "$(losetup --find --show "${FAKE_MD_BACKING}")" "${array}"
"""
FAKE_AWS = """#!/usr/bin/env bash
# The deploy bucket is a directory: `aws s3 cp --only-show-errors s3://BUCKET/KEY DEST`.
cp "${FAKE_S3_DIR}/${4#s3://*/}" "$5"
"""
STUB_BOOTSTRAP = """#!/usr/bin/env bash
# Stand-in for bootstrap/on-node-configured.sh POINTER INSTALL_DIR (tests/bootstrap/test_bootstrap.py runs the
# real one): the bundle, empty, where it is told; one line per install.
set -euo pipefail
mkdir -p "$2-stub"
ln -sfn "$(basename "$2")-stub" "$2"
echo "${SCDINO_NODE_TYPE}" >> "$(dirname "$2")/installs"
"""


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, check=check, timeout=60)


def _unmount_all_under(root: Path) -> None:
    """Every mount under `root`, deepest first (a reboot; the test's cleanup)."""
    targets = [line for line in _run("findmnt", "-rn", "-o", "TARGET").stdout.splitlines()
               if line == str(root) or line.startswith(f"{root}/")]
    for target in sorted(targets, key=len, reverse=True):
        if _run("umount", target, check=False).returncode != 0:
            _run("umount", "-l", target, check=False)


def _loop_devices_under(root: Path) -> list[str]:
    rows = _run("losetup", "-nl", "-O", "NAME,BACK-FILE").stdout.splitlines()
    return [name for name, _, back in (row.partition(" ") for row in rows) if back.strip().startswith(f"{root}/")]


class Node:
    """One node's root under tmp_path: its directories, disks and fakes, and the script run as user data
    or as the boot unit would run it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.fsx, self.apps, self.scratch = root / "fsx", root / "apps", root / "scratch"
        self.image_mount = root / "opt" / "dlami" / "nvme"
        self.lustre = root / "lustre"  # what FSx holds, across reboots
        self.systemd = root / "etc" / "systemd" / "system"
        self.calls, self.raid = root / "calls.log", root / "dev" / "md" / "scdino-scratch"
        self.disks: list[str] = []
        bin_dir, s3_dir = root / "bin", root / "s3"
        for path in (bin_dir, s3_dir / "bootstrap", self.lustre, self.raid.parent, root / "etc"):
            path.mkdir(parents=True)
        fakes = {"mount": FAKE_MOUNT.replace("{mount}", shutil.which("mount")), "systemctl": FAKE_SYSTEMCTL,
                 "mdadm": FAKE_MDADM, "aws": FAKE_AWS}
        for name, text in fakes.items():
            (bin_dir / name).write_text(text)
            (bin_dir / name).chmod(stat.S_IRWXU)
        (s3_dir / "bootstrap" / "on-node-configured.sh").write_text(STUB_BOOTSTRAP)
        self.overrides = {
            "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_CALLS": str(self.calls), "FAKE_S3_DIR": str(s3_dir),
            "FAKE_LUSTRE_DIR": str(self.lustre), "FAKE_MD_BACKING": str(root / "md-array.img"),
            "FAKE_MD_MEMBERS": str(root / "md-members"),
            "SCDINO_FSX_DIR": str(self.fsx), "SCDINO_APPS_DIR": str(self.apps), "SCDINO_SCRATCH_DIR": str(self.scratch),
            "SCDINO_FSTAB": str(root / "etc" / "fstab"), "SCDINO_PROFILE_DIR": str(root / "etc" / "profile.d"),
            "SCDINO_SYSTEMD_DIR": str(self.systemd), "SCDINO_NODE_ENV": str(root / "etc" / "scdino" / "pcs-node.env"),
            "SCDINO_NODE_SCRIPT_COPY": str(root / "opt" / "scdino" / "pcs-node.sh"),
            "SCDINO_BOOTSTRAP_COPY": str(root / "opt" / "scdino" / "on-node-configured.sh"),
            "SCDINO_SCRATCH_RAID": str(self.raid)}

    def disk(self, *, label: str | None = None) -> str:
        """A new instance-store disk: blank, or holding an ext4 file system with `label`."""
        image = self.root / f"disk{len(self.disks)}.img"
        with image.open("wb") as handle:
            handle.truncate(DISK_BYTES)
        device = _run("losetup", "--find", "--show", str(image)).stdout.strip()
        self.disks.append(device)
        if label is not None:
            _run("mkfs.ext4", "-F", "-q", "-L", label, device)
        return device

    def ami_mounts(self, device: str, *, fresh: bool = False) -> None:
        """What the Deep Learning AMI's dlami-nvme.service does at boot, before user data: the instance store
        as one volume at /opt/dlami/nvme, built anew on blank disks (`fresh`, after a stop and start). The
        AMI's volume is LVM, which cannot be activated on this kernel: here it is an ext4 file system on the
        disk itself, which the script finds the same way (a mount of the disk or of a volume built on it)."""
        if fresh:
            _run("mkfs.ext4", "-F", "-q", "-L", "dlami-nvme", device)
        self.image_mount.mkdir(parents=True, exist_ok=True)
        _run("mount", device, str(self.image_mount))

    def first_boot(self, **env: str) -> subprocess.CompletedProcess:
        return self._script([str(PCS_NODE)], {**os.environ, **SETTINGS, **self.overrides, **self._disks_env(), **env})

    def boot_unit(self) -> subprocess.CompletedProcess:
        """The installed unit run as systemd would at a later boot: its ExecStart, with its EnvironmentFile's
        settings and none of the user data's exports."""
        unit = self.unit_settings("scdino-node.service")
        settings = dict(line.split("=", 1) for line in Path(unit["EnvironmentFile"]).read_text().splitlines())
        base = {key: value for key, value in os.environ.items() if not key.startswith("SCDINO_")}
        return self._script(unit["ExecStart"].split(), {**base, **self.overrides, **self._disks_env(), **settings})

    def unit_settings(self, name: str) -> dict[str, str]:
        return dict(line.split("=", 1) for line in (self.systemd / name).read_text().splitlines()
                    if "=" in line and not line.startswith("#"))

    def reboot(self) -> None:
        """What a reboot leaves: no mounts, no assembled array; every file on the root volume, on FSx and on
        the disks still there."""
        _unmount_all_under(self.root)
        if self.raid.is_symlink():
            _run("losetup", "-d", os.readlink(self.raid))
            self.raid.unlink()

    def stop_and_start(self) -> None:
        """A reboot, and the instance store blank (EC2 erases it at a stop): the disks, and with them the array."""
        self.reboot()
        for device in self.disks:
            _run("wipefs", "-a", "-q", device)
        for path in (self.root / "md-array.img", self.root / "md-members"):
            path.unlink(missing_ok=True)

    def scratch_source(self) -> tuple[str, str]:
        """The device under /scratch and the folder of its file system that /scratch shows."""
        source, root = _run("findmnt", "-nv", "-o", "SOURCE,FSROOT", "--mountpoint", str(self.scratch)).stdout.split()
        return source, root

    def calls_of(self, program: str) -> list[str]:
        lines = self.calls.read_text().splitlines() if self.calls.exists() else []
        return [line for line in lines if line.startswith(f"{program} ")]

    def _disks_env(self) -> dict[str, str]:
        return {"SCDINO_INSTANCE_STORE_DISKS": " ".join(self.disks)}

    @staticmethod
    def _script(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", *command], env=env, capture_output=True, text=True, timeout=120, check=False)


def _uuid(device: str) -> str:
    return _run("blkid", "-p", "-o", "value", "-s", "UUID", device).stdout.strip()


def _mounted(path: Path) -> bool:
    return _run("mountpoint", "-q", str(path), check=False).returncode == 0


def _ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    return result.stdout


@pytest.fixture
def node(tmp_path: Path):
    """A node under tmp_path; every mount and loop device under it is gone afterwards, the test passed or not."""
    assert os.geteuid() == 0, "these tests need root (loop devices, mkfs, mount): run them as root, as CI does"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    assert not missing, f"missing {missing}: install util-linux, e2fsprogs and systemd (scripts/install-system-deps.sh)"
    try:
        yield Node(tmp_path)
    finally:
        _unmount_all_under(tmp_path)
        for device in _loop_devices_under(tmp_path):
            _run("losetup", "-d", device, check=False)


def test_on_the_deep_learning_ami_scratch_is_a_folder_of_the_mounted_instance_store_never_formatted(node):
    disk = node.disk(label="dlami-nvme")
    node.ami_mounts(disk)
    (node.image_mount / "ami-file").write_text("the AMI's own")
    uuid = _uuid(disk)

    out = _ok(node.first_boot())
    assert node.scratch_source() == (disk, "/scdino-scratch")
    assert "as the image mounted it: new and empty" in out
    assert stat.S_IMODE(node.scratch.stat().st_mode) == 0o1777
    (node.scratch / "staged.npy").write_text("a job's staged data")
    assert (node.image_mount / "scdino-scratch" / "staged.npy").is_file()
    assert _uuid(disk) == uuid and (node.image_mount / "ami-file").read_text() == "the AMI's own"
    assert not node.calls_of("mdadm")
    # FSx (its stand-in) at /fsx, /apps bound to its folder, the bundle installed there once.
    assert _mounted(node.fsx) and _mounted(node.apps) and (node.apps / "scdino").is_dir()
    assert (node.lustre / ".scdino" / "apps" / "installs").read_text() == "ComputeFleet\n"

    mounts = _run("findmnt", "-rn", "-o", "TARGET").stdout
    _ok(node.first_boot())  # a rerun mounts nothing twice
    assert _run("findmnt", "-rn", "-o", "TARGET").stdout == mounts

    installs = (node.lustre / ".scdino" / "apps" / "installs").read_text()
    node.reboot()
    node.ami_mounts(disk)  # the AMI's service runs before the boot unit (After=dlami-nvme.service)
    assert "its files kept" in _ok(node.boot_unit())
    assert node.scratch_source() == (disk, "/scdino-scratch") and (node.scratch / "staged.npy").is_file()
    assert (node.lustre / ".scdino" / "apps" / "installs").read_text() == installs  # no install at boot

    node.stop_and_start()
    node.ami_mounts(disk, fresh=True)
    uuid = _uuid(disk)
    assert "new and empty" in _ok(node.boot_unit())
    assert node.scratch_source() == (disk, "/scdino-scratch") and not any(node.scratch.iterdir())
    assert _uuid(disk) == uuid


def test_one_blank_disk_is_formatted_kept_across_a_reboot_and_new_after_a_stop_and_start(node):
    disk = node.disk()
    out = _ok(node.first_boot())
    assert "new and empty" in out and node.scratch_source() == (disk, "/")
    assert _run("blkid", "-p", "-o", "value", "-s", "LABEL", disk).stdout.strip() == "scdino-scratch"
    assert stat.S_IMODE(node.scratch.stat().st_mode) == 0o1777
    (node.scratch / "staged.npy").write_text("a job's staged data")
    uuid = _uuid(disk)

    node.reboot()
    assert "its files kept" in _ok(node.boot_unit())
    assert node.scratch_source() == (disk, "/") and _uuid(disk) == uuid
    assert (node.scratch / "staged.npy").read_text() == "a job's staged data"

    node.stop_and_start()
    assert "new and empty" in _ok(node.boot_unit())
    assert node.scratch_source() == (disk, "/") and _uuid(disk) != uuid
    assert not (node.scratch / "staged.npy").exists()


def test_several_blank_disks_become_one_array_assembled_again_after_a_reboot(node):
    first, second = node.disk(), node.disk()
    _ok(node.first_boot())
    assemble = f"mdadm --assemble {node.raid} {first} {second}"
    create = f"mdadm --create {node.raid} --run --level=0 --raid-devices=2 {first} {second}"
    assert node.calls_of("mdadm") == [assemble, create]  # blank disks assemble nothing, then make the array
    array = os.readlink(node.raid)
    assert node.scratch_source() == (array, "/")
    assert _run("blkid", "-p", "-o", "value", "-s", "LABEL", array).stdout.strip() == "scdino-scratch"
    (node.scratch / "staged.npy").write_text("a job's staged data")

    node.reboot()
    assert "its files kept" in _ok(node.boot_unit())
    assert node.calls_of("mdadm")[2:] == [assemble]  # no second --create
    assert (node.scratch / "staged.npy").is_file()

    node.stop_and_start()
    assert "new and empty" in _ok(node.boot_unit())
    assert node.calls_of("mdadm")[3:] == [assemble, create]
    assert not (node.scratch / "staged.npy").exists()


def test_disks_that_hold_something_else_are_left_alone_and_scratch_stays_on_the_root_volume(node):
    foreign, blank = node.disk(label="someone-else"), node.disk()
    uuid = _uuid(foreign)
    out = _ok(node.first_boot())
    assert f"left alone: {foreign} (ext4)" in out and "on the root volume" in out
    assert not _mounted(node.scratch) and stat.S_IMODE(node.scratch.stat().st_mode) == 0o1777
    assert _uuid(foreign) == uuid and _run("blkid", "-p", blank, check=False).returncode == 2  # neither formatted
    assert not [call for call in node.calls_of("mdadm") if "--create" in call]


def test_the_boot_unit_runs_before_slurmd_which_requires_it(node):
    _ok(node.first_boot())
    unit = node.unit_settings("scdino-node.service")
    assert unit["After"].split() == ["network-online.target", "dlami-nvme.service"]
    assert unit["Wants"] == "network-online.target" and unit["Before"] == "slurmd.service"
    assert unit["Type"] == "oneshot" and unit["WantedBy"] == "multi-user.target"
    assert int(unit["TimeoutStartSec"]) > 300  # past the Lustre mount's own limit
    assert unit["ExecStart"] == f"{node.overrides['SCDINO_NODE_SCRIPT_COPY']} --boot"
    assert node.calls_of("systemctl")[:2] == ["systemctl daemon-reload", "systemctl enable scdino-node.service"]
    dropin = node.unit_settings("slurmd.service.d/scdino-node.conf")
    assert dropin["Requires"] == "scdino-node.service" and dropin["After"] == "scdino-node.service"
    # PCS's Slurm installs the real slurmd.service; this stand-in lets systemd-analyze load the drop-in,
    # which fails to verify unless the unit it requires is there and well formed.
    (node.systemd / "slurmd.service").write_text("[Service]\nExecStart=/bin/true\n")
    env = {**os.environ, "SYSTEMD_UNIT_PATH": f"{node.systemd}:"}
    for name in ("scdino-node.service", "slurmd.service"):
        verified = subprocess.run(["systemd-analyze", "verify", str(node.systemd / name)], env=env,
                                  capture_output=True, text=True, timeout=60, check=False)
        assert verified.returncode == 0 and not verified.stderr, (name, verified.stderr)
    fstab = (node.root / "etc" / "fstab").read_text().split()
    options = fstab[3].split(",")
    for option in ("_netdev", "nofail", "flock", "x-systemd.automount",
                   "x-systemd.requires=systemd-networkd-wait-online.service", "x-systemd.mount-timeout=300"):
        assert option in options, option
    assert not [option for option in options if "network.service" in option]  # absent on AL2023 and Ubuntu 22.04


def test_a_node_whose_bundle_is_gone_fails_its_boot_unit_so_slurmd_stays_stopped(node):
    node.disk()
    _ok(node.first_boot())
    shutil.rmtree(node.lustre / ".scdino" / "apps")
    node.reboot()
    result = node.boot_unit()
    assert result.returncode == 1 and f"{node.apps}/scdino is missing" in result.stdout
    assert "slurmd stays stopped" in result.stdout and not _mounted(node.scratch)


def test_a_lustre_mount_that_hangs_fails_the_boot_within_its_timeout(node):
    _ok(node.first_boot())
    node.reboot()
    node.overrides["FAKE_LUSTRE_HANGS"] = "1"
    node.overrides["SCDINO_FSX_MOUNT_TIMEOUT_S"] = "2"
    result = node.boot_unit()
    assert result.returncode == 1 and "did not mount" in result.stdout and "within 2 s" in result.stdout
    assert not _mounted(node.fsx) and not _mounted(node.apps)
