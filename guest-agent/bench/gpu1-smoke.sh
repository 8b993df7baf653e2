#!/usr/bin/env bash
# Issue 17 smoke run on ONE GPU (nvidia-h100-x1: no network, no Rust, CUDA 13, python3 with
# torch and NCCL). What can be checked with a single GPU:
#   1. env: date, nvidia-smi, nvcc, CPU, torch/NCCL versions, the binaries;
#   2. the agent: `scan`, `peers` and `report --quick` / `report` (these need two GPUs: their
#      refusal and exit status are recorded), `cross-process --same-gpu` for both handle
#      kinds, table and JSON (owner and writer children on the one GPU: CUDA IPC between
#      processes, not P2P);
#   3. NCCL topology: `vfio-p2p gen nccl --as-is` from this machine's sysfs and
#      /proc/cpuinfo beside NCCL's own dump (NCCL_TOPO_DUMP_FILE, one rank, torch.distributed
#      world size 1), the agent's `nccl-topo` on both, and a world-size-1 all-reduce with
#      NCCL_TOPO_FILE set to the generated file: PASS when NCCL's log shows the file loaded,
#      no "Attribute arch of node cpu not found", and the sum is right.
# Every step under `timeout`; whole run < 5 min; without a GPU every step fails in seconds.
#
# Inputs: AGENT, VFIO_P2P  prebuilt release binaries [.devcarry/issue17/{vfio-p2p-agent,vfio-p2p}]
# Output under $OUT (at most 8 files): summary.txt, gpu1-smoke.tar.gz (every log, JSON and
# XML), cross-process.json, gen-nccl.xml, nccl-dump.xml, nccl-allreduce.txt (its stdout
# and stderr).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
carry=$repo/.devcarry/issue17
AGENT=${AGENT:-$carry/vfio-p2p-agent}
VFIO_P2P=${VFIO_P2P:-$carry/vfio-p2p}
OUT=${OUT:-/tmp/vfio-p2p-gpu1-smoke}
mkdir -p "$OUT"
work=$(mktemp -d /tmp/gpu1-smoke.XXXXXX)
trap 'rm -rf "$work"' EXIT
times=$work/timings.txt
: >"$times"

# The whole run ends its steps by BUDGET_S seconds [270], whatever hangs.
# shellcheck disable=SC2034 # read by step.sh
budget=${BUDGET_S:-270}

# step LIMIT_S NAME CMD…: see step.sh
# shellcheck source=guest-agent/bench/step.sh
. "$(dirname "${BASH_SOURCE[0]}")/step.sh"

# 1. Environment.
{
    date -u
    uname -r
    timeout 20 nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version --format=csv
    timeout 20 nvcc --version | tail -n 2
    grep -m1 'model name' /proc/cpuinfo
    timeout 60 python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
"nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())'
    for b in "$AGENT" "$VFIO_P2P"; do [ -x "$b" ] && echo "binary $b" || echo "MISSING binary $b"; done
} >"$work/env.txt" 2>&1
cp /proc/cpuinfo "$work/cpuinfo.txt" 2>/dev/null
{ timeout 20 nvidia-smi topo -m; timeout 20 nvidia-smi nvlink --status; } >"$work/topo-m.txt" 2>&1

# 2. The agent on one GPU.
step 20 scan.txt "$AGENT" scan
step 20 scan.json "$AGENT" scan --format json
step 30 peers.txt "$AGENT" peers
step 90 cross-process-same-gpu.txt env COLUMNS=120 "$AGENT" cross-process --same-gpu
step 90 cross-process.json "$AGENT" cross-process --same-gpu --format json
step 30 cross-process-no-flag.txt "$AGENT" cross-process
step 60 report-quick.txt env COLUMNS=120 "$AGENT" report --quick
step 60 report.txt env COLUMNS=120 "$AGENT" report

# 3. NCCL topology: ours from this machine, NCCL's own dump, the agent's check, all-reduce.
# Every GPU the host shows (the default); then without nvidia-smi's NVLink table; then the
# GPUs nvidia-smi names (its 00000000:BB:DD.F as 0000:bb:dd.f).
bdfs=$(timeout 20 nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader 2>/dev/null |
    sed -E 's/^0000([0-9A-Fa-f]{4}:)/\1/' | tr 'A-F' 'a-f' | paste -sd, -)
step 30 gen-nccl.xml "$VFIO_P2P" --sysfs-root / gen nccl --as-is --nvlink "$work/topo-m.txt" ||
    step 30 gen-nccl.xml "$VFIO_P2P" --sysfs-root / gen nccl --as-is ||
    { [ -n "$bdfs" ] && step 30 gen-nccl.xml "$VFIO_P2P" --sysfs-root / gen nccl --as-is --gpus "$bdfs"; }
cat >"$work/allreduce1.py" <<'PY'
# One rank (world size 1): NCCL still detects (or loads) the topology; a 1-element sum.
import os, sys
import torch
import torch.distributed as dist
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29541")
torch.cuda.set_device(0)
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
t = torch.full((1 << 20,), 3.0, device="cuda")
dist.all_reduce(t)
torch.cuda.synchronize()
ok = bool(torch.all(t == 3.0).item())
print(f"rank 0: sum {t[0].item()} want 3.0 {'OK' if ok else 'WRONG'}", flush=True)
dist.destroy_process_group()
sys.exit(0 if ok else 3)
PY
nccl_env=(NCCL_DEBUG=INFO "NCCL_DEBUG_SUBSYS=INIT,GRAPH,ENV" PYTHONUNBUFFERED=1)
step 120 nccl-dump-run.txt env "${nccl_env[@]}" MASTER_PORT=29541 NCCL_TOPO_DUMP_FILE="$work/nccl-dump.xml" \
    python3 "$work/allreduce1.py"
step 120 nccl-allreduce.txt env "${nccl_env[@]}" MASTER_PORT=29542 NCCL_TOPO_FILE="$work/gen-nccl.xml" \
    python3 "$work/allreduce1.py"
step 20 nccl-topo-generated.txt "$AGENT" nccl-topo "$work/gen-nccl.xml"
step 20 nccl-topo-nccl-dump.txt "$AGENT" nccl-topo "$work/nccl-dump.xml"
if [ -s "$work/nccl-dump.xml" ] && [ -s "$work/gen-nccl.xml" ]; then
    diff -u "$work/nccl-dump.xml" "$work/gen-nccl.xml" >"$work/nccl-dump-vs-generated.diff"
fi

# The all-reduce's verdict, from NCCL's own log.
{
    log=$work/nccl-allreduce.txt
    all="$(cat "$log" "$log.err" 2>/dev/null)"
    rc=$(grep -m1 '^nccl-allreduce.txt ' "$times" | sed -E 's/.*rc=([0-9]+).*/\1/')
    fail=0
    [ "$rc" = 0 ] || { echo "FAIL: the all-reduce exited $rc"; fail=1; }
    grep -q 'OK$' <<<"$all" || { echo "FAIL: rank 0 did not report the right sum"; fail=1; }
    if ! grep -Eq "Loading topology file .*gen-nccl.xml|NCCL_TOPO_FILE set by environment to .*gen-nccl.xml" <<<"$all"; then
        echo "FAIL: NCCL's log does not show gen-nccl.xml being loaded"; fail=1
    fi
    if grep -q "Attribute arch of node cpu not found" <<<"$all"; then
        echo 'FAIL: NCCL says "Attribute arch of node cpu not found"'; fail=1
    fi
    [ "$fail" -eq 0 ] && echo "PASS: NCCL loaded gen-nccl.xml (no arch complaint) and the sum is right"
} >"$work/nccl-allreduce-verdict.txt"

# Summary: wall times and exit status of every step, the refusals, the cross-process results.
{
    cat "$work/env.txt"
    echo
    cat "$times"
    echo "whole run: ${SECONDS} s"
    for name in peers.txt cross-process-no-flag.txt report-quick.txt report.txt gen-nccl.xml \
        nccl-dump-run.txt; do
        echo "--- $name (stdout, stderr tail)"
        tail -n 5 "$work/$name" "$work/$name.err" 2>/dev/null
    done
    echo "--- cross-process --same-gpu (table)"
    cat "$work/cross-process-same-gpu.txt" "$work/cross-process-same-gpu.txt.err"
    python3 - "$work/cross-process.json" <<'PY' 2>&1
import json, sys
try:
    for r in json.load(open(sys.argv[1])):
        print(f"cross-process {r['src']}->{r['dst']} same_gpu {r.get('same_gpu')} {r['kind']}: "
              f"write {r.get('write')} GB/s {r.get('write_gbps')} error {r.get('error')}")
except Exception as e:
    print(f"cross-process: no JSON ({e})")
PY
    echo "--- NCCL"
    grep -h -E "Loading topology file|NCCL_TOPO_FILE set|Attribute|NCCL version|OK$|WRONG$" \
        "$work/nccl-allreduce.txt" "$work/nccl-allreduce.txt.err" 2>/dev/null | head -n 20
    cat "$work/nccl-allreduce-verdict.txt"
    for name in nccl-topo-generated.txt nccl-topo-nccl-dump.txt; do
        echo "--- $name"
        tail -n 15 "$work/$name" "$work/$name.err" 2>/dev/null
    done
    [ -s "$work/nccl-dump.xml" ] && echo "NCCL's dump: $(wc -l <"$work/nccl-dump.xml") lines" \
        || echo "NCCL's dump: none written"
} >"$work/summary.txt" 2>&1

cp "$work/summary.txt" "$OUT/summary.txt"
for f in cross-process.json gen-nccl.xml nccl-dump.xml; do
    [ -s "$work/$f" ] && cp "$work/$f" "$OUT/$f"
done
cat "$work/nccl-allreduce.txt" "$work/nccl-allreduce.txt.err" >"$OUT/nccl-allreduce.txt" 2>/dev/null
tar -C "$work" -czf "$OUT/gpu1-smoke.tar.gz" .
cat "$OUT/summary.txt"
