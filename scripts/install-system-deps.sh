#!/usr/bin/env bash
# Installs the Debian packages that the tests and the demo need, only those missing:
# Slurm 22.05 + munge (the local cluster), its REST API (slurmrestd, the JWT plugin; curl checks it),
# packer (ami/ validation), shellcheck, iproute2 (netns),
# systemd (systemd-analyze checks the PCS node's boot units; no systemd needs to run).
set -euo pipefail

packages=(slurmctld slurmd slurm-client slurmrestd slurm-wlm-jwt-plugin curl munge packer shellcheck iproute2 procps
  systemd)

missing=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  sudo_cmd=(sudo)
else
  sudo_cmd=()
fi
echo "installing system packages: ${missing[*]}"
# policy-rc.d keeps the packages' daemons from starting: scripts/local-slurm starts its own.
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
