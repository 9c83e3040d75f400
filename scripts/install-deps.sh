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

# Debian packages: the RDMA backend's `verbs` feature builds rdma-core's
# libibverbs through ibverbs-sys (bindgen needs clang and libclang; the vendored
# rdma-core build needs cmake, pkg-config and libnl). ibverbs-utils gives
# `ibv_devices`, which scripts/test-rdma-hardware.sh uses to find a NIC, and
# ibverbs-providers the user-space drivers that a real device needs.
PACKAGES=(cmake clang libclang-dev pkg-config libibverbs-dev libnl-3-dev
  libnl-route-3-dev ibverbs-providers ibverbs-utils rdma-core)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
