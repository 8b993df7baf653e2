# shellcheck shell=bash
# Sourced by the GPU bench scripts (gpu1-smoke.sh, h200x2-issue17.sh); they set $work (a
# scratch dir), $times (the timings file) and, for a run with a whole-run limit, $budget (s).
#
# step LIMIT_S NAME CMD…: CMD under a time limit (cut to what is left of $budget, if set),
# stdout to $work/NAME, stderr to $work/NAME.err, its exit status and wall time appended to
# $times (never into NAME). A step with no budget left is skipped and returns 124.
# shellcheck disable=SC2154 # $work and $times are the caller's
step() {
    local limit=$1 name=$2 t0 rc ms left; shift 2
    if [ -n "${budget:-}" ]; then
        left=$((budget - SECONDS))
        if [ "$left" -lt 2 ]; then
            printf '%-34s skipped: the %d s budget is spent   %s\n' "$name" "$budget" "$*" >>"$times"
            return 124
        fi
        [ "$limit" -gt "$left" ] && limit=$left
    fi
    t0=$(date +%s%N)
    timeout --kill-after=5 "$limit" "$@" >"$work/$name" 2>"$work/$name.err"
    rc=$?
    ms=$((($(date +%s%N) - t0) / 1000000))
    printf '%-34s rc=%-3d %d.%03d s   %s\n' "$name" "$rc" $((ms / 1000)) $((ms % 1000)) "$*" >>"$times"
    return $rc
}
