#!/usr/bin/env bash
# The same YCSB comparison on shm and on cxl in each flush mode, repeated
# and interleaved (shm, cxl none, cxl persist, cxl noncoherent, shm, ...)
# so that the machine's noise falls on every backend alike; prints a
# markdown table of the medians: get and update p50 (µs) and throughput
# per system, and the ratio of each backend to shm.
#
#   scripts/compare-backends.sh                       # 5 rounds, /dev/shm files
#   REPEAT=9 DIR=/mnt/pmem scripts/compare-backends.sh -- --workload a --clients 2
#
# cxl nodes are new files under DIR (an fsdax mount for real pmem; tmpfs
# by default, emulated pmem), made and removed by each run. Flags after
# `--` go to every `swarm bench` run.
set -euo pipefail
cd "$(dirname "$0")/.."

REPEAT=${REPEAT:-5}
DIR=${DIR:-/dev/shm}
if [ "${1:-}" = "--" ]; then shift; fi
EXTRA=("$@")
[ "${#EXTRA[@]}" -gt 0 ] || EXTRA=(--workload b --keys 20000 --ops 40000)

cargo build --release -q -p swarm-cli
BIN=target/release/swarm
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"; rm -f "$DIR"/swarm-compare-$$-*' EXIT

BACKENDS=(shm cxl-none cxl-persist cxl-noncoherent)
for r in $(seq 1 "$REPEAT"); do
  for b in "${BACKENDS[@]}"; do
    case $b in
      shm) args=(--backend shm) ;;
      cxl-*) args=(--backend cxl --flush "${b#cxl-}" --path "$DIR/swarm-compare-$$-$b") ;;
    esac
    printf 'round %d/%d: %s\n' "$r" "$REPEAT" "$b" >&2
    "$BIN" bench "${args[@]}" "${EXTRA[@]}" --no-plots --json "$OUT/$b-$r.json" >/dev/null
  done
done

python3 - "$OUT" "$REPEAT" "${BACKENDS[@]}" <<'PY'
import json, statistics, sys
out, repeat, backends = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
runs = {b: [json.load(open(f"{out}/{b}-{r}.json")) for r in range(1, repeat + 1)] for b in backends}
systems = [s["name"] for s in runs[backends[0]][0]["systems"]]

def med(b, system, f):
    vals = []
    for run in runs[b]:
        for s in run["systems"]:
            if s["name"] == system:
                v = f(s)
                if v is not None:
                    vals.append(v)
    return statistics.median(vals) if vals else None

metrics = [
    ("get p50 µs", lambda s: s["ops"].get("get", {}).get("p50_us")),
    ("update p50 µs", lambda s: s["ops"].get("update", {}).get("p50_us")),
    ("throughput kops/s", lambda s: s["throughput_ops"] / 1e3),
]
cfg = runs[backends[0]][0]["config"]
print(f"YCSB-{cfg['workload'].upper()}, {cfg['keys']} keys, {cfg['value_size']} B values, "
      f"{cfg['clients']} client(s), medians of {repeat} interleaved rounds\n")
print("| system | metric | " + " | ".join(backends) + " |")
print("|---|---|" + "---|" * len(backends))
for system in systems:
    for name, f in metrics:
        base = med("shm", system, f)
        cells = []
        for b in backends:
            v = med(b, system, f)
            if v is None:
                cells.append("-")
            elif b == "shm" or not base:
                cells.append(f"{v:.2f}")
            else:
                cells.append(f"{v:.2f} ({v / base:.2f}x)")
        print(f"| {system} | {name} | " + " | ".join(cells) + " |")
PY
