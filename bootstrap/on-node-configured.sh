#!/usr/bin/env bash
# ParallelCluster OnNodeConfigured (every node) and OnNodeUpdated (head node) action, and on AWS PCS
# nodes the last step of bootstrap/pcs-node.sh (the launch template's user data): install the scDINO
# bundle the pointer names onto the shared /apps (ParallelCluster's head node volume; on PCS, a
# directory of the FSx file system bound to /apps) and switch /apps/scdino to it.
#
#   on-node-configured.sh s3://<deploy bucket>/bootstrap/current.json [/apps/scdino [bundle-id]]
#
# The pointer, {"bundle": "s3://.../bundles/<id>.zip", "id": "<id>"}, is rewritten by every
# `cdk deploy`; the arguments never change (ParallelCluster refuses a change of the head node's
# OnNodeConfigured), except the bundle id the head node's OnNodeUpdated gets, which only makes a
# new bundle a configuration update and is logged.
#
# The bundle is unpacked into <install dir>-<id>/, whose .venv links to /opt/scdino-venv:
# - on nodes booted from the pipeline's image, the environment built there (ami/scripts/20-python-env.sh)
#   when its recorded requirements are the bundle's;
# - otherwise a link to one environment per requirements set on FSx, built once from the bundle's
#   pinned requirements by the first node that needs it (the official AMI's head node, at creation).
# One lock serialises installs; waits are bounded well below ParallelCluster's node bootstrap timeout.
# <install dir> switches only to a bundle whose pointer is at least as new as the active one's, so a
# slow node never flips it back. This node's /opt/scdino-venv then follows the active bundle's requirements
# (a slow node's older pointer included); jobs do not depend on it: slurm/env.sh takes, on every node, an
# environment built from their own bundle's requirements (this node's, the image's set aside, or FSx's).
# Pruning, at the end of every run and under the same lock, keeps the active bundle, the previous one and
# every bundle a job that has not ended names in its comment ("scdino-bundle:<folder>": slurm/env.sh's
# mark, which submit_pipeline.sh gives each job at submission and slurm/lib.sh gives a job submitted by
# hand when it starts), asked from Slurm with squeue; it removes the other bundles, then the environments
# on FSx that no kept bundle's requirements name. When Slurm cannot be asked (no squeue, or squeue fails,
# e.g. on a node whose Slurm is not configured yet), it removes nothing and says so in the log.
# Beside the bundle it switches to, <install dir>/cluster.env holds the cluster's shape (each enabled
# preset's partition, GPUs per node and vCPUs per GPU, the default first), which slurm/env.sh reads:
# cluster-env.py, from beside the pointer, renders it from the pointer's "cluster" entry. On the shared
# /apps, so that one run (the head node's OnNodeUpdated after a change of presets, or any PCS node's
# first boot) reaches every node, and under the same rule as the bundle: a slower node's older pointer
# never overwrites it.
# On GPU compute nodes it also sets up monitoring, from the pointer's "monitoring" names and the
# agent template beside it (cloudwatch-agent.json): the CloudWatch agent's NVIDIA GPU metrics, the
# kernel's NVIDIA Xid lines and the training's embedded-metric-format lines (appended to the agent's
# configuration; rerunning replaces it), and /etc/scdino/monitoring.env, which slurm/env.sh sources
# so that rank 0 writes those lines (training/metrics.py). A failure there is logged, never fatal.
# It also makes /fsx/data/work (mode 1777), where each user makes a folder to submit from: jobs write
# their logs under the folder they are submitted from, which the root-owned /apps/scdino is not for them.
# On the head node, when the pointer has a "rest" entry (ParallelCluster), slurm-rest.sh from beside the pointer
# runs the Slurm REST API for the laptop's remote commands (python -m training remote); a failure there is
# logged, never fatal.
# Logs: /var/log/scdino-bootstrap.log, and stdout (ParallelCluster's cloud-init / cfn-init logs, PCS's
# cloud-init output).
set -euo pipefail

readonly LOG_FILE=${SCDINO_BOOTSTRAP_LOG:-/var/log/scdino-bootstrap.log}
readonly IMAGE_VENV=${SCDINO_IMAGE_VENV:-/opt/scdino-venv}
readonly SHARED_VENVS=${SCDINO_SHARED_VENVS:-/fsx/.scdino/venvs}
readonly SCRATCH_DIR=/scratch
readonly PYTHON_VERSION=3.11
readonly CLUSTER_CONFIG=${SCDINO_CLUSTER_CONFIG:-/etc/parallelcluster/cfnconfig}
readonly CWAGENT_CTL=${SCDINO_CWAGENT_CTL:-/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl}
readonly CWAGENT_CONFIG=${SCDINO_CWAGENT_CONFIG:-/opt/aws/amazon-cloudwatch-agent/etc/scdino-monitoring.json}
readonly MONITORING_ENV=${SCDINO_MONITORING_ENV:-/etc/scdino/monitoring.env}
readonly EMF_DIR=${SCDINO_EMF_DIR:-/var/log/scdino}
readonly WORK_DIR=${SCDINO_WORK_DIR:-/fsx/data/work}
readonly LOCK_WAIT_SECONDS=1500
readonly REQUIREMENT_FILES=(requirements.txt requirements-dali.txt)
readonly CLUSTER_ENV=cluster.env
readonly CLUSTER_ENV_RENDERER=cluster-env.py
# A job's comment names the bundle it runs with this mark (slurm/env.sh's SCDINO_BUNDLE_MARK).
readonly BUNDLE_MARK=scdino-bundle:
# Where squeue is when it is not on PATH: ParallelCluster's Slurm, then PCS's (one folder per release).
readonly SQUEUE_PLACES=(/opt/slurm/bin/squeue /opt/aws/pcs/scheduler/slurm-*/bin/squeue)
readonly SQUEUE_TIMEOUT_SECONDS=60
# Job states after which a job runs nothing any more (squeue's JOB STATE CODES); any other state, an
# unknown one included, holds the job's bundle.
readonly ENDED_STATES=" BOOT_FAIL CANCELLED COMPLETED DEADLINE FAILED NODE_FAIL OUT_OF_MEMORY PREEMPTED REVOKED TIMEOUT "

exec > >(tee -a "${LOG_FILE}") 2>&1

log() { echo "[scdino-bootstrap $(date -u +%FT%TZ)] $*"; }
die() { log "ERROR: $*"; exit 1; }
trap 'die "command failed (line ${LINENO}): ${BASH_COMMAND}"' ERR

node_type() {
  # PCS nodes are told by their user data (SCDINO_NODE_TYPE); ParallelCluster writes it on every node
  # (cfn_node_type=HeadNode|ComputeFleet|LoginNode).
  if [[ -n "${SCDINO_NODE_TYPE:-}" ]]; then
    echo "${SCDINO_NODE_TYPE}"
  elif [[ -r "${CLUSTER_CONFIG}" ]]; then
    sed -n 's/^cfn_node_type=//p' "${CLUSTER_CONFIG}"
  else
    echo "unknown"
  fi
}

read_pointer() {
  # Prints "<epoch of the pointer object> <bundle uri> <bundle id> <GPU metrics namespace> <training
  # metrics namespace> <log group>" from one GET (no race with a deploy); "-" for a name it lacks.
  local pointer_uri=$1 file=$2 path bucket key modified
  path=${pointer_uri#s3://}
  bucket=${path%%/*}
  key=${path#*/}
  modified=$(aws s3api get-object --bucket "${bucket}" --key "${key}" "${file}" --query LastModified --output text)
  python3 - "${file}" "$(date -u -d "${modified}" +%s)" <<'PY'
import json, sys
pointer = json.load(open(sys.argv[1]))
names = pointer.get("monitoring", {})
print(sys.argv[2], pointer["bundle"], pointer["id"],
      *(names.get(key) or "-" for key in ("gpu_namespace", "training_namespace", "log_group")))
PY
}

install_python() {
  command -v "python${PYTHON_VERSION}" >/dev/null && return 0
  log "installing python${PYTHON_VERSION}"
  if command -v dnf >/dev/null; then
    dnf install -y -q "python${PYTHON_VERSION}" "python${PYTHON_VERSION}-pip"
  elif command -v apt-get >/dev/null; then
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "python${PYTHON_VERSION}" "python${PYTHON_VERSION}-venv"
  else
    die "neither dnf nor apt-get found: cannot install python${PYTHON_VERSION}"
  fi
  command -v "python${PYTHON_VERSION}" >/dev/null || die "python${PYTHON_VERSION} still missing after install"
}

requirements_id() {
  # One id per set of pinned requirement files (missing files count as empty).
  local dir=$1 name
  for name in "${REQUIREMENT_FILES[@]}"; do
    cat "${dir}/${name}" 2>/dev/null || true
  done | sha256sum | cut -c1-16
}

link_environment() {
  # Make ${IMAGE_VENV} on this node the environment for the bundle in $1.
  local version_dir=$1 wanted shared
  wanted=$(requirements_id "${version_dir}")
  if [[ -L "${IMAGE_VENV}" && -d "${IMAGE_VENV}.image" \
        && "$(requirements_id "${IMAGE_VENV}.image/scdino-requirements")" == "${wanted}" ]]; then
    log "the bundle's requirements are the image's again: restoring ${IMAGE_VENV}"
    rm "${IMAGE_VENV}"
    mv "${IMAGE_VENV}.image" "${IMAGE_VENV}"
  fi
  if [[ -d "${IMAGE_VENV}" && ! -L "${IMAGE_VENV}" ]]; then
    if [[ "$(requirements_id "${IMAGE_VENV}/scdino-requirements")" == "${wanted}" ]]; then
      log "using the image's environment ${IMAGE_VENV}"
      return 0
    fi
    log "the image's environment was built from other requirements: moving it to ${IMAGE_VENV}.image"
    rm -rf "${IMAGE_VENV}.image"
    mv "${IMAGE_VENV}" "${IMAGE_VENV}.image"
  fi
  shared="${SHARED_VENVS}/${wanted}"
  install_python  # the shared environment's interpreter is this node's python3.11
  if [[ ! -f "${shared}/.ready" ]]; then
    log "creating ${shared} from the bundle's pinned requirements (CUDA torch wheels: several minutes)"
    rm -rf "${shared}"
    mkdir -p "${SHARED_VENVS}"
    "python${PYTHON_VERSION}" -m venv "${shared}"
    local requirements=() name
    for name in "${REQUIREMENT_FILES[@]}"; do
      [[ -f "${version_dir}/${name}" ]] && requirements+=(-r "${version_dir}/${name}")
    done
    "${shared}/bin/pip" install --disable-pip-version-check --no-input -q "${requirements[@]}"
    touch "${shared}/.ready"
  fi
  ln -sfn "${shared}" "${IMAGE_VENV}"
  log "${IMAGE_VENV} -> ${shared}"
}

add_to_path() {
  # The active bundle is importable from the environment without PYTHONPATH (interactive use).
  local site_packages
  site_packages=$("${IMAGE_VENV}/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$1" > "${site_packages}/scdino-bundle.pth"
}

unpack_bundle() {
  # Unpack into a fresh directory; only a complete one gets the .ready marker.
  local bundle_uri=$1 version_dir=$2
  rm -rf "${version_dir}"
  mkdir -p "${version_dir}"
  log "downloading ${bundle_uri}"
  aws s3 cp --only-show-errors "${bundle_uri}" "${version_dir}/bundle.zip"
  (cd "${version_dir}" && python3 -m zipfile -e bundle.zip . && rm bundle.zip)
  [[ -f "${version_dir}/requirements.txt" ]] || die "bundle has no requirements.txt: wrong archive?"
  ln -sfn "${IMAGE_VENV}" "${version_dir}/.venv"
  echo "${bundle_uri}" > "${version_dir}/.ready"
}

write_cluster_env() {
  # The pointer's cluster shape as <bundle>/cluster.env (see the top); a pointer without one is an older deploy's.
  local pointer_uri=$1 pointer=$2 version_dir=$3 renderer status=0
  renderer=$(mktemp)
  aws s3 cp --only-show-errors "${pointer_uri%/*}/${CLUSTER_ENV_RENDERER}" "${renderer}"
  python3 "${renderer}" "${pointer}" "${version_dir}/${CLUSTER_ENV}" || status=$?
  rm -f "${renderer}"
  case "${status}" in
    0) log "cluster shape in ${version_dir}/${CLUSTER_ENV}: $(grep -v '^#' "${version_dir}/${CLUSTER_ENV}" | tr '\n' ' ')" ;;
    3) log "the pointer has no cluster shape (an older deploy): slurm/env.sh keeps its defaults" ;;
    *) die "could not write ${version_dir}/${CLUSTER_ENV} from the pointer (see above)" ;;
  esac
}

activate() {
  # Switch <install dir> to $2, with the cluster's shape of pointer $5 (from $4) beside it, unless a newer
  # pointer's bundle is already active. The bundle it replaces becomes <install dir>.previous; a run that
  # activates the active bundle again (every node that boots on the same pointer) leaves that link alone.
  local install_dir=$1 version_dir=$2 stamp=$3 pointer_uri=$4 pointer=$5 active_stamp=0 active=""
  [[ -f "${install_dir}.stamp" ]] && active_stamp=$(cat "${install_dir}.stamp")
  if ((stamp < active_stamp)); then
    log "keeping ${install_dir} -> $(readlink "${install_dir}"): its pointer (${active_stamp}) is newer than ours (${stamp})"
    return 0
  fi
  write_cluster_env "${pointer_uri}" "${pointer}" "${version_dir}"
  [[ -L "${install_dir}" ]] && active=$(readlink "${install_dir}")
  if [[ -n "${active}" && "${active}" != "${version_dir}" ]]; then
    ln -sfn "${active}" "${install_dir}.previous"
  fi
  ln -sfn "${version_dir}" "${install_dir}.next"
  mv -T "${install_dir}.next" "${install_dir}"
  echo "${stamp}" > "${install_dir}.stamp"
  log "${install_dir} -> ${version_dir}"
}

squeue_command() {
  # The path of squeue: on PATH, else where ParallelCluster or PCS installs Slurm.
  local place
  command -v squeue && return 0
  for place in "${SQUEUE_PLACES[@]}"; do
    [[ -x "${place}" ]] && { echo "${place}"; return 0; }
  done
  return 1
}

bundles_in_use() {
  # "<bundle folder> <job id>", one a line, for each job that has not ended and whose comment carries the
  # bundle mark, the folder as readlink -m writes it. Fails, saying why on stderr, when Slurm cannot be asked.
  local squeue listing paths=() ids=() path id i
  squeue=$(squeue_command) || { log "no squeue on PATH nor in ${SQUEUE_PLACES[*]}" >&2; return 1; }
  listing=$(timeout "${SQUEUE_TIMEOUT_SECONDS}" "${squeue}" --noheader --all --states=all --format='%i %T %k') \
    || { log "${squeue} failed (exit $?)" >&2; return 1; }
  while read -r path id; do
    paths+=("${path}")
    ids+=("${id}")
  done < <(awk -v ended="${ENDED_STATES}" -v mark="${BUNDLE_MARK}" '
    index(ended, " " $2 " ") { next }
    { for (i = 3; i <= NF; i++) if (index($i, mark) == 1) print substr($i, length(mark) + 1), $1 }' <<< "${listing}")
  ((${#paths[@]})) || return 0
  mapfile -t paths < <(readlink -m "${paths[@]}")
  for i in "${!paths[@]}"; do
    echo "${paths[i]} ${ids[i]}"
  done
}

prune() {
  # Remove the bundles of <install dir> that are neither active nor previous nor named by a job that has not
  # ended, then the shared environments on FSx that no kept bundle's requirements name (see the top).
  local install_dir=$1 in_use keep dir real jobs kept=() wanted=" "
  if ! in_use=$(bundles_in_use); then
    log "Slurm could not be asked which bundles its jobs use (see above): no bundle or environment removed"
    return 0
  fi
  keep=" $(readlink -f "${install_dir}") "
  [[ -L "${install_dir}.previous" ]] && keep+="$(readlink -f "${install_dir}.previous") "
  for dir in "${install_dir}"-*/; do
    dir=${dir%/}
    [[ -d "${dir}" ]] || continue
    real=$(readlink -f "${dir}")
    jobs=$(awk -v dir="${real}" '$1 == dir { printf " %s", $2 }' <<< "${in_use}")
    if [[ "${keep}" == *" ${real} "* ]]; then
      kept+=("${dir}")
    elif [[ -n "${jobs}" ]]; then
      log "keeping ${dir}: job(s)${jobs} use it"
      kept+=("${dir}")
    else
      log "removing old bundle ${dir}"
      rm -rf "${dir}"
    fi
  done
  for dir in "${kept[@]}"; do
    wanted+="$(requirements_id "${dir}") "
  done
  for dir in "${SHARED_VENVS}"/*/; do
    dir=${dir%/}
    [[ -d "${dir}" && "${wanted}" != *" ${dir##*/} "* ]] || continue
    log "removing the shared environment ${dir}: no kept bundle has its requirements"
    rm -rf "${dir}"
  done
}

render_agent_config() {
  # The template with the cluster's names in place of its @NAME@ values.
  python3 - "$1" "$2" "$3" "$4" "$5" <<'PY'
import json, sys
template, target, gpu_namespace, log_group, emf_log = sys.argv[1:]
values = {"@GPU_NAMESPACE@": gpu_namespace, "@LOG_GROUP@": log_group, "@EMF_LOG@": emf_log}

def fill(node):
    if isinstance(node, dict):
        return {key: fill(value) for key, value in node.items()}
    if isinstance(node, list):
        return [fill(value) for value in node]
    return values.get(node, node)

config = fill(json.load(open(template)))
assert "@" not in json.dumps(config).replace("${aws:", ""), "unfilled placeholder in the agent template"
json.dump(config, open(target, "w"), indent=2)
PY
}

configure_monitoring() {
  # GPU compute nodes: the agent's GPU metrics, Xid lines and the training's EMF lines (see the top).
  local pointer_uri=$1 gpu_namespace=$2 training_namespace=$3 log_group=$4 template
  [[ "$(node_type)" == ComputeFleet ]] || return 0
  command -v nvidia-smi >/dev/null || { log "no nvidia-smi: no GPU monitoring on this node"; return 0; }
  [[ "${log_group}" != - ]] || { log "the pointer names no monitoring log group (an older deploy)"; return 0; }
  mkdir -p "${EMF_DIR}" "$(dirname "${CWAGENT_CONFIG}")" "$(dirname "${MONITORING_ENV}")" || return 1
  chmod 1777 "${EMF_DIR}" || return 1  # rank 0 runs as the job's user
  # Called as a condition (errexit is off there): every step checks its own result.
  template=$(mktemp) || return 1
  aws s3 cp --only-show-errors "${pointer_uri%/*}/cloudwatch-agent.json" "${template}" || return 1
  render_agent_config "${template}" "${CWAGENT_CONFIG}" "${gpu_namespace}" "${log_group}" "${EMF_DIR}/emf.log" \
    || return 1
  rm -f "${template}"
  printf 'export SCDINO_EMF_LOG=%q\nexport SCDINO_EMF_NAMESPACE=%q\n' "${EMF_DIR}/emf.log" "${training_namespace}" \
    > "${MONITORING_ENV}.tmp" && mv "${MONITORING_ENV}.tmp" "${MONITORING_ENV}" || return 1
  if [[ -x "${CWAGENT_CTL}" ]]; then
    "${CWAGENT_CTL}" -a append-config -m ec2 -s -c "file:${CWAGENT_CONFIG}" || return 1
    log "CloudWatch agent: GPU metrics in ${gpu_namespace}, Xid and training metrics to ${log_group}"
  else
    log "WARNING: no CloudWatch agent at ${CWAGENT_CTL}: GPU metrics are not collected"
  fi
}

start_rest_api() {
  # Head node, when the pointer has a "rest" entry (ParallelCluster): slurmrestd with JWT auth and the token's
  # renewal for the laptop's remote commands (slurm-rest.sh, beside the pointer). Called as a condition:
  # a failure is logged, and the cluster works without it.
  local pointer_uri=$1 pointer=$2 script status=0
  [[ "$(node_type)" == HeadNode ]] || return 0
  python3 -c 'import json, sys; sys.exit("rest" not in json.load(open(sys.argv[1])))' "${pointer}" || return 0
  script=$(mktemp) || return 1
  aws s3 cp --only-show-errors "${pointer_uri%/*}/slurm-rest.sh" "${script}" || return 1
  bash "${script}" install "${pointer}" || status=$?
  rm -f "${script}"
  return "${status}"
}

prepare_work_dir() {
  # Where people run from: on FSx, so every node sees a job's logs, under data/, so results reach S3.
  # The bundle's directory belongs to root; here each user makes a folder of their own (sticky, as /tmp).
  mkdir -p "${WORK_DIR}" && chmod 1777 "${WORK_DIR}"
}

prepare_scratch() {
  # Local NVMe scratch (ParallelCluster mounts it on compute nodes): writable by every job user.
  if [[ -d "${SCRATCH_DIR}" ]]; then
    chmod 1777 "${SCRATCH_DIR}"
  fi
}

main() {
  [[ $# -ge 1 && $# -le 3 ]] || die "usage: $0 s3://bucket/bootstrap/current.json [install-dir [bundle-id]]"
  local pointer_uri=$1 install_dir=${2:-/apps/scdino} expected_id=${3:-} pointer stamp bundle_uri bundle_id active_dir
  local gpu_namespace training_namespace log_group
  [[ "${pointer_uri}" == s3://*/*.json ]] || die "the pointer must be an s3://...json URI, got '${pointer_uri}'"
  log "node type $(node_type); pointer ${pointer_uri}; install dir ${install_dir}"
  mkdir -p "$(dirname "${install_dir}")"
  pointer=$(mktemp)
  read -r stamp bundle_uri bundle_id gpu_namespace training_namespace log_group \
    < <(read_pointer "${pointer_uri}" "${pointer}")
  [[ "${bundle_uri}" == s3://*.zip && -n "${bundle_id}" ]] || die "pointer names no s3://...zip bundle: '${bundle_uri}'"
  if [[ -n "${expected_id}" && "${expected_id}" != "${bundle_id}" ]]; then
    log "note: configuration names bundle ${expected_id}, the pointer ${bundle_id} (a later deploy); installing the pointer's"
  fi
  local version_dir="${install_dir}-${bundle_id}"
  exec 9>"${install_dir}.lock"
  flock -w "${LOCK_WAIT_SECONDS}" 9 || die "timed out after ${LOCK_WAIT_SECONDS}s waiting for another node's install (${install_dir}.lock)"
  if [[ -f "${version_dir}/.ready" ]]; then
    log "bundle ${bundle_id} already installed in ${version_dir}"
  else
    unpack_bundle "${bundle_uri}" "${version_dir}"
  fi
  link_environment "${version_dir}"
  (cd / && PYTHONPATH="${version_dir}" "${IMAGE_VENV}/bin/python" -c "import training") \
    || die "the training package does not import with ${IMAGE_VENV}"
  activate "${install_dir}" "${version_dir}" "${stamp}" "${pointer_uri}" "${pointer}"
  active_dir=$(readlink -f "${install_dir}")
  if [[ "${active_dir}" != "$(readlink -f "${version_dir}")" ]]; then
    log "this node's environment follows the active bundle ${active_dir}"
    link_environment "${active_dir}"
  fi
  add_to_path "${install_dir}"
  prune "${install_dir}"
  flock -u 9
  if ! start_rest_api "${pointer_uri}" "${pointer}"; then
    log "WARNING: the Slurm REST API was not set up (see above): python -m training remote cannot reach this cluster"
  fi
  rm -f "${pointer}"
  prepare_scratch
  prepare_work_dir || log "WARNING: could not make ${WORK_DIR} (see above): users need a folder of their own on /fsx"
  if ! configure_monitoring "${pointer_uri}" "${gpu_namespace}" "${training_namespace}" "${log_group}"; then
    log "WARNING: monitoring was not set up (see above); the node works without it"
  fi
  log "done"
}

main "$@"
