#!/usr/bin/env python3
"""Summary of issue31-ideas.sh's folder: per variant the wall times, the process's start
(exec to main) and end (last mark to gone), the report's setup and bench phases, and each
variant's largest median shift against `base` (the earlier batches) per metric."""
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

o = Path(sys.argv[1])
METRICS = ["one_way_latency_us", "remote_read_latency_us", "local_read_latency_us",
           "memcpy_latency_us", "ce_bandwidth_gbps", "ce_bidir_bandwidth_gbps",
           "sm_copy_bandwidth_gbps", "disabled_bandwidth_gbps", "disabled_memcpy_latency_us"]


def med(v):
    return statistics.median(v) if v else None


def fmt(v):
    return "-" if v is None else f"{v:.3f}"


runs = defaultdict(list)
for line in (o / "walls.txt").read_text().split("\n"):
    if not line.strip():
        continue
    v, i, s, e, rc = line.split()
    runs[v].append((int(i), int(s), int(e), int(rc)))

print(open(o / "env.txt").read().strip())
print("== per variant: wall, exec->main, last mark->gone, CUDA setup phase, bench phase, elapsed (s, medians; walls listed) ==")
medians = {}
for v, rs in runs.items():
    walls, starts, ends, setup, bench, elapsed, rcs = [], [], [], [], [], [], []
    per_pair = defaultdict(lambda: defaultdict(list))
    for i, s, e, rc in rs:
        walls.append((e - s) / 1e9)
        rcs.append(rc)
        marks = {}
        for ln in (o / f"{v}-{i}.err").read_text().split("\n"):
            p = ln.split()
            if len(p) == 3 and p[0] == "mark":
                marks[p[1]] = int(p[2])
        if "main" in marks:
            starts.append((marks["main"] - s) / 1e9)
        if "exit" in marks:
            ends.append((e - marks["exit"]) / 1e9)
        out = (o / f"{v}-{i}.out").read_text()
        if not out.lstrip().startswith("{"):
            continue
        try:
            r = json.loads(out)
        except json.JSONDecodeError:
            continue
        if "pairs" in r:
            elapsed.append(r.get("elapsed_s", 0))
            for name, secs in r.get("phases") or []:
                if name.startswith("CUDA init"):
                    setup.append(secs)
                if name.startswith("bench"):
                    bench.append(secs)
            for p in r["pairs"]:
                b = p.get("bench") or {}
                for m in METRICS:
                    st = b.get(m)
                    if st:
                        per_pair[(p["src"], p["dst"])][m].append(st["median"])
        elif "cuinit" in r:
            setup.append(r["total_s"])
            bench.append(r["contexts_s"])
    medians[v] = {k: {m: med(x) for m, x in d.items()} for k, d in per_pair.items()}
    print(f"{v:14} wall {fmt(med(walls))} start {fmt(med(starts))} end {fmt(med(ends))} "
          f"setup {fmt(med(setup))} bench {fmt(med(bench))} elapsed {fmt(med(elapsed))} "
          f"rc {sorted(set(rcs))} walls {[round(w, 3) for w in walls]}")
print("(setup-probe rows: setup = total_s, bench = the contexts' span)")
print("== largest |median diff| % against base per metric (medians over the runs, each pair) ==")
base = medians.get("base", {})
for v, pairs in medians.items():
    if v == "base" or not pairs:
        continue
    worst = {}
    for k, ms in pairs.items():
        for m, x in ms.items():
            b = base.get(k, {}).get(m)
            if b and x is not None:
                d = (x - b) / b * 100
                if abs(d) > abs(worst.get(m, 0)):
                    worst[m] = d
    print(f"{v:14} " + " ".join(f"{m.replace('_gbps', '').replace('_us', '')} {d:+.2f}" for m, d in sorted(worst.items())))
print("== medians of base ==")
for k, ms in base.items():
    print(k, {m: round(x, 3) for m, x in ms.items()})
print("== setup-probe detail (first run of each) ==")
for v in [v for v in runs if v.startswith("probe")]:
    try:
        r = json.loads((o / f"{v}-1.out").read_text())
    except (json.JSONDecodeError, FileNotFoundError):
        continue
    print(v, "cuinit", r["cuinit"], "contexts", r["contexts"], "plain", r.get("plain_contexts"))
