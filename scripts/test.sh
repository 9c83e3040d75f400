#!/usr/bin/env bash
# The project's test command (README): every crate's unit, property,
# simulation and multi-process tests.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace "$@"
