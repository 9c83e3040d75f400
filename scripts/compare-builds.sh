#!/usr/bin/env bash
# Two or more builds of `swarm` on the same YCSB run, repeated and
# interleaved (A, B, A, B, ...) so that the machine's noise falls on every
# build alike; prints a markdown table of medians per build and system:
# the p50 (µs) of each operation the workload has (get, update, insert),
# and the median and range of each run's ratio to RAW (the figure to
# judge a change by on a shared machine).
#
#   scripts/compare-builds.sh OLD_SWARM NEW_SWARM
#   REPEAT=9 scripts/compare-builds.sh old/swarm target/release/swarm -- --workload a
#
# An older build: `git worktree add /tmp/old REV && (cd /tmp/old && cargo
# build --release -p swarm-cli)`, then /tmp/old/target/release/swarm.
# Flags after `--` go to every `swarm bench` run (default: YCSB-B with a
# 1 µs injected roundtrip, RAW, SWARM-KV and DM-ABD).
set -euo pipefail

REPEAT=${REPEAT:-5}
BINS=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  [ -x "$1" ] || { echo "compare-builds: $1 is not an executable swarm binary" >&2; exit 2; }
  BINS+=("$1")
  shift
done
if [ "${1:-}" = "--" ]; then shift; fi
[ "${#BINS[@]}" -ge 1 ] || { echo "usage: compare-builds.sh SWARM... [-- bench flags]" >&2; exit 2; }
EXTRA=("$@")
[ "${#EXTRA[@]}" -gt 0 ] || EXTRA=(--inject-rtt-us 1 --systems raw,swarm-kv,dm-abd)

OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
for r in $(seq 1 "$REPEAT"); do
  for i in "${!BINS[@]}"; do
    printf 'round %d/%d: %s\n' "$r" "$REPEAT" "${BINS[$i]}" >&2
    "${BINS[$i]}" bench "${EXTRA[@]}" --no-plots --json "$OUT/$i-$r.json" >/dev/null
  done
done

python3 - "$OUT" "$REPEAT" "${BINS[@]}" <<'PY'
import json, statistics, sys
out, repeat, bins = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
all_runs = [[json.load(open(f"{out}/{i}-{r}.json")) for r in range(1, repeat + 1)] for i in range(len(bins))]
# The operations the workload has (YCSB-D inserts rather than updates).
ops = [op for op in ("get", "update", "insert")
       if any(op in s["ops"] for runs in all_runs for run in runs for s in run["systems"])]
print(f"medians of {repeat} interleaved rounds\n")
print("| build | system | " + " | ".join(f"{op} p50 µs" for op in ops)
      + " | ratio to RAW, median (range) of the runs: " + " / ".join(ops) + " |")
print("|---|---|" + "---|" * len(ops) + "---|")
def p50(s, op):
    return s["ops"].get(op, {}).get("p50_us")
for b, runs in zip(bins, all_runs):
    for name in [s["name"] for s in runs[0]["systems"]]:
        cells = []
        for op in ops:
            vals = [p50(s, op) for run in runs for s in run["systems"] if s["name"] == name]
            vals = [v for v in vals if v is not None]
            cells.append(f"{statistics.median(vals):.2f}" if vals else "-")
        ratios = []
        for op in ops:
            rs = []
            for run in runs:
                by = {s["name"]: p50(s, op) for s in run["systems"]}
                if by.get("raw") and by.get(name) is not None:
                    rs.append(by[name] / by["raw"])
            ratios.append(f"{statistics.median(rs):.2f}x ({min(rs):.2f}–{max(rs):.2f})" if rs else "-")
        print(f"| {b} | {name} | " + " | ".join(cells) + " | " + " / ".join(ratios) + " |")
PY
