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
#
# With I1=SIZE,ASSOC,LINE (bytes), cachegrind also counts the misses per
# operation of an instruction cache of that shape: a client path that no
# longer fits the cache it gets (say I1=16384,8,64, half of a 32 KiB cache,
# as when a sibling hyperthread runs) slows down by far more than its
# instruction count says.
#
#   I1=16384,8,64 scripts/instructions-per-op.sh target/release/swarm raw c
set -euo pipefail

[ $# -ge 2 ] || { echo "usage: instructions-per-op.sh SWARM SYSTEM [WORKLOAD]" >&2; exit 2; }
BIN=$1 SYSTEM=$2 WORKLOAD=${3:-b}
[ -x "$BIN" ] || { echo "instructions-per-op: $BIN is not an executable swarm binary" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "instructions-per-op: valgrind is not installed" >&2; exit 2; }

OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
# Prints the run's instruction count, and with I1 its I1 misses after it.
total() {
  local tool=(--tool=callgrind --callgrind-out-file="$OUT/cg.$1")
  [ -n "${I1:-}" ] && tool=(--tool=cachegrind --cache-sim=yes --I1="$I1" --cachegrind-out-file="$OUT/cg.$1")
  if ! valgrind "${tool[@]}" "$BIN" bench --systems "$SYSTEM" \
    --workload "$WORKLOAD" --keys 1000 --ops "$1" --warmup 1000 --no-plots >/dev/null 2>"$OUT/log.$1"; then
    grep -v '^==' "$OUT/log.$1" >&2
    exit 1
  fi
  if [ -n "${I1:-}" ]; then
    # Events: Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw.
    sed -n 's/^summary: \([0-9]*\) \([0-9]*\).*/\1 \2/p' "$OUT/cg.$1"
  else
    sed -n 's/.*Collected : \([0-9]*\).*/\1 0/p' "$OUT/log.$1"
  fi
}
read -r small small_miss < <(total 10000) || exit 1
read -r large large_miss < <(total 30000) || exit 1
[ -n "$small" ] && [ -n "$large" ] || { echo "instructions-per-op: valgrind gave no count" >&2; exit 1; }
line="$SYSTEM, YCSB-$WORKLOAD: $(( (large - small) / 20000 )) instructions per operation"
[ -n "${I1:-}" ] && line="$line, $(( (large_miss - small_miss) / 20000 )) misses of a $I1 instruction cache"
echo "$line"
