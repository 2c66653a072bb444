#!/usr/bin/env bash
# Leave a clean image: no package caches, no build leftovers, no shell history.
set -euo pipefail

if command -v dnf >/dev/null; then
  dnf clean all
else
  apt-get clean
fi
rm -rf /tmp/* /var/tmp/* /root/.cache
rm -f /root/.bash_history /home/*/.bash_history
