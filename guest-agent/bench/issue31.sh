#!/usr/bin/env bash
# Issues 31 and 30 (guest side) on a 2- or 4-GPU machine (nvidia-h100-x2/-x4, -h200-x2/-x4)
# with no network and no Rust: one run that records, side by side on the same GPUs,
#   1. NVIDIA's p2pBandwidthLatencyTest (built here from cuda-samples source) and the
#      reference probe p2p_lat.cu, against the agent's full `report`, this build and the
#      previous one (BASE), alternating, RUNS times each, every wall time;
#   2. where CUDA's setup goes (`setup-probe`): a thread per GPU, one GPU after the other,
#      CUDA_MODULE_LOADING=LAZY / EAGER, one process per GPU at once, and the same with the
#      driver kept warm by another process of ours (which holds every context), with the
#      agent's report and p2pBandwidthLatencyTest in that warm state too;
#   3. `cross-process` (a child per GPU, both handle kinds) and `report --cross-process`;
#   4. the `--inject` self-test: a destination word and a source word corrupted;
#   5. the fabric check (issue 30): an expectation made here from NVML through Python
#      (module ids, driver version as FM's), passing, and the same with two module ids
#      swapped, failing; `topo` and `scan` without an expectation.
# Every step under `timeout` (step.sh); < 8 min on 4 GPUs.
#
# Inputs (defaults in brackets; the repository is the script's ../..):
#   AGENT, BASE     this build and the previous one [target/devcarry/vfio-p2p-agent{,-base}]
#   CUDA_SAMPLES    cuda-samples with p2pBandwidthLatencyTest.cu and Common/ [target/devcarry/cuda-samples]
#   REF_PROBE       p2p_lat.cu [/work/shared/reference/p2p_lat.cu, else guest-agent/bench/p2p_lat.cu]
#   RUNS            side-by-side runs of each [3]
#   ONLY=fabric     only step 5 (the fabric check, topo and scan)
# Output under $OUT: summary.txt and issue31.tar.gz (every log, report and JSON).
# Recorded (tests/fixtures/agent/issue31) with the two binaries, cuda-samples, this script,
# issue31-summary.py, step.sh and p2p_lat.cu copied into one git-ignored folder that the
# device call carried, AGENT, BASE, CUDA_SAMPLES and REF_PROBE pointing into it.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
carry=$repo/target/devcarry
AGENT=${AGENT:-$carry/vfio-p2p-agent}
BASE=${BASE:-$carry/vfio-p2p-agent-base}
CUDA_SAMPLES=${CUDA_SAMPLES:-$carry/cuda-samples}
REF_PROBE=${REF_PROBE:-/work/shared/reference/p2p_lat.cu}
[ -r "$REF_PROBE" ] || REF_PROBE=$here/p2p_lat.cu
RUNS=${RUNS:-3}
OUT=${OUT:-/tmp/vfio-p2p-issue31}
mkdir -p "$OUT"
work=$(mktemp -d /tmp/issue31.XXXXXX)
trap 'rm -rf "$work"' EXIT
times=$work/timings.txt
: >"$times"
# shellcheck source=guest-agent/bench/step.sh
. "$here/step.sh"

{
    date -u
    nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,persistence_mode --format=csv
    nvcc --version | tail -n 2
    grep -m1 'model name' /proc/cpuinfo
    nproc
    for b in "$AGENT" "$BASE"; do [ -x "$b" ] && echo "binary $b" || echo "MISSING binary $b"; done
} >"$work/env.txt" 2>&1
{ nvidia-smi topo -m; nvidia-smi -q | grep -iE -A6 '^ *(fabric|module id)'; } >"$work/topo-m.txt" 2>&1

if [ "${ONLY:-}" != fabric ]; then
# 1. Builds, then side by side: p2pBandwidthLatencyTest, this agent, the previous agent.
p2pblt=$CUDA_SAMPLES/Samples/5_Domain_Specific/p2pBandwidthLatencyTest/p2pBandwidthLatencyTest.cu
step 240 nvcc-p2pblt.txt nvcc -O2 -arch=sm_90 -I "$CUDA_SAMPLES/Common" -o "$work/p2pblt" "$p2pblt"
step 120 nvcc-p2p_lat.txt nvcc -O2 -arch=sm_90 -o "$work/p2p_lat" "$REF_PROBE"
step 60 p2p_lat.txt "$work/p2p_lat"
for i in $(seq 1 "$RUNS"); do
    step 60 "p2pblt-$i.txt" "$work/p2pblt"
    step 60 "report-$i.json" "$AGENT" report --format json
    [ -x "$BASE" ] && step 60 "base-$i.json" "$BASE" report --format json
done
step 60 report-v.txt env COLUMNS=160 "$AGENT" -v report

# 2. Where the setup goes.
for i in $(seq 1 "$RUNS"); do
    step 30 "probe-threads-$i.json" "$AGENT" setup-probe
    step 30 "probe-serial-$i.json" "$AGENT" setup-probe --serial
    step 30 "probe-lazy-$i.json" env CUDA_MODULE_LOADING=LAZY "$AGENT" setup-probe
    step 30 "probe-eager-$i.json" env CUDA_MODULE_LOADING=EAGER "$AGENT" setup-probe
    # one process per GPU, all at once: the wall of the slowest
    t0=$(date +%s%N)
    pids=()
    for b in $("$AGENT" scan --format json | python3 -c 'import json,sys; print(" ".join(g["bdf"] for g in json.load(sys.stdin)["gpus"]))'); do
        "$AGENT" setup-probe --only "$b" >"$work/probe-proc-$i-$b.json" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
    echo "probe-per-process-$i wall $((($(date +%s%N) - t0) / 1000000)) ms" >>"$work/per-process.txt"
done
# the driver kept warm by one process of ours holding every context
"$AGENT" setup-probe --hold-s 60 >"$work/holder.json" 2>&1 &
holder=$!
sleep 3
for i in $(seq 1 "$RUNS"); do
    step 30 "warm-probe-threads-$i.json" "$AGENT" setup-probe
    step 60 "warm-p2pblt-$i.txt" "$work/p2pblt"
    step 60 "warm-report-$i.json" "$AGENT" report --format json
done
kill "$holder" 2>/dev/null
wait "$holder" 2>/dev/null

# 3. Cross-process, a child per GPU.
step 60 cross-process.json "$AGENT" cross-process --format json
step 60 cross-process.txt env COLUMNS=160 "$AGENT" cross-process
step 120 report-cross-process.json "$AGENT" report --cross-process --format json

# 4. The self-test: word 4097 on the destination, word 12 of the source's data.
step 60 inject-report.json "$AGENT" report --inject dst:4097,src:12 --format json
step 60 inject-verify.txt env COLUMNS=160 "$AGENT" verify --inject dst:4097,src:12
step 60 inject-src-only.json "$AGENT" verify --inject src:12 --format json

fi # ONLY=fabric skips 1-4

# 5. The fabric (issue 30): an expectation from NVML (Python), passing and failing.
"$AGENT" scan --format json >"$work/scan.json" 2>"$work/scan.err"
python3 - "$work" <<'PY' >"$work/expectations.txt" 2>&1
import json, sys, pynvml
work = sys.argv[1]
scan = json.load(open(f"{work}/scan.json"))
pynvml.nvmlInit()
drv = pynvml.nvmlSystemGetDriverVersion()
drv = drv.decode() if isinstance(drv, bytes) else drv
gpus = []
for g in scan["gpus"]:
    h = pynvml.nvmlDeviceGetHandleByPciBusId(g["bdf"])
    gpus.append({"host_bdf": g["bdf"], "guest_bdf": g["bdf"], "clique": g.get("clique"),
                 "vendor": g["vendor"], "device": g["device"],
                 "module_id": pynvml.nvmlDeviceGetModuleId(h)})
good = {"version": 1, "vm": "issue31", "gpus": gpus,
        "fabric": {"model": "shared-nvswitch", "partition_id": None, "fm_version": drv}}
wrong = json.loads(json.dumps(good))
a, b = wrong["gpus"][0], wrong["gpus"][1]
a["module_id"], b["module_id"] = b["module_id"], a["module_id"]
json.dump(good, open(f"{work}/plan-good.json", "w"), indent=1)
json.dump(wrong, open(f"{work}/plan-wrong-module.json", "w"), indent=1)
print("driver", drv, "modules", [g["module_id"] for g in gpus])
PY
step 20 expect-good.json "$AGENT" expect --expect "$work/plan-good.json" --format json
step 20 expect-good.txt env COLUMNS=160 "$AGENT" expect --expect "$work/plan-good.json"
step 20 expect-wrong-module.json "$AGENT" expect --expect "$work/plan-wrong-module.json" --format json
step 20 expect-wrong-module.txt env COLUMNS=160 "$AGENT" expect --expect "$work/plan-wrong-module.json"
step 60 report-expect-good.json "$AGENT" report --quick --expect "$work/plan-good.json" --format json
step 60 report-expect-wrong-module.json "$AGENT" report --quick --expect "$work/plan-wrong-module.json" --format json
step 20 topo-no-expectation.txt env COLUMNS=160 "$AGENT" topo
step 20 topo-no-expectation.json "$AGENT" topo --format json
step 20 scan.txt env COLUMNS=160 "$AGENT" scan

python3 "$here/issue31-summary.py" "$work" "$RUNS" >"$work/summary.txt" 2>&1
cp "$work/summary.txt" "$OUT/summary.txt"
tar -C "$work" --exclude=p2pblt --exclude=p2p_lat -czf "$OUT/issue31.tar.gz" .
cat "$OUT/summary.txt"
