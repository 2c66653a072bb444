#!/usr/bin/env bash
# EFA: keep the base image's EFA stack when present, else install the pinned EFA installer
# (checksum verified). aws-ofi-nccl, the NCCL network plugin for EFA, ships with the installer.
set -euo pipefail

: "${EFA_INSTALLER_VERSION:?}" "${EFA_INSTALLER_SHA256:?}"

if [[ ! -x /opt/amazon/efa/bin/fi_info ]]; then
  workdir=$(mktemp -d)
  tarball="aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz"
  curl -fsSL -o "${workdir}/${tarball}" "https://efa-installer.amazonaws.com/${tarball}"
  echo "${EFA_INSTALLER_SHA256}  ${workdir}/${tarball}" | sha256sum -c -
  tar -xzf "${workdir}/${tarball}" -C "${workdir}"
  (cd "${workdir}/aws-efa-installer" && ./efa_installer.sh -y)
  rm -rf "${workdir}"
fi

/opt/amazon/efa/bin/fi_info --version
plugin=$(find /opt/amazon/ofi-nccl /opt/aws-ofi-nccl -name 'libnccl-net*.so' 2>/dev/null | head -n 1 || true)
[[ -n "${plugin}" ]] || { echo "aws-ofi-nccl plugin not found under /opt/amazon/ofi-nccl" >&2; exit 1; }
echo "aws-ofi-nccl: ${plugin}"
