#!/usr/bin/env python3
"""Summary of a bench/issue31.sh run: walls side by side, medians of this build against
the previous one, where the setup goes, cross-process, the self-test and the fabric check.
Usage: issue31-summary.py WORK_DIR RUNS"""
import glob
import json
import re
import statistics
import sys

work, runs = sys.argv[1], int(sys.argv[2])
t = open(f"{work}/timings.txt").read()
print(t)


def wall(name):
    m = re.search(re.escape(name) + r"\s+rc=(\d+)\s+([0-9.]+) s", t)
    return (int(m.group(1)), float(m.group(2))) if m else (None, None)


def load(name):
    try:
        return json.load(open(f"{work}/{name}"))
    except Exception as e:  # noqa: BLE001 - a summary names what it could not read
        print(f"{name}: unreadable ({e})")
        return None


def med(v):
    v = [x for x in v if x is not None]
    return statistics.median(v) if v else None


def walls(prefix):
    return [wall(f"{prefix}-{i}{ext}")[1] for i in range(1, runs + 1)
            for ext in (".txt", ".json") if wall(f"{prefix}-{i}{ext}")[1] is not None]


print("== wall s (same machine, alternating) ==")
for prefix in ("p2pblt", "report", "base", "warm-p2pblt", "warm-report"):
    w = walls(prefix)
    print(f"{prefix:14s} {w} median {med(w)}")
b, r = med(walls("p2pblt")), med(walls("report"))
if b and r:
    print(f"report / p2pBandwidthLatencyTest: {r / b:.2f}x ({r - b:+.2f} s)")

METRICS = ("one_way_latency_us", "remote_read_latency_us", "local_read_latency_us",
           "memcpy_latency_us", "ce_bandwidth_gbps", "ce_bidir_bandwidth_gbps",
           "sm_copy_bandwidth_gbps", "disabled_bandwidth_gbps", "disabled_memcpy_latency_us")


def medians(prefix):
    out = {}
    for i in range(1, runs + 1):
        rep = load(f"{prefix}-{i}.json")
        if not rep:
            continue
        for p in rep["pairs"]:
            bench = p.get("bench") or {}
            for m in METRICS:
                s = bench.get(m)
                if s:
                    out.setdefault((p["src"], p["dst"], m), []).append(s["median"])
    return {k: med(v) for k, v in out.items()}


print("== medians over the runs: this build vs the previous (pair, metric, new, base, diff %) ==")
new, base = medians("report"), medians("base")
worst = {}
for k in sorted(new):
    if k in base and base[k]:
        d = 100 * (new[k] - base[k]) / base[k]
        worst[k[2]] = max(worst.get(k[2], 0), abs(d))
        print(f"{k[0]}->{k[1]} {k[2]:28s} {new[k]:9.3f} {base[k]:9.3f} {d:+6.2f} %")
print("largest |diff| per metric:", {m: round(v, 2) for m, v in worst.items()})

for i in range(1, runs + 1):
    rep = load(f"report-{i}.json")
    if rep:
        print(f"report-{i}: elapsed {rep['elapsed_s']:.2f} phases "
              f"{[(n, round(s, 3)) for n, s in rep.get('phases') or []]} "
              f"rounds {[(round(x['bench_s'], 3), x['concurrent']) for x in rep.get('rounds') or []]} "
              f"schedule {rep.get('schedule')}")
    rep = load(f"base-{i}.json")
    if rep:
        print(f"base-{i}: elapsed {rep['elapsed_s']:.2f} phases "
              f"{[(n, round(s, 3)) for n, s in rep.get('phases') or []]}")

print("== setup timeline medians (s): cuInit, contexts span, modules span, total ==")
for v in ("threads", "serial", "lazy", "eager"):
    ps = [load(f"probe-{v}-{i}.json") for i in range(1, runs + 1)]
    ps = [p for p in ps if p]
    if ps:
        print(f"{v:8s} cuInit {med([p['cuinit']['end_s'] for p in ps]):.3f} "
              f"contexts {med([p['contexts_s'] for p in ps]):.3f} "
              f"modules {med([p['modules_s'] for p in ps]):.3f} "
              f"total {med([p['total_s'] for p in ps]):.3f} "
              f"nvml {[p['nvml'] for p in ps][0]} "
              f"per-GPU context spans {[(c[1]['start_s'], c[1]['end_s']) for c in ps[0]['contexts']]}")
ps = [load(f"warm-probe-threads-{i}.json") for i in range(1, runs + 1)]
ps = [p for p in ps if p]
if ps:
    print(f"warm     cuInit {med([p['cuinit']['end_s'] for p in ps]):.3f} "
          f"contexts {med([p['contexts_s'] for p in ps]):.3f} total {med([p['total_s'] for p in ps]):.3f}")
try:
    print(open(f"{work}/per-process.txt").read().strip())
    for f in sorted(glob.glob(f"{work}/probe-proc-1-*.json")):
        p = json.load(open(f))
        print(f"  {f.split('probe-proc-1-')[1]}: cuInit {p['cuinit']['end_s']:.3f} "
              f"context {p['contexts_s']:.3f} total {p['total_s']:.3f}")
except Exception as e:  # noqa: BLE001
    print(f"per-process: {e}")

print("== cross-process ==")
for name in ("cross-process.json", "report-cross-process.json"):
    print(f"{name}: rc/wall {wall(name)}")
x = load("cross-process.json") or []
print(f"checks {len(x)}, ok {sum(1 for c in x if c.get('error') is None and c.get('write') and c['write']['bad_words'] == 0)}, "
      f"GB/s {[round(c['write_gbps'] or 0, 1) for c in x]}")
for c in x:
    if c.get("error"):
        print(f"  {c['src']}->{c['dst']} {c['kind']}: {c['error']}")
rc = load("report-cross-process.json")
if rc:
    print("report --cross-process phases", [(n, round(s, 3)) for n, s in rc.get("phases") or []])

print("== --inject ==")
for name in ("inject-report.json", "inject-src-only.json"):
    rep = load(name)
    print(f"{name}: rc/wall {wall(name)}")
    if rep is None:
        continue
    pairs = rep["pairs"] if isinstance(rep, dict) else [{"verify": v, "summary": ""} for v in rep]
    for p in pairs:
        v = p.get("verify") or {}
        print(f"  kernel {v.get('kernel_write')} ce {v.get('ce_copy')} | {p.get('summary', '')}")

print("== fabric ==")
print(open(f"{work}/expectations.txt").read().strip())
for name in ("expect-good.json", "expect-wrong-module.json", "report-expect-good.json",
             "report-expect-wrong-module.json"):
    rep = load(name)
    f = (rep or {}).get("fabric") if isinstance(rep, dict) else None
    print(f"{name}: rc/wall {wall(name)} problems {f and f['problems']} "
          f"states {f and [(g['bdf'], g['module_id'], g['state'], g['status']) for g in f['gpus']]}")
for name in ("topo-no-expectation.txt", "scan.txt"):
    print(f"{name}: rc/wall {wall(name)}")
