#!/usr/bin/env bash
# EFA: the official ParallelCluster AMI ships the EFA installer's stack (libfabric, Open MPI,
# aws-ofi-nccl, the NCCL network plugin). Nothing is installed here: the build fails unless that
# stack is present, so an image without it never reaches a queue.
set -euo pipefail

[[ -x /opt/amazon/efa/bin/fi_info ]] || { echo "/opt/amazon/efa missing: the base AMI has no EFA stack" >&2; exit 1; }
/opt/amazon/efa/bin/fi_info --version
[[ -d /opt/amazon/openmpi ]] || { echo "/opt/amazon/openmpi missing: nccl-tests needs EFA's Open MPI" >&2; exit 1; }
plugin=$(find /opt/amazon/ofi-nccl /opt/aws-ofi-nccl -name 'libnccl-net*.so' 2>/dev/null | head -n 1 || true)
[[ -n "${plugin}" ]] || { echo "aws-ofi-nccl plugin not found under /opt/amazon/ofi-nccl" >&2; exit 1; }
echo "aws-ofi-nccl: ${plugin}"
