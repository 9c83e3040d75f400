#!/usr/bin/env bash
# Runs the RDMA backend's hardware tests: the raw verbs operations and the
# SWARM register and key-value suites over real queue pairs, with three
# memory-node daemons on this machine (loopback through its NIC).
#
#   scripts/test-rdma-hardware.sh            # the first device
#   RDMA_DEVICE=mlx5_0 RDMA_GID_INDEX=3 scripts/test-rdma-hardware.sh   # RoCE
#
# Exits non-zero, saying so, where the machine has no RDMA device.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v ibv_devices >/dev/null; then
  echo "ibv_devices is missing: run scripts/install-deps.sh first" >&2
  exit 1
fi
devices=$(ibv_devices 2>&1 || true)
echo "$devices"
# ibv_devices prints a two-line header, then one line per device.
if ! echo "$devices" | awk 'NR > 2 && NF > 0 { found = 1 } END { exit !found }'; then
  echo "no RDMA device found: the hardware tests need one (see backend-rdma/README.md)" >&2
  exit 1
fi
cargo test --release -p swarm-backend-rdma --features verbs --test hardware -- --ignored --nocapture --test-threads 1
