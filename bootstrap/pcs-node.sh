#!/usr/bin/env bash
# AWS PCS node preparation (backend=pcs): the launch template's user data runs it (stacks/pcs_stack.py)
# after the node registers with PCS and before slurmd starts. It gives a PCS node what ParallelCluster
# gives its nodes, then runs the same node bootstrap as they do:
#   - FSx for Lustre at /fsx, with flock (the bootstrap's install lock lives on it);
#   - /apps on the file system (/fsx/.scdino/apps bound to /apps): PCS has no head node to export an
#     /apps volume, so the bundle is installed once there and every node sees /apps/scdino;
#   - the instance-store NVMe at /scratch (RAID 0 over several devices), as ParallelCluster mounts it;
#   - AWS_DEFAULT_REGION in every login shell and job (the AWS CLI, the bill), which ParallelCluster's
#     node facts provide there;
#   - bootstrap/on-node-configured.sh from the deploy bucket, told its node type (ComputeFleet or
#     LoginNode), since no /etc/parallelcluster/cfnconfig says it on a PCS node.
# User data runs once per instance, and mounts do not outlive a reboot: so the first run also installs
# scdino-node.service, which runs this script again with --boot at every later boot, before slurmd, to
# mount FSx, bind /apps and mount /scratch again (the bundle on FSx and the root volume's files are
# still there). /scratch keeps its files across a reboot; after a stop and start the instance store is
# blank, and --boot builds a new, empty /scratch.
#
#   pcs-node.sh           first boot (user data): everything above, then the boot unit and the bootstrap
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
readonly SETTINGS=(SCDINO_FSX_DNS SCDINO_FSX_MOUNT_NAME SCDINO_REGION SCDINO_BOOTSTRAP_URI SCDINO_POINTER_URI
  SCDINO_NODE_TYPE)
readonly SCRATCH_RAID=/dev/md/scdino-scratch
readonly SCRATCH_LABEL=scdino-scratch

log() { echo "[scdino-pcs-node $(date -u +%FT%TZ)] $*"; }
trap 'log "ERROR: command failed (line ${LINENO}): ${BASH_COMMAND}"' ERR

mount_fsx() {
  local source="${SCDINO_FSX_DNS}@tcp:/${SCDINO_FSX_MOUNT_NAME}"
  mkdir -p "${FSX_DIR}"
  if ! grep -qs "^${source} ${FSX_DIR} lustre " "${FSTAB}"; then
    echo "${source} ${FSX_DIR} lustre defaults,relatime,flock,_netdev,x-systemd.automount,x-systemd.requires=network.service 0 0" \
      >> "${FSTAB}"
  fi
  if ! mountpoint -q "${FSX_DIR}"; then
    mount -t lustre -o relatime,flock "${source}" "${FSX_DIR}"
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

instance_store_disks() {
  # NVMe instance-store devices (EBS volumes report another model).
  lsblk -dnpo NAME,MODEL | awk '/Instance Storage/ {print $1}'
}

existing_scratch() {
  # The scratch file system an earlier boot made, when the disks still hold it (after a reboot; not after
  # a stop and start, which blanks the instance store): found by its label, assembling the array first
  # when the kernel has not.
  local found
  if found=$(blkid -L "${SCRATCH_LABEL}" 2>/dev/null); then
    echo "${found}"
  elif (($# > 1)) && mdadm --assemble "${SCRATCH_RAID}" "$@" >/dev/null 2>&1; then
    blkid -L "${SCRATCH_LABEL}" 2>/dev/null || true
  fi
}

mount_scratch() {
  local disks device
  mapfile -t disks < <(instance_store_disks)
  if ((${#disks[@]} == 0)); then
    log "no instance-store NVMe: no ${SCRATCH_DIR}"
    return 0
  fi
  if mountpoint -q "${SCRATCH_DIR}"; then
    return 0
  fi
  mkdir -p "${SCRATCH_DIR}"
  device=$(existing_scratch "${disks[@]}")
  if [[ -n "${device}" ]]; then
    mount "${device}" "${SCRATCH_DIR}"
    log "${SCRATCH_DIR} on ${device} again, its files kept"
  else
    device=${disks[0]}
    if ((${#disks[@]} > 1)); then
      device=${SCRATCH_RAID}
      [[ -e "${device}" ]] || mdadm --create "${device}" --run --level=0 --raid-devices="${#disks[@]}" "${disks[@]}"
    fi
    mkfs.ext4 -F -q -L "${SCRATCH_LABEL}" "${device}"
    mount "${device}" "${SCRATCH_DIR}"
    log "${SCRATCH_DIR} on ${#disks[@]} NVMe device(s): ${device}, new and empty"
  fi
  chmod 1777 "${SCRATCH_DIR}"
}

install_boot_unit() {
  # This script, its settings and a unit that runs it with --boot at every later boot, before slurmd.
  local name
  mkdir -p "$(dirname "${NODE_SCRIPT_COPY}")" "$(dirname "${NODE_ENV}")" "${SYSTEMD_DIR}"
  install -m 0755 "${BASH_SOURCE[0]}" "${NODE_SCRIPT_COPY}"
  for name in "${SETTINGS[@]}"; do
    printf '%s=%s\n' "${name}" "${!name}"
  done > "${NODE_ENV}"
  cat > "${SYSTEMD_DIR}/${BOOT_UNIT}" <<UNIT
[Unit]
Description=scDINO node mounts: FSx for Lustre, /apps, /scratch (bootstrap/pcs-node.sh --boot)
Wants=network-online.target
After=network-online.target
Before=slurmd.service

[Service]
Type=oneshot
RemainAfterExit=yes
EnvironmentFile=${NODE_ENV}
ExecStart=${NODE_SCRIPT_COPY} --boot

[Install]
WantedBy=multi-user.target
UNIT
  if command -v systemctl >/dev/null; then
    systemctl daemon-reload
    systemctl enable "${BOOT_UNIT}"
    log "${BOOT_UNIT} enabled: FSx, ${APPS_DIR} and ${SCRATCH_DIR} come back at every boot"
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
      mount_fsx
      bind_apps
      mount_scratch
      install_boot_unit
      run_bootstrap
      ;;
    --boot)
      mount_fsx
      bind_apps
      mount_scratch
      ;;
    *) log "ERROR: usage: $0 [--boot], got '$1'"; exit 2 ;;
  esac
  log "done${1:+ ($1)}"
}

main "$@"
