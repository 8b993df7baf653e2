#!/usr/bin/env bash
# Issue 31: more processes side by side before issue31.sh, in the same device call:
# p2pBandwidthLatencyTest, the previous build (base) and candidate builds, alternating,
# RUNS times each; then issue31-variants-summary.py prints each one's wall times, elapsed,
# bench phase and 8-GPU estimate, each candidate's largest median shift against base per
# metric, and "PICK C|D" (D only where it is as fast as p2pBandwidthLatencyTest and moves
# the peer-disabled bandwidth less than C).
# Inputs, all in this script's folder (the git-ignored folder the device call carried, with
# issue31.sh and its companions): cuda-samples/, vfio-p2p-agent-{base,C,D,...};
# VARIANTS (default "base C D"), RUNS [5], OUT. Output: $OUT/variants-summary.txt and
# $OUT/variants.tar.gz (every report and wall time).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
d=$(cd "$(dirname "$0")" && pwd)
RUNS=${RUNS:-5}
o=/tmp/variants; mkdir -p $o
nvcc -O2 -arch=sm_90 -I $d/cuda-samples/Common -o /tmp/p2pblt $d/cuda-samples/Samples/5_Domain_Specific/p2pBandwidthLatencyTest/p2pBandwidthLatencyTest.cu || exit 1
for i in $(seq 1 $RUNS); do
  for v in p2pblt ${VARIANTS:-base C D}; do
    s=$(date +%s%N)
    if [ $v = p2pblt ]; then /tmp/p2pblt >$o/$v-$i.txt 2>&1; else $d/vfio-p2p-agent-$v report --format json >$o/$v-$i.json 2>$o/$v-$i.err; fi
    echo "$v $i $(( ($(date +%s%N) - s) / 1000000 ))" >>$o/walls.txt
  done
done
python3 $d/issue31-variants-summary.py $o | tee $o/summary.txt; cp $o/summary.txt $OUT/variants-summary.txt; tar -C $o -czf $OUT/variants.tar.gz .
