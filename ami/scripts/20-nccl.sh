#!/usr/bin/env bash
# NCCL built from the pinned tag into /opt/nccl, for the GPU generations of the presets
# (T4 sm_75, A100 sm_80, H100 sm_90), so every node runs the same NCCL whatever its CUDA packages.
set -euo pipefail

: "${NCCL_VERSION:?}"
readonly PREFIX=/opt/nccl
readonly GENCODE="-gencode=arch=compute_75,code=sm_75 -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90,code=sm_90"

if [[ -f "${PREFIX}/.version" && "$(cat "${PREFIX}/.version")" == "${NCCL_VERSION}" ]]; then
  echo "NCCL ${NCCL_VERSION} already in ${PREFIX}"
  exit 0
fi
if command -v dnf >/dev/null; then
  dnf install -y -q git gcc-c++ make
else
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q git g++ make
fi
workdir=$(mktemp -d)
git clone --quiet --depth 1 --branch "${NCCL_VERSION}" https://github.com/NVIDIA/nccl.git "${workdir}/nccl"
make -C "${workdir}/nccl" -j "$(nproc)" src.build CUDA_HOME=/usr/local/cuda NVCC_GENCODE="${GENCODE}"
rm -rf "${PREFIX}"
mkdir -p "${PREFIX}"
cp -a "${workdir}/nccl/build/." "${PREFIX}/"
echo "${NCCL_VERSION}" > "${PREFIX}/.version"
echo "${PREFIX}/lib" > /etc/ld.so.conf.d/nccl.conf
ldconfig
rm -rf "${workdir}"
echo "NCCL ${NCCL_VERSION} installed in ${PREFIX}"
