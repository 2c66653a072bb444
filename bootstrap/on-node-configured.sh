#!/usr/bin/env bash
# ParallelCluster OnNodeConfigured (and head node OnNodeUpdated) action: install the scDINO bundle
# and its Python environment on the shared /apps volume.
#
#   on-node-configured.sh s3://bucket/<bundle-hash>.zip [/apps/scdino]
#
# The bundle is unpacked into <install dir>-<bundle-hash>/ with its virtualenv in .venv, and
# <install dir> is a symlink to it, switched atomically. The first node to run (the head node at
# cluster creation) builds it under a lock; every other node finds it ready and only installs the
# system Python the virtualenv points to. Re-runs are no-ops. Any failure exits non-zero with a
# message, so ParallelCluster fails the node instead of leaving it half-configured.
# Logs: /var/log/scdino-bootstrap.log, and stdout (ParallelCluster's cfn-init / cloud-init logs).
set -euo pipefail

readonly LOG_FILE=${SCDINO_BOOTSTRAP_LOG:-/var/log/scdino-bootstrap.log}
readonly PYTHON_VERSION=3.11
readonly CLUSTER_CONFIG=/etc/parallelcluster/cfnconfig
readonly LOCK_WAIT_SECONDS=3600

exec > >(tee -a "${LOG_FILE}") 2>&1

log() { echo "[scdino-bootstrap $(date -u +%FT%TZ)] $*"; }
die() { log "ERROR: $*"; exit 1; }
trap 'die "command failed (line ${LINENO}): ${BASH_COMMAND}"' ERR

node_type() {
  # Written by ParallelCluster on every node: cfn_node_type=HeadNode|ComputeFleet|LoginNode.
  if [[ -r "${CLUSTER_CONFIG}" ]]; then
    sed -n 's/^cfn_node_type=//p' "${CLUSTER_CONFIG}"
  else
    echo "unknown"
  fi
}

install_python() {
  if command -v "python${PYTHON_VERSION}" >/dev/null; then
    return 0
  fi
  log "installing python${PYTHON_VERSION}"
  if command -v dnf >/dev/null; then
    dnf install -y -q "python${PYTHON_VERSION}" "python${PYTHON_VERSION}-pip"
  elif command -v apt-get >/dev/null; then
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q software-properties-common
    add-apt-repository -y ppa:deadsnakes/ppa
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "python${PYTHON_VERSION}" "python${PYTHON_VERSION}-venv"
  else
    die "neither dnf nor apt-get found: cannot install python${PYTHON_VERSION}"
  fi
  command -v "python${PYTHON_VERSION}" >/dev/null || die "python${PYTHON_VERSION} still missing after install"
}

build_version() {
  # Unpack and install into a fresh directory; only a complete build gets the .ready marker.
  local bundle_uri=$1 version_dir=$2
  rm -rf "${version_dir}"
  mkdir -p "${version_dir}"
  log "downloading ${bundle_uri}"
  aws s3 cp --only-show-errors "${bundle_uri}" "${version_dir}/bundle.zip"
  (cd "${version_dir}" && "python${PYTHON_VERSION}" -m zipfile -e bundle.zip . && rm bundle.zip)
  [[ -f "${version_dir}/requirements.txt" ]] || die "bundle has no requirements.txt: wrong archive?"
  log "creating ${version_dir}/.venv (CUDA torch wheels: several minutes)"
  "python${PYTHON_VERSION}" -m venv "${version_dir}/.venv"
  local pip=("${version_dir}/.venv/bin/pip" install --disable-pip-version-check --no-input -q)
  "${pip[@]}" --upgrade pip
  "${pip[@]}" -r "${version_dir}/requirements.txt"
  # The bundle itself goes on the venv's path with a .pth file: no build step, and the code
  # the Slurm scripts run is exactly the unpacked bundle.
  local site_packages
  site_packages=$("${version_dir}/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "${version_dir}" > "${site_packages}/scdino-bundle.pth"
  "${version_dir}/.venv/bin/python" -c "import training" || die "the training package does not import"
  echo "${bundle_uri}" > "${version_dir}/.ready"
}

install_bundle() {
  local bundle_uri=$1 install_dir=$2 version version_dir
  version=$(basename "${bundle_uri}" .zip)
  version_dir="${install_dir}-${version}"
  mkdir -p "$(dirname "${install_dir}")"
  exec 9>"${install_dir}.lock"
  flock -w "${LOCK_WAIT_SECONDS}" 9 || die "timed out waiting for another node's install (${install_dir}.lock)"
  if [[ -f "${version_dir}/.ready" ]]; then
    log "bundle ${version} already installed in ${version_dir}"
  else
    build_version "${bundle_uri}" "${version_dir}"
  fi
  ln -sfn "${version_dir}" "${install_dir}.next"
  mv -T "${install_dir}.next" "${install_dir}"
  flock -u 9
  log "${install_dir} -> ${version_dir}"
}

prepare_scratch() {
  # Local NVMe scratch (ParallelCluster mounts it on compute nodes): writable by every job user.
  if [[ -d /scratch ]]; then
    chmod 1777 /scratch
  fi
}

main() {
  [[ $# -ge 1 && $# -le 2 ]] || die "usage: $0 s3://bucket/bundle.zip [install-dir]"
  local bundle_uri=$1 install_dir=${2:-/apps/scdino}
  [[ "${bundle_uri}" == s3://*.zip ]] || die "bundle must be an s3://...zip URI, got '${bundle_uri}'"
  log "node type $(node_type); bundle ${bundle_uri}; install dir ${install_dir}"
  install_python
  install_bundle "${bundle_uri}" "${install_dir}"
  prepare_scratch
  log "done"
}

main "$@"
