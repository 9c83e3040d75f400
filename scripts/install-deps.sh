#!/usr/bin/env bash
# Installs what building and testing the workspace needs on a fresh machine
# of the project's kind (Debian with a rustup toolchain). Idempotent.
set -euo pipefail

# rustfmt and clippy come with the toolchain on this machine kind; add them
# only where they are missing (this needs the rustup distribution server).
for comp in rustfmt clippy; do
  if ! rustup component list --installed 2>/dev/null | grep -q "^${comp}"; then
    rustup component add "$comp"
  fi
done

# Debian packages. None are needed yet: the shared-memory backend and the
# simulator use only the standard library. The RDMA backend (issue #7) will
# add cmake, clang, libclang-dev, pkg-config, libibverbs-dev, libnl-3-dev and
# libnl-route-3-dev here.
PACKAGES=()
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
