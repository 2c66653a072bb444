#!/usr/bin/env bash
# The PCS image only (build pcs.amazon-ebs.pcs): what an AWS PCS node needs on top of AWS's Deep
# Learning Base GPU AMI.
# - The Lustre client: bootstrap/pcs-node.sh mounts FSx for Lustre at /fsx.
# - The CloudWatch agent: bootstrap/on-node-configured.sh gives it the GPU metrics and log lines.
# - The AWS PCS agent and PCS's Slurm ${PCS_SLURM_VERSION}, from AWS's installers. Each tarball's
#   detached GPG signature is checked against the AWS PCS packaging key, itself checked against its
#   published fingerprint, in a keyring holding nothing else, before its installer runs.
# - Slurm's commands on every login shell's PATH (slurm/ calls sbatch, srun and scontrol).
set -euo pipefail

: "${AWS_REGION:?}" "${PCS_SLURM_VERSION:?}" "${PCS_AGENT_INSTALLER:?}" "${PCS_SLURM_INSTALLER:?}"
readonly REPO="https://aws-pcs-repo-${AWS_REGION}.s3.${AWS_REGION}.amazonaws.com"
readonly KEY_URL="https://aws-pcs-repo-public-keys-${AWS_REGION}.s3.${AWS_REGION}.amazonaws.com/aws-pcs-public-key.pub"
# The fingerprint the AWS PCS User Guide publishes for its packaging key (7EEF030EDDF5C21C).
readonly KEY_FINGERPRINT="1C2432C1862F64D1F90A239A7EEF030EDDF5C21C"
readonly SLURM_HOME="/opt/aws/pcs/scheduler/slurm-${PCS_SLURM_VERSION}"
readonly CWAGENT_CTL=/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl

die() { echo "$*" >&2; exit 1; }

install_lustre_client() {
  command -v mount.lustre >/dev/null && return 0
  if command -v dnf >/dev/null; then
    dnf install -y -q lustre-client
  else
    # FSx's own repository, for the running kernel (AWS FSx for Lustre User Guide, Ubuntu 22.04).
    curl -fsSL https://fsx-lustre-client-repo-public-keys.s3.amazonaws.com/fsx-ubuntu-public-key.asc \
      | gpg --dearmor > /usr/share/keyrings/fsx-ubuntu-public-key.gpg
    echo "deb [signed-by=/usr/share/keyrings/fsx-ubuntu-public-key.gpg] https://fsx-lustre-client-repo.s3.amazonaws.com/ubuntu jammy main" \
      > /etc/apt/sources.list.d/fsxlustreclientrepo.list
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "lustre-client-modules-$(uname -r)"
  fi
  command -v mount.lustre >/dev/null || die "mount.lustre missing after installing the Lustre client"
}

install_cloudwatch_agent() {
  [[ -x "${CWAGENT_CTL}" ]] && return 0
  if command -v dnf >/dev/null; then
    dnf install -y -q amazon-cloudwatch-agent
  else
    local deb
    deb=$(mktemp --suffix=.deb)
    curl -fsSL -o "${deb}" https://amazoncloudwatch-agent.s3.amazonaws.com/ubuntu/amd64/latest/amazon-cloudwatch-agent.deb
    dpkg -i "${deb}"
    rm -f "${deb}"
  fi
  [[ -x "${CWAGENT_CTL}" ]] || die "${CWAGENT_CTL} missing after installing the CloudWatch agent"
}

trust_pcs_key() {
  # A keyring of the PCS key alone, so that a good signature can only be theirs.
  export GNUPGHOME="${WORK}/gnupg"
  mkdir -m 700 "${GNUPGHOME}"
  curl -fsSL --retry 5 -o "${WORK}/aws-pcs-public-key.pub" "${KEY_URL}"
  gpg --batch --quiet --import "${WORK}/aws-pcs-public-key.pub"
  gpg --batch --with-colons --fingerprint | grep -q "^fpr:::::::::${KEY_FINGERPRINT}:" \
    || die "the AWS PCS key's fingerprint is not ${KEY_FINGERPRINT}: not installing"
}

verified_tarball() {
  # Download $1 (a path under the PCS repository) and its signature into $WORK; fail unless it verifies.
  local name
  name=$(basename "$1")
  curl -fsSL --retry 5 -o "${WORK}/${name}" "${REPO}/$1"
  curl -fsSL --retry 5 -o "${WORK}/${name}.sig" "${REPO}/$1.sig"
  gpg --batch --verify "${WORK}/${name}.sig" "${WORK}/${name}" || die "bad signature on $1: not installing"
  tar -xzf "${WORK}/${name}" -C "${WORK}"
}

install_pcs_agent() {
  local tarball="aws-pcs-agent/aws-pcs-agent-v1-latest.tar.gz"
  [[ "${PCS_AGENT_INSTALLER}" == latest ]] || tarball="aws-pcs-agent/aws-pcs-agent-v${PCS_AGENT_INSTALLER}.tar.gz"
  verified_tarball "${tarball}"
  (cd "${WORK}/aws-pcs-agent" && ./installer.sh)
  cat /opt/aws/pcs/version
}

install_pcs_slurm() {
  local base="aws-pcs-slurm-${PCS_SLURM_VERSION}-installer"
  verified_tarball "aws-pcs-slurm/${base}-${PCS_SLURM_INSTALLER}.tar.gz"
  (cd "${WORK}/${base}" && ./installer.sh -y)
  cat "${SLURM_HOME}/version"
  cat > /etc/profile.d/scdino-slurm.sh <<PROFILE
PATH="\${PATH}:${SLURM_HOME}/bin"
MANPATH="\${MANPATH:-}:${SLURM_HOME}/share/man"
export PATH MANPATH
PROFILE
  # shellcheck source=/dev/null
  source /etc/profile.d/scdino-slurm.sh
  sbatch --version
}

WORK=$(mktemp -d)
readonly WORK
trust_pcs_key  # first: a key that is not AWS's stops the build before anything is installed
install_lustre_client
install_cloudwatch_agent
install_pcs_agent
install_pcs_slurm
rm -rf "${WORK}"
