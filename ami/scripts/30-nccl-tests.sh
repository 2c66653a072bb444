#!/usr/bin/env bash
# nccl-tests (all_reduce_perf, ...) built against /opt/nccl and EFA's Open MPI, into /opt/nccl-tests:
# the first check that GPUs on different nodes talk at the expected bus bandwidth.
set -euo pipefail

: "${NCCL_TESTS_VERSION:?}"
readonly PREFIX=/opt/nccl-tests
readonly MPI_HOME=/opt/amazon/openmpi

[[ -d "${MPI_HOME}" ]] || { echo "${MPI_HOME} missing: EFA's Open MPI is required" >&2; exit 1; }
workdir=$(mktemp -d)
git clone --quiet --depth 1 --branch "${NCCL_TESTS_VERSION}" https://github.com/NVIDIA/nccl-tests.git "${workdir}/nccl-tests"
make -C "${workdir}/nccl-tests" -j "$(nproc)" MPI=1 MPI_HOME="${MPI_HOME}" \
  CUDA_HOME=/usr/local/cuda NCCL_HOME=/opt/nccl
rm -rf "${PREFIX}"
mkdir -p "${PREFIX}"
cp -a "${workdir}/nccl-tests/build/." "${PREFIX}/"
rm -rf "${workdir}"
"${PREFIX}/all_reduce_perf" -b 8 -e 8M -f 2 -g 1
