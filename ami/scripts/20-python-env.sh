#!/usr/bin/env bash
# The cluster's one Python environment, /opt/scdino-venv, built once here from the repository's
# pinned requirements.txt and requirements-dali.txt (uploaded to $REQUIREMENTS_DIR): torch with the
# NCCL it bundles, torchvision, DALI for torch's CUDA, and the rest of the training runtime. Every
# node boots it locally; bootstrap/on-node-configured.sh links the installed bundle to it when the
# bundle's requirements are the ones recorded here.
# Pins are exact versions; the files carry no hashes, so `pip --require-hashes` cannot be used. The
# resolved set is recorded in /opt/scdino-venv/scdino-freeze.txt.
set -euo pipefail

: "${REQUIREMENTS_DIR:?}"
readonly VENV=/opt/scdino-venv
readonly PYTHON=python3.11
readonly RECORD_DIR="${VENV}/scdino-requirements"

if ! command -v "${PYTHON}" >/dev/null; then
  if command -v dnf >/dev/null; then
    dnf install -y -q "${PYTHON}" "${PYTHON}-pip"
  else
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${PYTHON}" "${PYTHON}-venv"
  fi
fi
rm -rf "${VENV}"
"${PYTHON}" -m venv "${VENV}"
"${VENV}/bin/pip" install --disable-pip-version-check --no-input -q \
  -r "${REQUIREMENTS_DIR}/requirements.txt" -r "${REQUIREMENTS_DIR}/requirements-dali.txt"
mkdir -p "${RECORD_DIR}"
cp "${REQUIREMENTS_DIR}/requirements.txt" "${REQUIREMENTS_DIR}/requirements-dali.txt" "${RECORD_DIR}/"
"${VENV}/bin/pip" freeze --disable-pip-version-check > "${VENV}/scdino-freeze.txt"
cuda_major=$("${VENV}/bin/python" -c 'import torch; print((torch.version.cuda or "").split(".")[0])')
grep -q "^nvidia-dali-cuda${cuda_major}0==" "${VENV}/scdino-freeze.txt" \
  || { echo "requirements-dali.txt's DALI is not the build for torch's CUDA ${cuda_major}" >&2; exit 1; }
"${VENV}/bin/python" - <<'PY'
import torch, torchvision
from nvidia import dali
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}, NCCL {torch.cuda.nccl.version()}), "
      f"torchvision {torchvision.__version__}, DALI {dali.__version__}")
assert torch.cuda.is_available(), "torch sees no GPU"
PY
chmod -R a+rX "${VENV}"
