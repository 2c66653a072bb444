#!/usr/bin/env bash
# NVIDIA DCGM: GPU health and metrics (ParallelCluster's GPU health checks use it).
set -euo pipefail

if ! command -v dcgmi >/dev/null; then
  if command -v dnf >/dev/null; then
    dnf install -y -q datacenter-gpu-manager
  else
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q datacenter-gpu-manager
  fi
fi
systemctl enable --now nvidia-dcgm
dcgmi discovery -l
