#!/usr/bin/env bash
# The agent against the references, side by side on the same GPUs (a machine of 2 or more
# NVIDIA GPUs with nvcc, no network and no Rust needed), every figure as a ratio to the
# reference probe, never only to an earlier agent:
#   1. builds NVIDIA's p2pBandwidthLatencyTest (cuda-samples source) and the reference
#      probe (p2p_lat.cu beside this script: the team's probe with argv picking the pair);
#   2. RUNS times, alternating: the probe for every ordered pair, p2pBandwidthLatencyTest,
#      the agent's full `report --format json` (every wall time); then EXTRA agent runs with
#      CUDA_DEVICE_MAX_CONNECTIONS=8 (the agent sets 1 unless told) to see whether the queue
#      setting moves the one-way latency distribution;
#   3. the NCCL stage: `nccl` with NCCL's own topology detection, with the host's topology
#      file (TOPO, bus ids rewritten to this machine's), with a deliberately wrong copy of it
#      (every NVLink count 1), and with a library that is not there (the stage says so);
#   4. summary.txt: walls, each figure's ratio to the probe, the one-way latency's
#      placement distribution against the probe, its spread over the processes, the
#      4-byte copy's modes in the agent and in the probe, the NCCL verdicts.
# Inputs (defaults in brackets):
#   AGENT         the release agent [target/release/vfio-p2p-agent]
#   CUDA_SAMPLES  cuda-samples with Common/ and p2pBandwidthLatencyTest [target/devcarry-gpu/cuda-samples]
#   PROBE         the probe [p2p_lat.cu beside this script]
#   REF           the team's reference probe as it is (0→1 only), run beside PROBE [none]
#   TOPO          the host's NCCL topology file [tests/fixtures/nccl/h200x2-topo.xml]
#   NCCL_LIB      libnccl.so.2 [the one of the Python NCCL package, else the linker's]
#   RUNS [5], EXTRA [3]
#   TUNES         other bench plans to try, EXTRA processes each, after the extra runs:
#                 NAME=KEY=VALUE,KEY=VALUE … (e.g. p32=pingpong_rounds_per_place=32,pingpong_iters=30) []
# Output under $OUT: summary.txt and runs.tar.gz (every output, JSON and wall time).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
AGENT=${AGENT:-$repo/target/release/vfio-p2p-agent}
CUDA_SAMPLES=${CUDA_SAMPLES:-$repo/target/devcarry-gpu/cuda-samples}
PROBE=${PROBE:-$here/p2p_lat.cu}
TOPO=${TOPO:-$repo/tests/fixtures/nccl/h200x2-topo.xml}
RUNS=${RUNS:-5}
EXTRA=${EXTRA:-3}
OUT=${OUT:-/tmp/vfio-p2p-compare}
mkdir -p "$OUT"
work=$(mktemp -d /tmp/compare.XXXXXX)
trap 'rm -rf "$work"' EXIT
times=$work/timings.txt
: >"$times"

# step LIMIT NAME CMD…: stdout to $work/NAME, stderr to NAME.err, rc and wall to timings.txt,
# start and end (ns since the epoch) to marks.txt beside the agent's own marks in NAME.err
# (VFIO_P2P_AGENT_MARKS: `mark main` and `mark exit`, how long the process takes to start and end).
step() {
    local limit=$1 name=$2 t0 t1 rc ms; shift 2
    t0=$(date +%s%N)
    timeout --kill-after=5 "$limit" "$@" >"$work/$name" 2>"$work/$name.err"
    rc=$?
    t1=$(date +%s%N)
    ms=$(((t1 - t0) / 1000000))
    printf '%-34s rc=%-3d %d.%03d s   %s\n' "$name" "$rc" $((ms / 1000)) $((ms % 1000)) "$*" >>"$times"
    echo "$name $t0 $t1" >>"$work/marks.txt"
    return $rc
}
export VFIO_P2P_AGENT_MARKS=1

if [ -z "${NCCL_LIB:-}" ]; then
    for d in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
        NCCL_LIB=$(find "$d" -name 'libnccl.so.2' 2>/dev/null | head -n 1)
        [ -n "$NCCL_LIB" ] && break
    done
fi
{
    date -u
    nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,clocks.sm,clocks.max.sm --format=csv
    nvidia-smi topo -m
    nvidia-smi nvlink -s 2>&1 | head -n 40
    nvcc --version | tail -n 2
    grep -m1 'model name' /proc/cpuinfo
    echo "agent $AGENT"; ldd "$AGENT"
    echo "NCCL_LIB ${NCCL_LIB:-none}"
} >"$work/env.txt" 2>&1
n=$(nvidia-smi -L | wc -l)

# 1. Builds.
p2pblt=$CUDA_SAMPLES/Samples/5_Domain_Specific/p2pBandwidthLatencyTest/p2pBandwidthLatencyTest.cu
step 240 nvcc-p2pblt.txt nvcc -O2 -arch=sm_90 -I "$CUDA_SAMPLES/Common" -o "$work/p2pblt" "$p2pblt"
step 120 nvcc-probe.txt nvcc -O2 -arch=sm_90 -o "$work/p2p_lat" "$PROBE"
[ -n "${REF:-}" ] && step 120 nvcc-ref.txt nvcc -O2 -arch=sm_90 -o "$work/p2p_lat_ref" "$REF"

# 2. Side by side, alternating.
for i in $(seq 1 "$RUNS"); do
    for s in $(seq 0 $((n - 1))); do
        for d in $(seq 0 $((n - 1))); do
            [ "$s" = "$d" ] || step 60 "probe-$s-$d-$i.txt" "$work/p2p_lat" "$s" "$d"
        done
    done
    [ -x "$work/p2p_lat_ref" ] && step 60 "ref-$i.txt" "$work/p2p_lat_ref"
    step 60 "p2pblt-$i.txt" "$work/p2pblt"
    step 60 "report-$i.json" "$AGENT" report --format json
done
for i in $(seq 1 "$EXTRA"); do
    step 60 "report-conn8-$i.json" env CUDA_DEVICE_MAX_CONNECTIONS=8 "$AGENT" report --format json
    # What selects the 4-byte copy's mode: 8 streams in one process, one queue and eight.
    step 60 "streams8-conn1-$i.json" "$AGENT" report --tune memcpy_streams=8 --format json
    step 60 "streams8-conn8-$i.json" env CUDA_DEVICE_MAX_CONNECTIONS=8 "$AGENT" report --tune memcpy_streams=8 --format json
    # How the process ends: the driver's teardown at exit, or each context reset first.
    step 60 "report-exit-reset-$i.json" "$AGENT" report --tune exit=reset --format json
done
for t in ${TUNES:-}; do
    for i in $(seq 1 "$EXTRA"); do
        step 60 "tune-${t%%=*}-$i.json" "$AGENT" report --tune "${t#*=}" --format json
    done
done
step 60 report-quick.json "$AGENT" report --quick --format json
step 60 report.txt env COLUMNS=160 "$AGENT" report

# 3. NCCL: own detection, the host's file, a wrong file, no library.
python3 - "$TOPO" "$work" <<'PY'
import re, subprocess, sys
topo, work = sys.argv[1], sys.argv[2]
ids = [l.strip().lower() for l in subprocess.run(
    ["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader"],
    capture_output=True, text=True).stdout.split()]
ids = ["%s:%s" % (b.split(":")[0][-4:], ":".join(b.split(":")[1:])) for b in ids]
text = open(topo).read()
# One GPU <pci> block per GPU of this machine, each the file's first GPU block with its
# bus id (the host's file is of 2 GPUs; a machine of more gets a block for each).
blocks = re.findall(r'(\s*<pci busid="[^"]+" class="0x03.*?</pci>)', text, re.S)
each = "".join(blocks[0].replace(re.search(r'busid="([^"]+)"', blocks[0])[1], b) for b in ids)
text = text.replace("".join(blocks), each) if "".join(blocks) in text else text
open(f"{work}/topo-host.xml", "w").write(text)
open(f"{work}/topo-wrong-nvlink-count.xml", "w").write(re.sub(r'count="\d+"', 'count="1"', text))
PY
lib=${NCCL_LIB:-libnccl.so.2}
step 180 nccl-auto.json "$AGENT" nccl --nccl-lib "$lib" --format json
step 180 nccl-host-file.json "$AGENT" nccl --nccl-lib "$lib" --topo-file "$work/topo-host.xml" --format json
step 180 nccl-wrong-file.json "$AGENT" nccl --nccl-lib "$lib" --topo-file "$work/topo-wrong-nvlink-count.xml" --format json
step 180 nccl-wrong-file.txt env COLUMNS=160 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH "$AGENT" nccl --nccl-lib "$lib" --topo-file "$work/topo-wrong-nvlink-count.xml"
step 30 nccl-no-library.txt "$AGENT" nccl --nccl-lib /nonexistent/libnccl.so.2

# 4. Summary.
python3 - "$work" "$RUNS" "$EXTRA" "$n" >"$work/summary.txt" 2>&1 <<'PY'
import json, re, statistics as st, sys
work, runs, extra, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
walls = {}
for line in open(f"{work}/timings.txt"):
    m = re.match(r"(\S+)\s+rc=(\d+)\s+([\d.]+) s", line)
    if m:
        walls[m[1]] = (int(m[2]), float(m[3]))
def load(name):
    try:
        return json.load(open(f"{work}/{name}"))
    except Exception as e:
        print(f"{name}: unreadable ({e})")
        return None
def med(v):
    return st.median(v) if v else float("nan")
def spread(v):
    return (max(v) - min(v)) / med(v) * 100 if v else float("nan")
print("== wall s (alternating, same machine) ==")
rw = [walls[f"report-{i}.json"][1] for i in range(1, runs + 1) if f"report-{i}.json" in walls]
bw = [walls[f"p2pblt-{i}.txt"][1] for i in range(1, runs + 1) if f"p2pblt-{i}.txt" in walls]
print(f"agent report      {rw}  median {med(rw):.3f}")
print(f"p2pBandwidthLatencyTest {bw}  median {med(bw):.3f}")
print(f"report / p2pBandwidthLatencyTest: {med(rw) / med(bw):.2f}x")
marks = {}
for line in open(f"{work}/marks.txt"):
    name, t0, t1 = line.split()
    marks[name] = (int(t0), int(t1))
def ends(name):
    """(start to `mark main`, `mark exit` to the end) in s, from the agent's marks."""
    try:
        m = dict(l.split()[1:3] for l in open(f"{work}/{name}.err") if l.startswith("mark "))
        t0, t1 = marks[name]
        return (int(m["main"]) - t0) / 1e9, (t1 - int(m["exit"])) / 1e9
    except (OSError, KeyError, ValueError):
        return None
print("where the report's wall goes (each process): start to main, phases, exit to end (s)")
for i in range(1, runs + 1):
    r = load(f"report-{i}.json")
    if not r:
        continue
    e = ends(f"report-{i}.json")
    ph = ", ".join(f"{p[0].split(' (')[0]} {p[1]:.3f}" for p in r.get("phases") or [])
    print(f"  {i}: wall {walls.get(f'report-{i}.json', (0, 0))[1]:.3f}, start {e[0] if e else float('nan'):.3f}, "
          f"{ph}, elapsed {r['elapsed_s']:.3f}, exit {e[1] if e else float('nan'):.3f}")
    for p in r["pairs"]:
        ms = " ".join(f"{k} {v * 1e3:.1f}" for k, v in p["bench"].get("measure_s", []))
        print(f"     {p['src'][-4:]}->{p['dst'][-4:]} ms: {ms}")
xw = [walls[f"report-exit-reset-{i}.json"][1] for i in range(1, extra + 1) if f"report-exit-reset-{i}.json" in walls]
xe = [ends(f"report-exit-reset-{i}.json") for i in range(1, extra + 1)]
print(f"--tune exit=reset walls {xw}, exit to end {[round(x[1], 3) for x in xe if x]}")
probe_keys = {"pingpong one-way latency": "one_way", "remote read pointer-chase latency": "remote_read",
              "memcpyPeerAsync 4B per-copy": "memcpy", "uni bw": "ce", "bidir bw": "bidir"}
def probe(s, d, i):
    out = {}
    try:
        text = open(f"{work}/probe-{s}-{d}-{i}.txt").read()
    except OSError:
        return out
    for line in text.splitlines():
        for k, key in probe_keys.items():
            if line.startswith(k) and "disabled" not in line:
                out[key] = float(re.findall(r"([\d.]+) (?:us|GB/s)", line)[0])
    return out
reports = [load(f"report-{i}.json") for i in range(1, runs + 1)]
conn8 = [load(f"report-conn8-{i}.json") for i in range(1, extra + 1)]
ordinal = {}
for r in reports:
    if r:
        ordinal = {g["bus_id"]: g["ordinal"] for g in r["gpus"]}
        break
def pairs(r):
    for p in (r or {}).get("pairs", []):
        b = p.get("bench")
        if b:
            yield ordinal[p["src"]], ordinal[p["dst"]], b
fig = {"one_way": lambda b: b["one_way_latency_us"]["median"],
       "remote_read": lambda b: b["remote_read_latency_us"]["median"],
       "memcpy": lambda b: b["memcpy_latency_us"]["median"],
       "ce": lambda b: b["ce_bandwidth_gbps"]["median"],
       "bidir": lambda b: b["ce_bidir_bandwidth_gbps"]["median"]}
for s in range(n):
    for d in range(n):
        if s == d:
            continue
        pv = [probe(s, d, i) for i in range(1, runs + 1)]
        av = [b for r in reports for (a, c, b) in pairs(r) if (a, c) == (s, d)]
        cv = [b for r in conn8 for (a, c, b) in pairs(r) if (a, c) == (s, d)]
        if not av:
            continue
        print(f"\n== pair {s}->{d}: agent ({len(av)} processes) / probe ({len(pv)} processes), medians ==")
        for k, f in fig.items():
            a = [f(b) for b in av]
            p = [x[k] for x in pv if k in x]
            if p:
                print(f"{k:12s} agent {med(a):8.3f} (spread {spread(a):4.1f} %)  probe {med(p):8.3f} "
                      f"(spread {spread(p):4.1f} %)  ratio {med(a) / med(p):.3f}")
        print("one-way latency over flag places (min / median / max µs, each process):")
        for label, group in (("agent", av), ("agent CONN=8", cv)):
            mins = [b["one_way_latency_us"]["min"] for b in group]
            meds = [b["one_way_latency_us"]["median"] for b in group]
            maxs = [b["one_way_latency_us"]["max"] for b in group]
            for b in group:
                pl = b.get("one_way_placements") or {}
                print(f"  {label}: {b['one_way_latency_us']['min']:.3f} @{pl.get('min_at')} / "
                      f"{b['one_way_latency_us']['median']:.3f} @{pl.get('median_at')} / "
                      f"{b['one_way_latency_us']['max']:.3f} @{pl.get('max_at')}")
            if group:
                print(f"  {label} spread over processes: min {spread(mins):.1f} %, median {spread(meds):.1f} %, "
                      f"max {spread(maxs):.1f} %")
            fq = [b["one_way_placements"].get("fastest_quarter_us") for b in group]
            sq = [b["one_way_placements"].get("slowest_quarter_us") for b in group]
            if group and None not in fq + sq:
                print(f"  {label} fastest / slowest quarter's mean: {[round(x, 3) for x in fq]} / "
                      f"{[round(x, 3) for x in sq]}, spread {spread(fq):.1f} % / {spread(sq):.1f} %")
        # Each place inside one process (pass to pass) and between processes (its figure).
        inside, between = [], []
        places = [b["one_way_placements"] for b in av if b.get("one_way_placements")]
        for pl in places:
            for k in range(len(pl.get("passes_us", [[]])[0])):
                v = [p[k] for p in pl["passes_us"] if k < len(p)]
                inside.append(spread(v))
        if places:
            for k in range(len(places[0]["one_way_latency_us"])):
                between.append(spread([pl["one_way_latency_us"][k] for pl in places]))
        if inside:
            print(f"  a place pass to pass inside a process: median {med(inside):.1f} %, max {max(inside):.1f} %; "
                  f"its figure ({places[0].get('figure')} of {places[0].get('rounds_per_place')}) between "
                  f"processes: median {med(between):.1f} %, max {max(between):.1f} %")
        p1 = [x["one_way"] for x in pv if "one_way" in x]
        if (s, d) == (0, 1):
            ref = []
            for i in range(1, runs + 1):
                try:
                    t = open(f"{work}/ref-{i}.txt").read()
                    ref += [float(x) for x in re.findall(r"pingpong one-way latency: ([\d.]+)", t)]
                except OSError:
                    pass
            print(f"  reference probe as it is (0->1) one-way: {ref}")
            p1 += ref
        if p1 and av:
            lo = min(b["one_way_latency_us"]["min"] for b in av)
            hi = max(b["one_way_latency_us"]["max"] for b in av)
            inside = all(lo * 0.98 <= x <= hi * 1.02 for x in p1)
            print(f"  probe one-way {p1}: inside the agent's range {lo:.3f}-{hi:.3f} (±2 %): {inside}")
        modes = {}
        for b in av:
            for m in b.get("memcpy_modes", []):
                modes.setdefault(round(m["us"], 1), []).append(m["count"])
        print(f"  4-byte copy modes, agent (µs: streams per process): {modes}")
        pm = [x["memcpy"] for x in pv if "memcpy" in x]
        print(f"  4-byte copy, probe per process: {pm}")
        cm = {}
        for b in cv:
            for m in b.get("memcpy_modes", []):
                cm.setdefault(round(m["us"], 1), []).append(m["count"])
        print(f"  4-byte copy modes, agent CONN=8: {cm}")
tunes = sorted({m[1] for m in (re.match(r"tune-(.+)-\d+\.json$", k) for k in walls) if m})
if tunes:
    print("\n== other bench plans (--tune), one-way spread over processes per pair: min / fastest quarter / median / slowest quarter / max ==")
for t in tunes:
    rs = [load(f"tune-{t}-{i}.json") for i in range(1, extra + 1)]
    tw = [walls[f"tune-{t}-{i}.json"][1] for i in range(1, extra + 1) if f"tune-{t}-{i}.json" in walls]
    print(f"{t}: walls {tw}")
    for s in range(n):
        for d in range(n):
            g = [b for r in rs for (a, c, b) in pairs(r) if (a, c) == (s, d)]
            if not g:
                continue
            pl = [b["one_way_placements"] for b in g]
            v = [[b["one_way_latency_us"]["min"] for b in g], [p["fastest_quarter_us"] for p in pl],
                 [b["one_way_latency_us"]["median"] for b in g], [p["slowest_quarter_us"] for p in pl],
                 [b["one_way_latency_us"]["max"] for b in g]]
            print(f"  {s}->{d}: " + " / ".join(f"{spread(x):.1f}" for x in v) + " %   medians " +
                  " / ".join(f"{med(x):.3f}" for x in v))
print("\n== 4-byte copy modes over 8 streams of one process (µs ×streams, each process) ==")
for label in ("conn1", "conn8"):
    for i in range(1, extra + 1):
        r = load(f"streams8-{label}-{i}.json")
        for a, c, b in pairs(r):
            print(f"  {label} process {i} {a}->{c}: " + ", ".join(
                f"{m['us']:.2f} ×{m['count']} {m['streams']}" for m in b.get("memcpy_modes", [])))
print("\n== NCCL ==")
for name in ("nccl-auto.json", "nccl-host-file.json", "nccl-wrong-file.json"):
    r = load(name)
    print(f"{name}: rc/wall {walls.get(name)}")
    for run in (r or {}).get("runs", []):
        print(f"  {run['topology']}: ok={run['ok']} busbw={run['busbw_gbps']} {run['verdict']}")
print("nccl-no-library.txt:", open(f"{work}/nccl-no-library.txt").read().strip(), walls.get("nccl-no-library.txt"))
PY
cp "$work/summary.txt" "$OUT/summary.txt"
tar -C "$work" --exclude=p2pblt --exclude=p2p_lat --exclude=p2p_lat_ref -czf "$OUT/runs.tar.gz" .
cat "$OUT/summary.txt"
