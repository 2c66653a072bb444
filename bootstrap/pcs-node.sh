#!/usr/bin/env bash
# AWS PCS node preparation (backend=pcs): the launch template's user data runs it (stacks/pcs/stack.py)
# after the node registers with PCS and before slurmd starts. It gives a PCS node what ParallelCluster
# gives its nodes, then runs the same node bootstrap as they do:
#   - FSx for Lustre at /fsx, with flock (the bootstrap's install lock lives on it);
#   - /apps on the file system (/fsx/.scdino/apps bound to /apps): PCS has no head node to export an
#     /apps volume, so the bundle is installed once there and every node sees /apps/scdino;
#   - /scratch on the instance-store NVMe. The PCS image is AWS's Deep Learning Base AMI, whose
#     dlami-nvme.service gathers those disks into one LVM volume mounted at /opt/dlami/nvme at every boot,
#     before user data (the DLAMI release notes' nvme_location): /scratch is then a bind mount of a folder
#     on it, wherever the image mounted it. The service stays on: it knows each instance type's disks and
#     rebuilds the volume after a stop and start. Only blank disks (no signature, nothing built on them)
#     are formatted here, as ParallelCluster does (RAID 0 over several); a disk in use is never touched;
#   - AWS_DEFAULT_REGION in every login shell and job (the AWS CLI, the bill), which ParallelCluster's
#     node facts provide there;
#   - bootstrap/on-node-configured.sh from the deploy bucket, told its node type (ComputeFleet or
#     LoginNode), since no /etc/parallelcluster/cfnconfig says it on a PCS node.
# User data runs once per instance, and mounts do not outlive a reboot: so the first run installs
# scdino-node.service, which runs this script again with --boot at every later boot, and a drop-in that
# makes slurmd.service require it: slurmd starts only once FSx, /apps (with the bundle) and /scratch are
# there, and not at all when they fail or time out. /scratch keeps its files across a reboot; after a
# stop and start the instance store is blank, and /scratch is new and empty.
#
#   pcs-node.sh           first boot (user data): everything above, then the bootstrap
#   pcs-node.sh --boot    every later boot (scdino-node.service): FSx, /apps and /scratch only
#
# The user data exports SCDINO_FSX_DNS, SCDINO_FSX_MOUNT_NAME, SCDINO_REGION, SCDINO_BOOTSTRAP_URI,
# SCDINO_POINTER_URI and SCDINO_NODE_TYPE above this script; the boot unit reads them from the file the
# first run writes. Rerunning either mode changes nothing.
# Logs: stdout (first boot: cloud-init's /var/log/cloud-init-output.log; later: journalctl -u
# scdino-node) and the bootstrap's own log.
set -euo pipefail

: "${SCDINO_FSX_DNS:?}" "${SCDINO_FSX_MOUNT_NAME:?}" "${SCDINO_REGION:?}" "${SCDINO_BOOTSTRAP_URI:?}"
: "${SCDINO_POINTER_URI:?}" "${SCDINO_NODE_TYPE:?}"
# The places it writes; moved only by tests.
readonly FSX_DIR=${SCDINO_FSX_DIR:-/fsx}
readonly APPS_DIR=${SCDINO_APPS_DIR:-/apps}
readonly SCRATCH_DIR=${SCDINO_SCRATCH_DIR:-/scratch}
readonly FSTAB=${SCDINO_FSTAB:-/etc/fstab}
readonly PROFILE_DIR=${SCDINO_PROFILE_DIR:-/etc/profile.d}
readonly BOOTSTRAP_COPY=${SCDINO_BOOTSTRAP_COPY:-/opt/scdino/on-node-configured.sh}
readonly NODE_SCRIPT_COPY=${SCDINO_NODE_SCRIPT_COPY:-/opt/scdino/pcs-node.sh}
readonly NODE_ENV=${SCDINO_NODE_ENV:-/etc/scdino/pcs-node.env}
readonly SYSTEMD_DIR=${SCDINO_SYSTEMD_DIR:-/etc/systemd/system}
readonly BOOT_UNIT=scdino-node.service
# Makes slurmd.service require the boot unit (a drop-in leaves PCS's own unit as it is).
readonly SLURMD_DROPIN=slurmd.service.d/scdino-node.conf
readonly SETTINGS=(SCDINO_FSX_DNS SCDINO_FSX_MOUNT_NAME SCDINO_REGION SCDINO_BOOTSTRAP_URI SCDINO_POINTER_URI
  SCDINO_NODE_TYPE)
# Where several blank disks are assembled; moved only by tests (the kernel there cannot run md arrays).
readonly SCRATCH_RAID=${SCDINO_SCRATCH_RAID:-/dev/md/scdino-scratch}
readonly SCRATCH_LABEL=scdino-scratch
# The folder /scratch binds to on an instance store that the image mounted.
readonly SCRATCH_FOLDER=scdino-scratch
readonly IMAGE_NVME_UNIT=dlami-nvme.service
# A Lustre mount that hangs gives up after this, on the first boot and at every later one; moved only by tests.
readonly FSX_MOUNT_TIMEOUT_S=${SCDINO_FSX_MOUNT_TIMEOUT_S:-300}
# The boot unit's limit: the FSx mount, the DLAMI's service if it is still at work, mkfs on the disks.
readonly BOOT_TIMEOUT_S=900

log() { echo "[scdino-pcs-node $(date -u +%FT%TZ)] $*"; }
fail() { log "ERROR: $*"; exit 1; }
trap 'log "ERROR: command failed (line ${LINENO}): ${BASH_COMMAND}"' ERR

mount_fsx() {
  local source="${SCDINO_FSX_DNS}@tcp:/${SCDINO_FSX_MOUNT_NAME}"
  mkdir -p "${FSX_DIR}"
  if ! grep -qs "^${source} ${FSX_DIR} lustre " "${FSTAB}"; then
    # The FSx for Lustre User Guide's line (Mounting your file system automatically), with what it says
    # for Amazon Linux 2023 and Ubuntu 22.04: systemd-networkd-wait-online.service, as they have no
    # network.service. nofail and a timeout: the node boots, and can be reached, without FSx; slurmd's
    # dependency on the boot unit is what keeps jobs off it.
    echo "${source} ${FSX_DIR} lustre defaults,relatime,flock,_netdev,nofail,x-systemd.automount,x-systemd.requires=systemd-networkd-wait-online.service,x-systemd.mount-timeout=${FSX_MOUNT_TIMEOUT_S} 0 0" \
      >> "${FSTAB}"
  fi
  if ! mountpoint -q "${FSX_DIR}"; then
    timeout --kill-after=10 "${FSX_MOUNT_TIMEOUT_S}" mount -t lustre -o relatime,flock "${source}" "${FSX_DIR}" \
      || fail "FSx for Lustre ${source} did not mount at ${FSX_DIR} within ${FSX_MOUNT_TIMEOUT_S} s: check the file system and its security group (TCP 988)"
  fi
  log "FSx for Lustre ${source} at ${FSX_DIR}"
}

bind_apps() {
  local shared="${FSX_DIR}/.scdino/apps"
  mkdir -p "${shared}" "${APPS_DIR}"
  if ! mountpoint -q "${APPS_DIR}"; then
    mount --bind "${shared}" "${APPS_DIR}"
  fi
  log "${APPS_DIR} is ${shared}"
}

check_bundle() {
  # Every slurm/ script starts from the bundle: a node without it must not take jobs.
  [[ -e "${APPS_DIR}/scdino" ]] || fail "${APPS_DIR}/scdino is missing (the first boot's bootstrap did not install" \
    "it on ${FSX_DIR}): slurmd stays stopped; install it as docs/deploy.md says (code updates), then start slurmd"
}

instance_store_disks() {
  # NVMe instance-store devices (EBS volumes report another model). Tests list theirs in
  # SCDINO_INSTANCE_STORE_DISKS instead: loop devices have no model.
  if [[ -n "${SCDINO_INSTANCE_STORE_DISKS+set}" ]]; then
    local listed
    read -ra listed <<< "${SCDINO_INSTANCE_STORE_DISKS}"
    ((${#listed[@]} == 0)) || printf '%s\n' "${listed[@]}"
    return 0
  fi
  lsblk -dnpo NAME,MODEL | awk '/Instance Storage/ {print $1}'
}

wait_for_image_service() {
  # The DLAMI's service runs before user data and before the boot unit (After=): should it still be at
  # work, wait, so that no disk is taken from under it.
  local waited=0
  command -v systemctl >/dev/null || return 0
  while [[ "$(systemctl is-active "${IMAGE_NVME_UNIT}" 2>/dev/null)" == activating ]] && ((waited < 300)); do
    sleep 5
    waited=$((waited + 5))
  done
}

image_mount() {
  # Where the image mounted the instance store: the root of a file system on one of the disks, or on a
  # volume or array built on them (the DLAMI's LVM volume at /opt/dlami/nvme).
  local disk device target root
  for disk in "$@"; do
    while read -r device; do
      while read -r target root; do
        if [[ "${root}" == / && "${target}" != "${SCRATCH_DIR}" ]]; then
          echo "${target}"
          return 0
        fi
      done < <(findmnt -rn -o TARGET,FSROOT -S "${device}")
    done < <(lsblk -nrpo NAME "${disk}")
  done
}

existing_scratch() {
  # The scratch file system an earlier boot made, when the disks still hold it (after a reboot; not after
  # a stop and start, which blanks the instance store): on a disk, on the array the kernel assembled from
  # them, or on the one mdadm assembles now.
  local disk device
  for disk in "$@"; do
    while read -r device; do
      if [[ "$(blkid -p -o value -s LABEL "${device}")" == "${SCRATCH_LABEL}" ]]; then
        echo "${device}"
        return 0
      fi
    done < <(lsblk -nrpo NAME "${disk}")
  done
  if (($# > 1)) && mdadm --assemble "${SCRATCH_RAID}" "$@" >/dev/null 2>&1 \
    && [[ "$(blkid -p -o value -s LABEL "${SCRATCH_RAID}")" == "${SCRATCH_LABEL}" ]]; then
    echo "${SCRATCH_RAID}"
  fi
}

disks_in_use() {
  # Each disk that is not blank, and why: what is built on it (partitions, a volume, an array), or the
  # signature on it (a file system, LVM2_member, linux_raid_member). These are never formatted.
  local disk built signature
  for disk in "$@"; do
    built=$(lsblk -nrpo NAME "${disk}" | tail -n +2 | paste -sd ' ' -)
    signature=$(blkid -p -o value -s TYPE "${disk}" || true)
    if [[ -n "${built}" ]]; then
      echo "${disk} (holds ${built})"
    elif [[ -n "${signature}" ]]; then
      echo "${disk} (${signature})"
    fi
  done
}

bind_image_scratch() {
  local folder="$1/${SCRATCH_FOLDER}" state="its files kept"
  if [[ ! -d "${folder}" ]]; then
    mkdir -p "${folder}"
    state="new and empty"
  fi
  chmod 1777 "${folder}"
  mount --bind "${folder}" "${SCRATCH_DIR}"
  log "${SCRATCH_DIR} is ${folder}, on the instance store as the image mounted it: ${state}"
}

format_scratch() {
  # Blank disks only: one is formatted as it is, several as one RAID 0 array (as ParallelCluster does).
  local device=$1
  if (($# > 1)); then
    command -v mdadm >/dev/null || fail "mdadm is missing: cannot assemble $# instance-store disks into ${SCRATCH_DIR}"
    device=${SCRATCH_RAID}
    mdadm --create "${device}" --run --level=0 --raid-devices="$#" "$@"
  fi
  mkfs.ext4 -F -q -L "${SCRATCH_LABEL}" "${device}"
  mount "${device}" "${SCRATCH_DIR}"
  log "${SCRATCH_DIR} on $# NVMe device(s): ${device}, new and empty"
}

mount_scratch() {
  local disks image device busy
  mapfile -t disks < <(instance_store_disks)
  if ((${#disks[@]} == 0)); then
    log "no instance-store NVMe: no ${SCRATCH_DIR}"
    return 0
  fi
  if mountpoint -q "${SCRATCH_DIR}"; then
    return 0
  fi
  mkdir -p "${SCRATCH_DIR}"
  wait_for_image_service
  if image=$(image_mount "${disks[@]}") && [[ -n "${image}" ]]; then
    bind_image_scratch "${image}"
  elif device=$(existing_scratch "${disks[@]}") && [[ -n "${device}" ]]; then
    mount "${device}" "${SCRATCH_DIR}"
    log "${SCRATCH_DIR} on ${device} again, its files kept"
  elif busy=$(disks_in_use "${disks[@]}") && [[ -n "${busy}" ]]; then
    log "WARNING: instance-store disks in use and not ours, left alone: $(paste -sd ';' - <<< "${busy}")." \
      "${SCRATCH_DIR} is a directory on the root volume"
  else
    format_scratch "${disks[@]}"
  fi
  chmod 1777 "${SCRATCH_DIR}"
}

install_boot_unit() {
  # This script, its settings, a unit that runs it with --boot at every later boot, and slurmd's
  # dependency on that unit. Requires= and After= rather than a check in slurmd's ExecStartPre: systemd
  # then runs the mounts first however slurmd is started (by PCS, by hand), and refuses to start it when
  # they fail or pass TimeoutStartSec, saying so in `systemctl status slurmd`.
  local name
  mkdir -p "$(dirname "${NODE_SCRIPT_COPY}")" "$(dirname "${NODE_ENV}")" \
    "$(dirname "${SYSTEMD_DIR}/${SLURMD_DROPIN}")"
  install -m 0755 "${BASH_SOURCE[0]}" "${NODE_SCRIPT_COPY}"
  for name in "${SETTINGS[@]}"; do
    printf '%s=%s\n' "${name}" "${!name}"
  done > "${NODE_ENV}"
  cat > "${SYSTEMD_DIR}/${BOOT_UNIT}" <<UNIT
[Unit]
Description=scDINO node mounts: FSx for Lustre, /apps, /scratch (bootstrap/pcs-node.sh --boot)
Wants=network-online.target
After=network-online.target ${IMAGE_NVME_UNIT}
Before=slurmd.service

[Service]
Type=oneshot
RemainAfterExit=yes
TimeoutStartSec=${BOOT_TIMEOUT_S}
EnvironmentFile=${NODE_ENV}
ExecStart=${NODE_SCRIPT_COPY} --boot

[Install]
WantedBy=multi-user.target
UNIT
  cat > "${SYSTEMD_DIR}/${SLURMD_DROPIN}" <<DROPIN
# bootstrap/pcs-node.sh: slurmd takes jobs only on a node whose FSx, /apps and /scratch are there.
[Unit]
Requires=${BOOT_UNIT}
After=${BOOT_UNIT}
DROPIN
  if command -v systemctl >/dev/null; then
    systemctl daemon-reload
    systemctl enable "${BOOT_UNIT}"
    log "${BOOT_UNIT} enabled: FSx, ${APPS_DIR} and ${SCRATCH_DIR} come back at every boot, before slurmd"
  else
    log "WARNING: no systemctl: ${APPS_DIR} and ${SCRATCH_DIR} will not come back after a reboot"
  fi
}

set_region() {
  mkdir -p "${PROFILE_DIR}"
  printf 'export AWS_DEFAULT_REGION=%q\n' "${SCDINO_REGION}" > "${PROFILE_DIR}/scdino-region.sh"
  export AWS_DEFAULT_REGION="${SCDINO_REGION}"
}

run_bootstrap() {
  mkdir -p "$(dirname "${BOOTSTRAP_COPY}")"
  aws s3 cp --only-show-errors "${SCDINO_BOOTSTRAP_URI}" "${BOOTSTRAP_COPY}"
  log "running the node bootstrap as ${SCDINO_NODE_TYPE}"
  SCDINO_NODE_TYPE="${SCDINO_NODE_TYPE}" bash "${BOOTSTRAP_COPY}" "${SCDINO_POINTER_URI}" "${APPS_DIR}/scdino"
}

main() {
  [[ "${SCDINO_NODE_TYPE}" == ComputeFleet || "${SCDINO_NODE_TYPE}" == LoginNode ]] \
    || { log "ERROR: SCDINO_NODE_TYPE must be ComputeFleet or LoginNode, got '${SCDINO_NODE_TYPE}'"; exit 1; }
  case "${1:-}" in
    "")
      set_region
      install_boot_unit
      mount_fsx
      bind_apps
      mount_scratch
      run_bootstrap
      ;;
    --boot)
      mount_fsx
      bind_apps
      check_bundle
      mount_scratch
      ;;
    *) log "ERROR: usage: $0 [--boot], got '$1'"; exit 2 ;;
  esac
  log "done${1:+ ($1)}"
}

main "$@"
