#!/usr/bin/env bash
# nccl-tests (all_reduce_perf, ...) into /opt/nccl-tests/bin (stacks/presets.py NCCL_TESTS_BIN, the
# path slurm/nccl_tests.slurm runs), built with EFA's Open MPI and linked against the NCCL that
# torch bundles in /opt/scdino-venv: the image holds one NCCL, so the bandwidth nccl-tests measures
# is the bandwidth training gets. No second NCCL is built.
set -euo pipefail

: "${NCCL_TESTS_VERSION:?}"
readonly BIN_DIR=/opt/nccl-tests/bin
readonly VENV=/opt/scdino-venv
readonly MPI_HOME=/opt/amazon/openmpi

nccl_lib=$(find "${VENV}/lib" -path '*/nvidia/*' -name 'libnccl.so.2' | head -n 1)
nccl_header=$(find "${VENV}/lib" -path '*/nvidia/*' -name 'nccl.h' | head -n 1)
[[ -n "${nccl_lib}" && -n "${nccl_header}" ]] || { echo "torch's NCCL (nvidia-nccl wheel) not found in ${VENV}" >&2; exit 1; }
workdir=$(mktemp -d)
# nccl-tests links -lnccl from $NCCL_HOME/{include,lib}; the wheel ships only libnccl.so.2.
mkdir -p "${workdir}/nccl/include" "${workdir}/nccl/lib"
ln -s "${nccl_header}" "${workdir}/nccl/include/nccl.h"
ln -s "${nccl_lib}" "${workdir}/nccl/lib/libnccl.so"
git clone --quiet --depth 1 --branch "${NCCL_TESTS_VERSION}" https://github.com/NVIDIA/nccl-tests.git "${workdir}/nccl-tests"
make -C "${workdir}/nccl-tests" -j "$(nproc)" MPI=1 MPI_HOME="${MPI_HOME}" \
  CUDA_HOME=/usr/local/cuda NCCL_HOME="${workdir}/nccl"
# The loader finds torch's libnccl.so.2 for these binaries (and for nothing else: no other NCCL is installed).
dirname "${nccl_lib}" > /etc/ld.so.conf.d/scdino-nccl.conf
ldconfig
rm -rf "${BIN_DIR}"
mkdir -p "${BIN_DIR}"
cp -a "${workdir}/nccl-tests/build/"*_perf "${BIN_DIR}/"
rm -rf "${workdir}"
linked=$(ldd "${BIN_DIR}/all_reduce_perf" | awk '/libnccl.so/ {print $3}')
[[ "$(readlink -f "${linked}")" == "$(readlink -f "${nccl_lib}")" ]] \
  || { echo "all_reduce_perf loads ${linked}, not torch's ${nccl_lib}" >&2; exit 1; }
"${BIN_DIR}/all_reduce_perf" -b 8 -e 8M -f 2 -g 1
