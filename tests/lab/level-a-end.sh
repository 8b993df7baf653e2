# Why level A's QEMU ended, sourced by tests/lab/run; host-tool/tests/all/lab_script.rs feeds it
# made-up runs (a panic, a reset, a power-off, a deadline, a wedge) and checks each verdict.
# Inputs: LAB_TIMEOUT; outputs: words for the "not reached" rows and the rerun decision.

# Level A's kernel dying before its stages are done (seen once in a clean-clone rehearsal: trixie's
# 6.12 under TCG, "Oops: int3" in the idle task's __schedule during stage check, then "Kernel panic -
# not syncing: Fatal exception in interrupt", level A exit 0, every later stage not reached): level
# A runs again as it was (run_level_a, up to LAB_DEATH_RERUNS times)
KERNEL_DIED='Kernel panic - not syncing.*'

# level_a_end RUN RC: why level A's QEMU ended, in words (every "not reached" row carries it):
# its own deadline, the wedge watcher, its kernel dying, a reset (-no-reboot turns a reboot or
# a triple fault into exit 0), or the power-off level-a.sh does after its last stage (LAB-END)
level_a_end() {
    local run=$1 rc=$2 died
    died=$(grep -a -m1 -E "$KERNEL_DIED" "$run/serial.log" | tr -d '\r' || true)
    if [ "$rc" = 124 ]; then echo "ran out of its deadline (LAB_TIMEOUT=${LAB_TIMEOUT}s)"
    elif [ -e "$run/wedged" ]; then echo "was stopped: $(cat "$run/wedged")"
    elif [ -n "$died" ]; then echo "kernel died: $died"
    elif grep -aq '^LAB-END poweroff' "$run/serial.log"; then echo "powered off after its last stage (exit $rc)"
    elif [ "$rc" = 0 ]; then echo "reset without powering off (exit 0 under -no-reboot: a reboot or triple fault; last console line: $(grep -av '^\s*$' "$run/serial.log" | tail -n1 | tr -d '\r' | cut -c1-160))"
    else echo "QEMU exited $rc before level A powered off"
    fi
}

# level_a_died_not_ours: the last level A ended by its kernel dying or by a reset before its
# power-off, with stages left unreached — not a stage failing, a deadline or a wedge
level_a_died_not_ours() {
    [ "$A_UNREACHED" -gt 0 ] || return 1
    case $A_END in "kernel died: "*|"reset without powering off"*) return 0 ;; *) return 1 ;; esac
}
