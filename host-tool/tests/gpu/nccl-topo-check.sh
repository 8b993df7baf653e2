#!/usr/bin/env bash
# Checks a generated NCCL topology file with the real NCCL: two processes, one GPU each,
# all-reduce with NCCL_TOPO_FILE set; passes when NCCL's log shows the file loaded and
# the sum is right. Run on the GPU machine (2 × H200 at 0000:00:06.0 and 0000:00:07.0):
#   host-tool/tests/gpu/nccl-topo-check.sh [TOPO.xml]
# (default: tests/fixtures/nccl/h200x2-topo.xml, made by
#  `vfio-p2p --example flat-vm gen nccl --as-is`).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
topo=$(realpath "${1:-$here/../../../tests/fixtures/nccl/h200x2-topo.xml}")
[ -r "$topo" ] || { echo "FAIL: topology file $topo not readable" >&2; exit 1; }
command -v python3 >/dev/null || { echo "FAIL: python3 missing" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/allreduce.py" <<'PY'
import os, sys
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

def run(rank, world):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = os.environ.get("CHECK_PORT", "29533")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    n = 1 << 24
    t = torch.full((n,), float(rank + 1), device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    want = float(sum(range(1, world + 1)))
    ok = bool(torch.all(t == want).item())
    print(f"rank {rank}: sum {t[0].item()} want {want} {'OK' if ok else 'WRONG'}", flush=True)
    dist.destroy_process_group()
    sys.exit(0 if ok else 3)

if __name__ == "__main__":
    world = torch.cuda.device_count()
    if world < 2:
        print(f"FAIL: need 2 GPUs, see {world}", flush=True)
        sys.exit(2)
    mp.spawn(run, args=(2,), nprocs=2, join=True)
PY
export NCCL_TOPO_FILE="$topo" NCCL_DEBUG=INFO NCCL_NVLS_ENABLE=0 NCCL_DEBUG_SUBSYS=INIT,GRAPH,ENV
set +e
python3 "$work/allreduce.py" >"$work/log" 2>&1
rc=$?
set -e
cat "$work/log"
fail=0
if [ "$rc" -ne 0 ]; then echo "FAIL: all-reduce exited $rc" >&2; fail=1; fi
if [ "$(grep -c 'OK$' "$work/log")" -ne 2 ]; then echo "FAIL: both ranks must report the right sum" >&2; fail=1; fi
# NCCL logs "Loading topology file <path>" (older: "NCCL_TOPO_FILE set by environment to <path>").
if ! grep -Eq "Loading topology file .*$(basename "$topo")|NCCL_TOPO_FILE set by environment to .*$(basename "$topo")" "$work/log"; then
    echo "FAIL: NCCL's log does not show $topo being loaded" >&2; fail=1
fi
[ "$fail" -eq 0 ] && echo "PASS: NCCL loaded $topo and the all-reduce sum is right"
exit "$fail"
