#!/usr/bin/env bash
# Fail the build early unless the base image's NVIDIA driver and CUDA toolkit work on this GPU.
set -euo pipefail

command -v nvidia-smi >/dev/null || { echo "nvidia-smi missing: the base AMI has no NVIDIA driver" >&2; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
[[ -x /usr/local/cuda/bin/nvcc ]] || { echo "/usr/local/cuda/bin/nvcc missing: no CUDA toolkit" >&2; exit 1; }
/usr/local/cuda/bin/nvcc --version | tail -n 2
