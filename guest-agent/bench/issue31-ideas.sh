#!/usr/bin/env bash
# Issue 31, where a 2-GPU report's time goes and which idea moves it: side by side in one
# device call, alternating, RUNS processes each, every process's wall time and, from the
# agent's `VFIO_P2P_AGENT_MARKS` lines, its start (exec to main) and its end (the last
# line printed to the process gone: the driver tearing the contexts down):
#   p2pblt            NVIDIA's p2pBandwidthLatencyTest (built here from cuda-samples)
#   report            this build's full report
#   base              the build before issue 31's batches (e347251): the earlier medians
#   event             --tune bidir=event (both ways started by an event, as before)
#   reset             --tune exit=reset (each context reset, a thread per GPU, then exit)
#   conn1, conn2      CUDA_DEVICE_MAX_CONNECTIONS=1 / 2 (fewer hardware queues a context)
#   conn8             CUDA_DEVICE_MAX_CONNECTIONS=8 (the driver's default, which the agent
#                     replaces by 1 unless the variable is set)
#   warm1, d1         --tune warmup_rounds=1 / disabled_copies=1,disabled_mib=256 (the
#                     warm-up round and the one staged copy of 256 MiB before this change)
#   lq                CUDA_SCALE_LAUNCH_QUEUES=0.25x (smaller launch queues a context)
#   d4                --tune disabled_copies=4 (the earlier staged batch, 4 x 256 MiB)
#   d4x64, d2x128     4 x 64 MiB, 2 x 128 MiB staged copies a sample
#   min2              --tune min_samples=2
#   warm0             --tune warmup_rounds=0 (no round dropped before the samples)
#   p2pblt-conn1      p2pBandwidthLatencyTest with CUDA_DEVICE_MAX_CONNECTIONS=1
# then `setup-probe` (a thread per GPU; --ctx-create: cuCtxCreate against the primary
# context; conn1; lq; LAZY), RUNS each.
# The first run (2 x H100, 2026-11-26) used the build before CUDA_DEVICE_MAX_CONNECTIONS=1,
# 4 x 64 MiB staged copies and no warm-up round became the defaults: `report` there is
# conn8 + warm1 + d1 here.
# Inputs, in this script's folder (the git-ignored folder the device call carried):
# vfio-p2p-agent, vfio-p2p-agent-base, cuda-samples/; VARIANTS, RUNS [5], OUT.
# Output: $OUT/ideas.tar.gz (every JSON, stderr and walls.txt); issue31-ideas-summary.py
# reads it.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
d=$(cd "$(dirname "$0")" && pwd)
RUNS=${RUNS:-5}
VARIANTS=${VARIANTS:-p2pblt report base event reset conn1 conn2 lq d4 d4x64 d2x128 min2 warm0 p2pblt-conn1}
o=/tmp/ideas
rm -rf $o
mkdir -p $o
[ -x /tmp/p2pblt ] || nvcc -O2 -arch=sm_90 -I "$d/cuda-samples/Common" -o /tmp/p2pblt \
    "$d/cuda-samples/Samples/5_Domain_Specific/p2pBandwidthLatencyTest/p2pBandwidthLatencyTest.cu" || exit 1
nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version --format=csv >$o/env.txt
a=$d/vfio-p2p-agent
run() { # name i env... -- command...
    local v=$1 i=$2
    shift 2
    local s e
    s=$(date +%s%N)
    env VFIO_P2P_AGENT_MARKS=1 "$@" >"$o/$v-$i.out" 2>"$o/$v-$i.err"
    local rc=$?
    e=$(date +%s%N)
    echo "$v $i $s $e $rc" >>$o/walls.txt
}
for i in $(seq 1 "$RUNS"); do
    for v in $VARIANTS; do
        case $v in
        p2pblt) run $v $i /tmp/p2pblt ;;
        p2pblt-conn1) run $v $i CUDA_DEVICE_MAX_CONNECTIONS=1 /tmp/p2pblt ;;
        report) run $v $i "$a" report --format json ;;
        base) run $v $i "$d/vfio-p2p-agent-base" report --format json ;;
        event) run $v $i "$a" report --format json --tune bidir=event ;;
        reset) run $v $i "$a" report --format json --tune exit=reset ;;
        conn1) run $v $i CUDA_DEVICE_MAX_CONNECTIONS=1 "$a" report --format json ;;
        conn8) run $v $i CUDA_DEVICE_MAX_CONNECTIONS=8 "$a" report --format json ;;
        warm1) run $v $i "$a" report --format json --tune warmup_rounds=1 ;;
        d1) run $v $i "$a" report --format json --tune disabled_copies=1,disabled_mib=256 ;;
        conn2) run $v $i CUDA_DEVICE_MAX_CONNECTIONS=2 "$a" report --format json ;;
        lq) run $v $i CUDA_SCALE_LAUNCH_QUEUES=0.25x "$a" report --format json ;;
        d4) run $v $i "$a" report --format json --tune disabled_copies=4 ;;
        d4x64) run $v $i "$a" report --format json --tune disabled_copies=4,disabled_mib=64 ;;
        d2x128) run $v $i "$a" report --format json --tune disabled_copies=2,disabled_mib=128 ;;
        min2) run $v $i "$a" report --format json --tune min_samples=2 ;;
        warm0) run $v $i "$a" report --format json --tune warmup_rounds=0 ;;
        *) echo "unknown variant $v" >&2 ;;
        esac
    done
done
for i in $(seq 1 "$RUNS"); do
    run probe-threads $i "$a" setup-probe
    run probe-ctx-create $i "$a" setup-probe --ctx-create
    run probe-conn1 $i CUDA_DEVICE_MAX_CONNECTIONS=1 "$a" setup-probe
    run probe-lq $i CUDA_SCALE_LAUNCH_QUEUES=0.25x "$a" setup-probe
done
python3 "$d/issue31-ideas-summary.py" $o >$o/summary.txt 2>&1
cat $o/summary.txt
mkdir -p "$OUT"
cp $o/summary.txt "$OUT/ideas-summary.txt"
tar -C $o -czf "$OUT/ideas.tar.gz" .
