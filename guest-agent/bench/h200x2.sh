#!/usr/bin/env bash
# The benchmark run of issue 6 on the GPU machine (nvidia-h200-x2): the reference probe
# and the agent side by side, with wall-clock times. Needs, in $DIR (default the folder
# of this script): vfio-p2p-agent (release build), p2p_lat.cu (../shared/reference) and
# p2p.ptx (guest-agent/src/kernels). Writes everything under $OUT.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
DIR=${DIR:-$(dirname "$0")}
OUT=${OUT:-/tmp/vfio-p2p-agent-bench}
mkdir -p "$OUT"
agent="$DIR/vfio-p2p-agent"

# Wall-clock seconds of a command; its stdout goes to $OUT/$1, stderr to $OUT/$1.err.
timed() {
    local out=$1; shift
    local t0 t1 rc ms
    t0=$(date +%s%N)
    "$@" >"$OUT/$out" 2>"$OUT/$out.err"
    rc=$?
    t1=$(date +%s%N)
    ms=$(( (t1 - t0) / 1000000 ))
    printf '%-50s rc=%d %d.%03d s\n' "$*" "$rc" $((ms / 1000)) $((ms % 1000)) >>"$OUT/timings.txt"
}

{
    nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version --format=csv
    nvidia-smi topo -m
    nvcc --version
    ldconfig -p | grep -E 'libcuda|nvidia-ml'
} >"$OUT/env.txt" 2>&1

ptxas -arch=sm_90 "$DIR/p2p.ptx" -o /tmp/p2p.cubin >"$OUT/ptxas.txt" 2>&1 && echo "ptxas: p2p.ptx assembles for sm_90" >>"$OUT/ptxas.txt"

nvcc -O2 -arch=sm_90 -o /tmp/p2p_lat "$DIR/p2p_lat.cu" && timed reference.txt /tmp/p2p_lat

timed scan.txt "$agent" scan
timed peers.txt "$agent" peers
timed verify.txt "$agent" verify
timed report-quick.json "$agent" report --quick --format json
timed report.json "$agent" report --format json
"$agent" report --from "$OUT/report.json" >"$OUT/report.txt" 2>&1
cat "$OUT/timings.txt"
