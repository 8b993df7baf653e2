#!/usr/bin/env bash
# The agent and the host tool on a GPU machine with any number of GPUs (issue 10 asks for
# 8; run it on what is lent). Captures, under $OUT (at most 8 files):
#   topo-m.txt        nvidia-smi topo -m and the index → bus id map (the --nvlink input)
#   topo.txt          vfio-p2p topo, then vfio-p2p plan with that NVLink capture
#   snapshot.tar.gz   vfio-p2p snapshot of the machine's sysfs (a fixture for --sysfs-root)
#   report-quick.json vfio-p2p-agent report --quick --format json
#   report.json       vfio-p2p-agent report --format json
#   reference.txt     the pair-selecting reference probe for 0→1 and 0→last
#   summary.txt       wall-clock times, the agent's one line per pair, environment
# Binaries: VFIO_P2P, AGENT (release builds); PROBE: p2p_lat.cu (compiled here with nvcc).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
VFIO_P2P=${VFIO_P2P:-$repo/target/release/vfio-p2p}
AGENT=${AGENT:-$repo/target/release/vfio-p2p-agent}
PROBE=${PROBE:-$here/p2p_lat.cu}
OUT=${OUT:-/tmp/vfio-p2p-multi-gpu}
mkdir -p "$OUT"
sum=$OUT/summary.txt
# secs OUT ERR CMD…: runs CMD with stdout to OUT and stderr to ERR, prints its wall time
# (the time goes to the caller's stdout, never into OUT: report.json stays pure JSON).
secs() {
    local out=$1 err=$2 t0 t1 rc; shift 2
    t0=$(date +%s.%N); "$@" >"$out" 2>"$err"; rc=$?; t1=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" -v rc=$rc 'BEGIN{printf "%.2f s (exit %d)", b-a, rc}'
}

{ nvidia-smi topo -m; echo; nvidia-smi --query-gpu=index,pci.bus_id --format=csv; } >"$OUT/topo-m.txt" 2>&1
n=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
{
    echo "gpus: $n"; nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version --format=csv,noheader
    echo "vfio-p2p topo: $(secs "$OUT/topo.txt" "$OUT/topo.txt.err" "$VFIO_P2P" topo)"
    echo "vfio-p2p plan --nvlink: $(secs "$OUT/plan.txt" "$OUT/plan.txt.err" "$VFIO_P2P" plan --nvlink "$OUT/topo-m.txt")"
    cat "$OUT/topo.txt.err" "$OUT/plan.txt" "$OUT/plan.txt.err" >>"$OUT/topo.txt"; rm -f "$OUT"/topo.txt.err "$OUT"/plan.txt*
    snap=$(mktemp -d)/snapshot
    echo "vfio-p2p snapshot: $(secs /dev/stdout /dev/stdout "$VFIO_P2P" snapshot -o "$snap")"
    tar -C "$(dirname "$snap")" -czf "$OUT/snapshot.tar.gz" snapshot
    echo "agent report --quick: $(secs "$OUT/report-quick.json" "$OUT/report-quick.err" "$AGENT" report --quick --format json)"
    echo "agent report: $(secs "$OUT/report.json" "$OUT/report.err" "$AGENT" report --format json)"
    echo "--- agent summary (re-judged from report.json)"
    "$AGENT" report --from "$OUT/report.json" 2>&1 | tail -n "$((n * (n - 1) + 8))"
} >"$sum" 2>&1
nvcc -O2 -arch=sm_90 -o /tmp/p2p_lat "$PROBE" >>"$sum" 2>&1
{ /tmp/p2p_lat 0 1; /tmp/p2p_lat 0 $((n - 1)); } >"$OUT/reference.txt" 2>&1
cat "$OUT"/report-quick.err "$OUT"/report.err >>"$sum" 2>/dev/null
rm -f "$OUT"/report-quick.err "$OUT"/report.err
cat "$sum"
