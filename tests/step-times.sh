# Sourced by .ci/run and tests/run: each step's wall time, printed when it ends and once more,
# all together, at the end of tests/run (a cold CI run's log then says where its minutes went).
#   step NAME COMMAND...   runs COMMAND, prints "time: NAME Ns" (and its exit status when not 0),
#                          appends "NAME Ns" to VFIO_P2P_TIMES (exported: .ci/run's steps reach
#                          tests/run's table through exec); returns COMMAND's status
#   print_times            "times: NAME Ns, ...; total Ns" (from VFIO_P2P_TIMES_START on)
: "${VFIO_P2P_TIMES_START:=$(date +%s)}"
export VFIO_P2P_TIMES_START VFIO_P2P_TIMES
step() {
    local name=$1 t0 rc=0 secs
    shift
    t0=$(date +%s)
    "$@" || rc=$?
    secs=$(($(date +%s) - t0))
    echo "time: $name ${secs}s$([ "$rc" = 0 ] || echo " (exit $rc)")"
    VFIO_P2P_TIMES="${VFIO_P2P_TIMES:+$VFIO_P2P_TIMES, }$name ${secs}s"
    return "$rc"
}
print_times() {
    echo "times: ${VFIO_P2P_TIMES:-none}; total $(($(date +%s) - VFIO_P2P_TIMES_START))s"
}
