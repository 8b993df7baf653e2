"""Summary of issue31-variants.sh: walls, phases and median shifts against base."""
import json, sys, statistics as st, glob, collections
o = sys.argv[1]
walls = collections.defaultdict(list)
for l in open(f"{o}/walls.txt"):
    v, i, ms = l.split(); walls[v].append(int(ms) / 1000)
for v, w in walls.items():
    print(f"wall {v:7} {w} median {st.median(w):.3f}")
def med(v):
    m = collections.defaultdict(list); el = []; bench = []; est = []
    for f in sorted(glob.glob(f"{o}/{v}-*.json")):
        try: r = json.load(open(f))
        except Exception as e: print(f, "unreadable", e); continue
        el.append(round(r["elapsed_s"], 3)); bench.append(round(dict(r["phases"]["laps"] if isinstance(r["phases"], dict) else r["phases"]).get("bench (latency, bandwidth)"), 3))
        est.append(round((r.get("schedule") or {}).get("total_s"), 2))
        for p in r["pairs"]:
            b = p.get("bench") or {}
            for k, x in b.items():
                if isinstance(x, dict) and isinstance(x.get("median"), float):
                    m[(p["src"], p["dst"], k)].append(x["median"])
    print(f"{v}: elapsed {el} bench {bench} 8-GPU estimate {est}")
    return {k: st.median(x) for k, x in m.items()}
b = med("base"); worst = {}
for v in [v for v in walls if v not in ("p2pblt", "base")]:
    c = med(v); w = collections.defaultdict(float)
    for k in b:
        if k in c:
            d = (c[k] - b[k]) / b[k] * 100
            w[k[2]] = max(w[k[2]], abs(d))
    worst[v] = w
    print(v, "vs base, largest |median diff| % per metric:", {k: round(x, 2) for k, x in sorted(w.items())})
m = {v: st.median(w) for v, w in walls.items()}
pick = "D" if "D" in m and m["D"] <= m["p2pblt"] and worst["D"]["disabled_bandwidth_gbps"] < worst["C"]["disabled_bandwidth_gbps"] else "C"
print("PICK", pick)
