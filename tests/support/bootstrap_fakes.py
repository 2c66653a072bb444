"""What the node bootstrap's tests stand in for (tests/bootstrap/test_bootstrap.py and
tests/slurm/test_bundle_pruning.py): S3, which this machine cannot reach, and requirements pip resolves
offline."""

FAKE_AWS = """#!/usr/bin/env bash
# Fake `aws s3 cp [--only-show-errors] SRC DEST` and
# `aws s3api get-object --bucket B --key K FILE --query LastModified --output text`, over $FAKE_S3_DIR:
# this machine cannot reach S3.
set -euo pipefail
case "$1 $2" in
  "s3 cp") shift 2; [[ "$1" == --only-show-errors ]] && shift; cp "${FAKE_S3_DIR}/${1#s3://*/}" "$2" ;;
  "s3api get-object") cp "${FAKE_S3_DIR}/$6" "$7"; date -u -r "${FAKE_S3_DIR}/$6" +%FT%T+00:00 ;;
  *) echo "fake aws: unsupported $*" >&2; exit 2 ;;
esac
"""
REQUIREMENTS = "pip\n"
"""A bundle's requirements: pip is already in every venv, so pip resolves them offline."""
