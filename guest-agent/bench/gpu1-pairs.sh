#!/usr/bin/env bash
# Issue 17 item 2 on ONE GPU (nvidia-h100-x1): the schedule of disjoint pairs run for real.
# With one GPU, `bench --simulate N` makes every simulated GPU that GPU: each pair is the
# GPU with itself (within the GPU, not P2P), each pair in its own thread with its own
# streams, events and ping-pong flags. The same schedule at once and one pair at a time:
#   1. --simulate 4 (3 rounds of 2 pairs), full plan: at once, then --serial (JSON, -v);
#   2. --simulate 2 (1 round, 1 pair), full plan (JSON, -v): one pair's cost on this GPU;
#   3. --simulate 4 --quick, table, at once and --serial;
#   4. --simulate 8 --quick (7 rounds of 4), at once and --serial (JSON);
#   5. `report -v` and `bench` (two GPUs needed: their refusal recorded).
# Every step under `timeout`, the whole under BUDGET_S [270] seconds; the output under $OUT:
# summary.txt and one JSON per JSON step (at most 8 files).
# Inputs: AGENT (a release build) [.devcarry/pairs/vfio-p2p-agent]
set -uo pipefail
AGENT=${AGENT:-.devcarry/pairs/vfio-p2p-agent}
OUT=${OUT:-/tmp/vfio-p2p-gpu1-pairs}
budget=${BUDGET_S:-270}
mkdir -p "$OUT"
sum=$OUT/summary.txt
: >"$sum"

# step LIMIT_S NAME ARGS…: the agent with ARGS, stdout to $OUT/NAME (JSON) or the summary.
step() {
    local limit=$1 name=$2 left=$((budget - SECONDS)) t0 rc ms; shift 2
    if [ "$left" -lt 5 ]; then
        echo "== $name: skipped, the ${budget} s budget is spent" >>"$sum"
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "== $name: $AGENT $*" >>"$sum"
    t0=$(date +%s%N)
    case $name in
    *.json) timeout --kill-after=5 "$limit" "$AGENT" "$@" >"$OUT/$name" 2>>"$sum" ;;
    *) COLUMNS=120 timeout --kill-after=5 "$limit" "$AGENT" "$@" >>"$sum" 2>&1 ;;
    esac
    rc=$?
    ms=$((($(date +%s%N) - t0) / 1000000))
    printf -- '-- %s: rc=%d, %d.%03d s wall\n' "$name" "$rc" $((ms / 1000)) $((ms % 1000)) >>"$sum"
}

{
    date -u
    nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version --format=csv
    "$AGENT" --version
} >>"$sum" 2>&1

step 90 sim4-at-once.json bench --simulate 4 --format json -v
step 120 sim4-serial.json bench --simulate 4 --serial --format json -v
step 45 sim2.json bench --simulate 2 --format json -v
step 40 sim4-quick.txt bench --simulate 4 --quick -v
step 40 sim4-quick-serial.txt bench --simulate 4 --quick --serial -v
step 40 sim8-quick-at-once.json bench --simulate 8 --quick --format json -v
step 60 sim8-quick-serial.json bench --simulate 8 --quick --serial --format json -v
step 20 report.txt report -v
step 20 bench.txt bench

# The figures side by side: per round, wall time and each pair's CE GB/s and one-way µs.
python3 - "$OUT" >>"$sum" 2>&1 <<'PY'
import json, os, sys
out = sys.argv[1]
for name in sorted(os.listdir(out)):
    if not name.endswith(".json"):
        continue
    try:
        r = json.load(open(os.path.join(out, name)))
    except Exception as e:
        print(f"{name}: no JSON ({e})")
        continue
    walls = [x["bench_s"] for x in r["rounds"]]
    own = sum(sum(x["pair_bench_s"]) for x in r["rounds"])
    ce = [p["ce_bandwidth_gbps"]["median"] for p in r["pairs"]]
    ow = [p["one_way_latency_us"]["median"] for p in r["pairs"] if p.get("one_way_latency_us")]
    print(f"{name}: {r['simulated_gpus']} GPUs simulated, {len(walls)} rounds "
          f"({'at once' if r['rounds'][0]['concurrent'] else 'one at a time'}): rounds "
          f"{sum(walls):.2f} s (per round {', '.join(f'{w:.2f}' for w in walls)}), pairs' own "
          f"{own:.2f} s, elapsed {r['elapsed_s']:.2f} s; CE GB/s {min(ce):.0f}-{max(ce):.0f} "
          f"(median {sorted(ce)[len(ce)//2]:.0f}); one-way us {min(ow):.3f}-{max(ow):.3f}; "
          f"timed out: {any(p['pingpong_timed_out'] for p in r['pairs'])}")
    print("   phases: " + ", ".join(f"{n} {s:.3f} s" for n, s in r.get("phases", [])))
PY
echo "whole run: ${SECONDS} s" >>"$sum"
cat "$sum"
