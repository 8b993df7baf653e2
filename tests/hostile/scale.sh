#!/usr/bin/env bash
# Issue 28's scale figures, from the release binary on flat dumps (tests/hostile/flat_host.py):
# seconds and peak memory of `plan` and `place --shape 500x8` on 4,000 GPUs and `topo` on
# 10,000 (targets: < 2 s and < 256 MB; topo < 5 s). A benchmark, not a test: it prints.
#   tests/hostile/scale.sh [TARGET_DIR]   (default target/release; cargo build --release --bins)
#
# Recorded on the shared 2-core machine (loaded), release build:
#   before (issue 28, d3584e3): plan 4,000 flat 26 s / 644 MB; plan --p2p-level sys on a
#     4,000-GPU tree 116 s / 2.27 GB / 236 MB of output; topo 10,000 flat 160 s, then an abort
#     at 4 GB; place 125x8 on 1,000 flat 55 s, 500x8 on 4,000 killed after 420 s.
#   after (this script): plan 4,000 flat 0.20 s / 16.5 MB (json 0.21 s); topo 10,000 flat
#     0.37 s / 33 MB (json 0.25 s / 35 MB); plan --p2p-level sys on 4,000 flat 0.23 s / 16.5 MB;
#     `cargo bench --bench plan`: 4,000-GPU tree 72 ms (pxb: refused, 125 cliques), 114 ms
#     (node), 127 ms (sys). place was unchanged: 125x8 on 1,000 flat 36.5 s (9.95 s unloaded),
#     500x8 on 4,000 killed at 60 s (its seeds-times-units search is quadratic).
#   after place-scale (pair links on demand, incremental growth, early stop on hosts whose
#     GPUs all sit alike): place 125x8 on 1,000 flat 0.02 s / 9 MB, 500x8 on 4,000 flat
#     0.26 s / 18 MB, same JSON as before. Hosts with switch trees still try every seed.
#   after issue 39 (host bridge first, seed cache; `cargo bench --bench place`): 500x8 on
#     4,000 switched GPUs 1.7 s / 85 MB, 1250x8 on 10,000 flat over two domains 1.3 s.
set -u
here=$(cd "$(dirname "$0")" && pwd)
target=${1:-$here/../../target/release}
bin=$target/vfio-p2p
limit=${SCALE_LIMIT:-600}
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
python3 "$here/flat_host.py" 4000 >"$w/flat4000.json"
python3 "$here/flat_host.py" 10000 >"$w/flat10000.json"
echo "case                              |      s |   peak MB | exit | output bytes"
run() {
	local name=$1
	shift
	/usr/bin/time -f '%e %M' -o "$w/time" timeout -s KILL "$limit" "$@" >"$w/out" 2>"$w/err"
	local rc=$?
	# the last line: /usr/bin/time puts "Command exited with non-zero status N" before it
	read -r secs kb < <(tail -n1 "$w/time") || { secs=?; kb=0; }
	printf '%-33s | %6s | %9.1f | %4s | %s\n' "$name" "$secs" "$(echo "$kb / 1024" | bc -l)" "$rc" "$(wc -c <"$w/out")"
}
run "plan, 4,000 flat GPUs" "$bin" --sysfs-root "$w/flat4000.json" plan
run "plan --format json, 4,000 flat" "$bin" --sysfs-root "$w/flat4000.json" plan --format json
run "place --shape 500x8, 4,000 flat" "$bin" --sysfs-root "$w/flat4000.json" place --shape 500x8
run "topo, 10,000 flat GPUs" "$bin" --sysfs-root "$w/flat10000.json" topo
run "topo --format json, 10,000 flat" "$bin" --sysfs-root "$w/flat10000.json" topo --format json
