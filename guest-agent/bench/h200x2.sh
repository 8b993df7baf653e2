#!/usr/bin/env bash
# The benchmark run of issue 6 on the GPU machine (nvidia-h200-x2), with the NCCL
# topology check of issue 4 in the same run:
# - the pair-selecting copy of the reference probe (p2p_lat.cu beside this script),
#   compiled with nvcc, 3 processes for each direction (0→1, 1→0), collected per
#   direction in reference-0-1.txt and reference-1-0.txt;
# - the agent: scan, peers, verify, `report --format json` 3 times (3 processes; the
#   one with the median one-way latency becomes report.json) and `report --quick`
#   once, each with its wall-clock time;
# - host-tool/tests/gpu/nccl-topo-check.sh with tests/fixtures/nccl/h200x2-topo.xml.
# Paths default to the repository layout and can be set one by one: AGENT (release
# vfio-p2p-agent), PROBE (p2p_lat.cu), PTX (p2p.ptx), NCCL_CHECK, NCCL_TOPO.
# Writes everything under $OUT, summary.txt last.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
AGENT=${AGENT:-$repo/target/release/vfio-p2p-agent}
PROBE=${PROBE:-$here/p2p_lat.cu}
PTX=${PTX:-$repo/guest-agent/src/kernels/p2p.ptx}
NCCL_CHECK=${NCCL_CHECK:-$repo/host-tool/tests/gpu/nccl-topo-check.sh}
NCCL_TOPO=${NCCL_TOPO:-$repo/tests/fixtures/nccl/h200x2-topo.xml}
OUT=${OUT:-/tmp/vfio-p2p-agent-bench}
RUNS=${RUNS:-3}
mkdir -p "$OUT"
: >"$OUT/timings.txt"

# Wall-clock seconds of a command; its stdout goes to $OUT/$1, stderr to $OUT/$1.err.
timed() {
    local out=$1; shift
    local t0 t1 rc ms
    t0=$(date +%s%N)
    "$@" >"$OUT/$out" 2>"$OUT/$out.err"
    rc=$?
    t1=$(date +%s%N)
    ms=$(( (t1 - t0) / 1000000 ))
    printf '%-60s rc=%d %d.%03d s\n' "$(basename "$1") ${*:2}" "$rc" $((ms / 1000)) $((ms % 1000)) >>"$OUT/timings.txt"
}

{
    nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv
    nvidia-smi topo -m
    nvcc --version
    ldconfig -p | grep -E 'libcuda|nvidia-ml'
} >"$OUT/env.txt" 2>&1

if ptxas -arch=sm_90 "$PTX" -o /tmp/p2p.cubin >"$OUT/ptxas.txt" 2>&1; then
    echo "ptxas: p2p.ptx assembles for sm_90" >>"$OUT/ptxas.txt"
    cuobjdump -sass -fun ping /tmp/p2p.cubin >"$OUT/ping.sass" 2>&1
fi

if nvcc -O2 -arch=sm_90 -o /tmp/p2p_lat "$PROBE" >"$OUT/nvcc.txt" 2>&1; then
    for dir in "0 1" "1 0"; do
        for i in $(seq 1 "$RUNS"); do
            timed "reference-${dir/ /-}-$i.txt" /tmp/p2p_lat $dir
        done
        for i in $(seq 1 "$RUNS"); do
            echo "== p2p_lat $dir (guest-agent/bench/p2p_lat.cu), process $i"
            cat "$OUT/reference-${dir/ /-}-$i.txt"
        done >"$OUT/reference-${dir/ /-}.txt"
    done
fi

timed scan.txt "$AGENT" scan
timed peers.txt "$AGENT" peers
timed verify.txt "$AGENT" verify
for i in $(seq 1 "$RUNS"); do
    timed "report-$i.json" "$AGENT" report --format json
done
timed report-quick.json "$AGENT" report --quick --format json

timed nccl-check.txt "$NCCL_CHECK" "$NCCL_TOPO"

# The median run (by the mean over pairs of the one-way latency medians) is report.json;
# summary.txt has one-way and pointer-chase latencies of every process, agent and probe,
# the ping-pong flag addresses of both, and the agent's one-way latency at other places.
python3 - "$OUT" "$RUNS" <<'PY' >"$OUT/summary.txt" 2>&1
import glob, json, os, re, shutil, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
print("reference probe (one process per line): one-way µs, remote chase µs, local chase µs")
for d in ("0-1", "1-0"):
    ows = []
    for i in range(1, runs + 1):
        try:
            text = open(f"{out}/reference-{d}-{i}.txt").read()
        except OSError:
            continue
        m = lambda k: float(re.search(k + r": ([0-9.]+) us", text).group(1))
        ow = m("pingpong one-way latency")
        ows.append(ow)
        flags = re.search(r"pingpong flag addresses: (.*)", text)
        print(f"  {d} #{i}: {ow:.3f}  {m('remote read pointer-chase latency'):.3f}  {m('local read pointer-chase latency'):.3f}"
              f"  flags {flags.group(1) if flags else '?'}")
    if ows:
        print(f"  {d} median {statistics.median(ows):.3f} min {min(ows):.3f} max {max(ows):.3f}")
print("agent report (one process per line, per pair): one-way median [min-max] µs, remote chase µs,"
      " flags; other flag places [min-max] µs")
scored = []
for i in range(1, runs + 1):
    try:
        r = json.load(open(f"{out}/report-{i}.json"))
    except (OSError, ValueError) as e:
        print(f"  #{i}: no report ({e})")
        continue
    lat = []
    for p in r["pairs"]:
        b = p.get("bench") or {}
        ow = b.get("one_way_latency_us")
        if ow is None:
            continue
        lat.append(ow["median"])
        print(f"  #{i} {p['src']}->{p['dst']}: {ow['median']:.3f} [{ow['min']:.3f}-{ow['max']:.3f}]"
              f"  {b['remote_read_latency_us']['median']:.3f}  flags {' '.join(b.get('pingpong_flag_addresses') or ['?'])}"
              f"  samples {' '.join(f'{x:.3f}' for x in ow['samples'])}")
        pos = (b.get("pingpong_position_spread") or {}).get("one_way_latency_us")
        if pos:
            print(f"      other places [{pos['min']:.3f}-{pos['max']:.3f}]"
                  f"  samples {' '.join(f'{x:.3f}' for x in pos['samples'])}")
    if lat:
        scored.append((sum(lat) / len(lat), i))
if scored:
    scored.sort()
    mean, pick = scored[len(scored) // 2]
    shutil.copy(f"{out}/report-{pick}.json", f"{out}/report.json")
    print(f"median run: #{pick} (mean one-way {mean:.3f} µs) -> report.json")
PY
[ -f "$OUT/report.json" ] && "$AGENT" report --from "$OUT/report.json" >"$OUT/report.txt" 2>&1
cat "$OUT/timings.txt" "$OUT/summary.txt"
grep -E '^(PASS|FAIL)|rank [01]:|Loading topology file|NCCL_TOPO_FILE set' "$OUT/nccl-check.txt" "$OUT/nccl-check.txt.err"
