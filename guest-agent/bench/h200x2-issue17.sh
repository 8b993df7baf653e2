#!/usr/bin/env bash
# Issue 17 on a 2 × H200 machine (nvidia-h200-x2) with no network and no Rust: one run
# that records, side by side,
#   1. NVIDIA's p2pBandwidthLatencyTest, built here from cuda-samples source, and the
#      reference probe p2p_lat.cu, built here with nvcc, each with its wall time;
#   2. the agent: `report --format json` (RUNS times), `report` as a table (phases and
#      8-GPU estimate), `report --quick`, each with its wall time;
#   3. `vfio-p2p gen nccl --as-is` from this machine's own sysfs, /proc/cpuinfo and
#      `nvidia-smi topo -m`, NCCL's own dump of the same GPUs (NCCL_TOPO_DUMP_FILE), the
#      agent's `nccl-topo` on both and on the committed fixture, and an NCCL all-reduce
#      with the generated file (host-tool/tests/gpu/nccl-topo-check.sh);
#   4. the agent's cross-process check, alone and as `report --cross-process` (both handle kinds).
# Idempotent (a fresh work directory each run), every step under `timeout`, < 8 min.
#
# Inputs (defaults in brackets; the repository is the script's ../..):
#   AGENT, VFIO_P2P   prebuilt release binaries [.devcarry/issue17/vfio-p2p-agent, …/vfio-p2p]
#   CUDA_SAMPLES      a copy of github.com/NVIDIA/cuda-samples with at least
#                     Samples/5_Domain_Specific/p2pBandwidthLatencyTest/p2pBandwidthLatencyTest.cu
#                     and Common/{helper_cuda.h,helper_string.h,helper_timer.h,exception.h,
#                     helper_functions.h,helper_image.h} [.devcarry/cuda-samples]
#   REF_PROBE         p2p_lat.cu [shared/reference/p2p_lat.cu, else /work/shared/reference/p2p_lat.cu]
#   RUNS              agent report runs [3]
# Output under $OUT (8 files at most come back): summary.txt and issue17.tar.gz (every
# log, report and XML).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
carry=$repo/.devcarry/issue17
AGENT=${AGENT:-$carry/vfio-p2p-agent}
VFIO_P2P=${VFIO_P2P:-$carry/vfio-p2p}
CUDA_SAMPLES=${CUDA_SAMPLES:-$repo/.devcarry/cuda-samples}
REF_PROBE=${REF_PROBE:-$repo/shared/reference/p2p_lat.cu}
[ -r "$REF_PROBE" ] || REF_PROBE=/work/shared/reference/p2p_lat.cu
NCCL_CHECK=$repo/host-tool/tests/gpu/nccl-topo-check.sh
RUNS=${RUNS:-3}
OUT=${OUT:-/tmp/vfio-p2p-issue17}
mkdir -p "$OUT"
work=$(mktemp -d /tmp/issue17.XXXXXX)
trap 'rm -rf "$work"' EXIT
times=$work/timings.txt
: >"$times"

# step LIMIT_S NAME CMD…: see step.sh
# shellcheck source=guest-agent/bench/step.sh
. "$(dirname "${BASH_SOURCE[0]}")/step.sh"

{
    date -u
    nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version --format=csv
    nvcc --version | tail -n 2
    grep -m1 'model name' /proc/cpuinfo
    for b in "$AGENT" "$VFIO_P2P"; do [ -x "$b" ] && echo "binary $b" || echo "MISSING binary $b"; done
    [ -r "$CUDA_SAMPLES/Samples/5_Domain_Specific/p2pBandwidthLatencyTest/p2pBandwidthLatencyTest.cu" ] \
        || echo "MISSING cuda-samples under $CUDA_SAMPLES"
} >"$work/env.txt" 2>&1
cp /proc/cpuinfo "$work/cpuinfo.txt" 2>/dev/null
{ nvidia-smi topo -m; echo; nvidia-smi --query-gpu=index,pci.bus_id --format=csv; } >"$work/topo-m.txt" 2>&1

# 1. NVIDIA's and the reference probe, built here.
p2pblt=$CUDA_SAMPLES/Samples/5_Domain_Specific/p2pBandwidthLatencyTest/p2pBandwidthLatencyTest.cu
if step 180 nvcc-p2pBandwidthLatencyTest.txt nvcc -O2 -arch=sm_90 -I "$CUDA_SAMPLES/Common" \
    -o "$work/p2pBandwidthLatencyTest" "$p2pblt"; then
    for i in $(seq 1 "$RUNS"); do
        step 60 "p2pBandwidthLatencyTest-$i.txt" "$work/p2pBandwidthLatencyTest"
    done
fi
if step 120 nvcc-p2p_lat.txt nvcc -O2 -arch=sm_90 -o "$work/p2p_lat" "$REF_PROBE"; then
    step 60 p2p_lat.txt "$work/p2p_lat"
fi

# 2. The agent.
for i in $(seq 1 "$RUNS"); do
    step 60 "report-$i.json" "$AGENT" report --format json
done
step 60 report.txt env COLUMNS=120 "$AGENT" report
step 30 report-quick.json "$AGENT" report --quick --format json

# 3. NCCL topology: ours from this machine, NCCL's own dump, the agent's check, all-reduce.
step 30 gen-nccl.xml "$VFIO_P2P" --sysfs-root / gen nccl --as-is --nvlink "$work/topo-m.txt"
NCCL_TOPO_DUMP_FILE=$work/nccl-dump.xml step 120 nccl-allreduce-generated.txt \
    "$NCCL_CHECK" "$work/gen-nccl.xml"
step 120 nccl-allreduce-fixture.txt "$NCCL_CHECK" "$repo/tests/fixtures/nccl/h200x2-topo.xml"
step 20 nccl-topo-generated.txt "$AGENT" nccl-topo "$work/gen-nccl.xml"
step 20 nccl-topo-nccl-dump.txt "$AGENT" nccl-topo "$work/nccl-dump.xml"
step 20 nccl-topo-fixture.txt "$AGENT" nccl-topo "$repo/tests/fixtures/nccl/h200x2-topo.xml"
NCCL_TOPO_FILE=$work/gen-nccl.xml step 60 report-with-nccl-topo.json "$AGENT" report --quick --format json

# 4. Cross-process peer access (issue 17 item 6), when this agent has it.
if "$AGENT" --help 2>/dev/null | grep -q cross-process; then
    step 180 cross-process.txt env COLUMNS=120 "$AGENT" cross-process
    step 180 cross-process.json "$AGENT" cross-process --format json
    step 180 report-cross-process.json "$AGENT" report --cross-process --format json
else
    echo "this agent has no cross-process check (issue 17 item 6 not implemented yet)" >"$work/cross-process.txt"
fi

# Summary: wall times, p2pBandwidthLatencyTest vs the agent, CE bandwidth, NCCL verdicts.
python3 - "$work" "$RUNS" >"$work/summary.txt" 2>&1 <<'PY'
import json, re, sys
work, runs = sys.argv[1], int(sys.argv[2])
t = open(f"{work}/timings.txt").read()
print(t)
def wall(name):
    m = re.search(re.escape(name) + r"\s+rc=(\d+)\s+([0-9.]+) s", t)
    return (int(m.group(1)), float(m.group(2))) if m else (None, None)
blt = [wall(f"p2pBandwidthLatencyTest-{i}.txt")[1] for i in range(1, runs + 1)]
print("p2pBandwidthLatencyTest wall s:", blt)
for i in range(1, runs + 1):
    try:
        r = json.load(open(f"{work}/report-{i}.json"))
    except Exception as e:
        print(f"report-{i}: unreadable ({e})")
        continue
    ce = [p["bench"]["ce_bandwidth_gbps"]["median"] for p in r["pairs"] if p.get("bench")]
    ow = [p["bench"]["one_way_latency_us"]["median"] for p in r["pairs"]
          if p.get("bench") and p["bench"].get("one_way_latency_us")]
    print(f"report-{i}: elapsed_s {r['elapsed_s']:.2f} wall {wall(f'report-{i}.json')[1]} "
          f"CE GB/s {[round(x, 1) for x in ce]} one-way µs {[round(x, 3) for x in ow]} "
          f"phases {(r.get('phases') or [])} schedule {r.get('schedule')}")
q = wall("report-quick.json")
print(f"report --quick: rc {q[0]} wall {q[1]} s")
for name in ("nccl-allreduce-generated.txt", "nccl-allreduce-fixture.txt"):
    text = open(f"{work}/{name}").read() + open(f"{work}/{name}.err").read()
    verdict = [l for l in text.splitlines() if l.startswith(("PASS", "FAIL")) or "Attribute" in l]
    print(f"{name}: rc {wall(name)[0]} {verdict}")
for name in ("nccl-topo-generated.txt", "nccl-topo-nccl-dump.txt", "nccl-topo-fixture.txt"):
    print(f"{name}: rc {wall(name)[0]}")
try:
    for r in json.load(open(f"{work}/cross-process.json")):
        print(f"cross-process {r['src']}->{r['dst']} {r['kind']}: write {r.get('write')} "
              f"GB/s {r.get('write_gbps')} error {r.get('error')}")
except Exception as e:
    print(f"cross-process: no JSON ({e}); see cross-process.txt")
PY
cp "$work/summary.txt" "$OUT/summary.txt"
tar -C "$work" --exclude=p2pBandwidthLatencyTest --exclude=p2p_lat -czf "$OUT/issue17.tar.gz" .
cat "$OUT/summary.txt"
