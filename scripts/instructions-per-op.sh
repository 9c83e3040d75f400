#!/usr/bin/env bash
# Client instructions per operation of one system on one YCSB workload, on
# shm without injected latency, counted by valgrind's callgrind: the same
# count on every run of the same build, whatever else the machine does, so
# a change to the client's work can be judged where wall-clock ratios are
# noisy. Two runs that differ only in their operation count; the difference
# of their totals over the difference of their counts leaves the load and
# the start-up out.
#
#   scripts/instructions-per-op.sh SWARM SYSTEM [WORKLOAD]
#   scripts/instructions-per-op.sh target/release/swarm swarm-kv c
#
# Needs valgrind (Debian's package). The harness's own work (key choice,
# timing, histograms) is included, the same for every system.
set -euo pipefail

[ $# -ge 2 ] || { echo "usage: instructions-per-op.sh SWARM SYSTEM [WORKLOAD]" >&2; exit 2; }
BIN=$1 SYSTEM=$2 WORKLOAD=${3:-b}
[ -x "$BIN" ] || { echo "instructions-per-op: $BIN is not an executable swarm binary" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "instructions-per-op: valgrind is not installed" >&2; exit 2; }

OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
total() {
  if ! valgrind --tool=callgrind --callgrind-out-file="$OUT/cg.$1" "$BIN" bench --systems "$SYSTEM" \
    --workload "$WORKLOAD" --keys 1000 --ops "$1" --warmup 1000 --no-plots >/dev/null 2>"$OUT/log.$1"; then
    grep -v '^==' "$OUT/log.$1" >&2
    exit 1
  fi
  sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$OUT/log.$1"
}
small=$(total 10000) || exit 1
large=$(total 30000) || exit 1
echo "$SYSTEM, YCSB-$WORKLOAD: $(( (large - small) / 20000 )) instructions per operation"
