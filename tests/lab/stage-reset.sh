# shellcheck shell=dash
# shellcheck disable=SC2086 # lists of BDFs: split on purpose
# shellcheck disable=SC2016 # the $ in single quotes are jq and awk variables
# shellcheck disable=SC2015 # "test && test || fail": fail only records, so this is what is meant
# shellcheck disable=SC2034 # NOTE is read by level-a.sh's run_stage
# Stage reset (issue #32, "the stand-ins' resets observed through the kernel"), sourced by
# level-a.sh. host.yaml's `reset:` in a host root of this stage's own (as stage fabric does),
# then the resets a tenant handover causes, seen by the kernel:
# - Debian's 6.1 logs nothing for a reset that works, except with dynamic debug on pciehp
#   (drivers/pci/hotplug/pciehp_hpc.c, pciehp_reset_slot: "SLOTCTRL %x write cmd %x", once
#   masking the slot's link and presence events, once unmasking them, named by the port) when
#   the port is pciehp's, as level A's are; that names the port but not the method, so the lab
#   also puts kprobes on the two functions that do the work, pci_reset_secondary_bus (the
#   bridge whose Secondary Bus Reset bit is toggled) and pcie_flr (the function), with their
#   kernel stacks, into the kernel's trace buffer (tracefs), cut at trace_marker lines;
# - a method the device lacks is refused by the kernel in its log (drivers/pci/pci.c,
#   reset_method_store: "Unsupported reset method '%s'"), which check's reset-policy must agree
#   with. bochs-display has no FLR capability: reset_method offers `bus` only.
# The kprobes read struct pci_dev (Linux 6.1 x86-64): vendor at +60, devfn at +56, subordinate
# bus at +24, its number at +216. The stage checks the vendor read there against the port's
# sysfs vendor, so a layout that moved fails the stage instead of naming the wrong bridge.
RESET_ROOT=/tmp/reset-root
TR=/sys/kernel/tracing

reset_trace_on() {
    [ -e $TR/kprobe_events ] || mount -t tracefs tracefs $TR || return 1
    echo 0 > $TR/tracing_on
    echo > $TR/trace
    echo 'p:lab/sbr pci_reset_secondary_bus vendor=+60(%di):u16 devfn=+56(%di):u32 secondary=+216(+24(%di)):u8' >> $TR/kprobe_events &&
        echo 'p:lab/flr pcie_flr vendor=+60(%di):u16 devfn=+56(%di):u32' >> $TR/kprobe_events || return 1
    echo 1 > $TR/events/lab/enable && echo 1 > $TR/options/stacktrace && echo 1 > $TR/tracing_on
}
reset_mark() { echo "lab: $1" > $TR/trace_marker; }
# reset_events MARK: the resets traced after MARK (up to the next mark), one line each:
# "sbr vendor=0x1b36 devfn=8 secondary=21 via f1,f2,..." (the kernel stack, innermost first)
reset_events() {
    awk -v m="lab: $1" '
        /tracing_mark_write: / { if (on) exit; if (index($0, m) && substr($0, length($0) - length(m) + 1) == m) on = 1; next }
        !on { next }
        / (sbr|flr): / { if (ev != "") print ev " via " st; st = ""
                         ev = ($0 ~ / sbr: /) ? "sbr" : "flr"
                         for (i = 1; i <= NF; i++) if ($i ~ /^(vendor|devfn|secondary)=/) ev = ev " " $i
                         next }
        /^ *=> / { st = st (st == "" ? "" : ",") $2 }
        END { if (ev != "") print ev " via " st }' $TR/trace |
        awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^vendor=/) { split($i, v, "="); $i = sprintf("vendor=0x%04x", v[2]) } print }'
}
port_bdf() { basename "$(dirname "$(readlink -f "$(dev "$1")")")"; }
# port_of BDF: the bridge a bus reset of BDF toggles ("vendor=0x1b36 devfn=8 secondary=21")
port_of() {
    local p slot
    p=$(port_bdf "$1")
    slot=$(echo "$p" | cut -d: -f3 | cut -d. -f1)
    echo "vendor=$(cat "$(dev "$p")/vendor") devfn=$((0x$slot * 8 + ${p##*.})) secondary=$((0x$(echo "$1" | cut -d: -f2)))"
}
# bus_reset_seen MARK BDF CALLER: a bus reset of BDF's own port after MARK, from CALLER (a
# kernel function on its stack), and no FLR
bus_reset_seen() {
    reset_events "$1" | grep -q "^sbr $(port_of "$2") via .*$3" && ! reset_events "$1" | grep -q '^flr '
}
# rvp ARGS: our binary against the stage's host root (host.yaml there, sys/dev/proc/run the chroot's)
rvp() { vp --sysfs-root $RESET_ROOT "$@"; }
reset_policy() { printf 'reset: %s\n' "$1" > $R$RESET_ROOT/etc/vfio-p2p/host.yaml; }
# reset_row FILE BDF: check's reset-policy row for BDF as "status saw"
reset_row() { jqr -r --arg b "$2" '.checks[] | select(.check == "reset-policy" and .subject == $b) | "\(.status | ascii_downcase) \(.saw)"' < "$1"; }

stage_reset() {
    local b rc row before offered n=0 other KLOG="slot resets in dmesg (pciehp dynamic debug)"
    RESET_GPUS="$GPU_SW0 $GPU_RP"   # behind a switch downstream port; behind a root port
    mkdir -p $R$RESET_ROOT/etc/vfio-p2p
    for d in sys dev proc run boot; do ln -sfn /$d $R$RESET_ROOT/$d; done
    reset_trace_on || { fail "no kprobe events (tracefs) in this kernel"; return 1; }
    echo 'file pciehp_hpc.c +p' > /proc/dynamic_debug/control || fail "no dynamic debug for pciehp"
    rc=0; vp unbind --all || rc=$?
    [ $rc = 0 ] || fail "unbind --all exited $rc"
    before=$(state $RESET_GPUS)
    for b in $RESET_GPUS; do
        offered=$(cat "$(dev "$b")/reset_method")
        echo "$b: reset_method '$offered', its port: $(port_of "$b")"
        [ "$offered" = bus ] || fail "$b offers '$offered', expected bus only (bochs-display has no FLR)"
    done
    # flr: the kernel refuses the method in its log, check's row fails, bind refuses and changes nothing
    reset_policy flr
    rc=0; rvp check --host-config $RESET_ROOT/etc/vfio-p2p/host.yaml --gpus "$(csv $RESET_GPUS)" --format json > /out/reset-check-flr.json || rc=$?
    for b in $RESET_GPUS; do
        dmesg_mark "reset-flr-$b"
        echo flr > "$(dev "$b")/reset_method" 2> /dev/null && fail "the kernel took flr for $b"
        row=$(reset_row /out/reset-check-flr.json "$b")
        echo "$b reset: flr: kernel: $(dmesg_since "reset-flr-$b" | grep -o "Unsupported reset method.*")"
        echo "$b reset: flr: check: $row"
        dmesg_since "reset-flr-$b" | grep -q "$(echo "${b#0000:}" | sed 's/\./\\./'): Unsupported reset method 'flr'" ||
            fail "$b: no \"Unsupported reset method 'flr'\" in level A's kernel log"
        case $row in fail*"offers no flr reset"*) ;; *) fail "$b: check's reset-policy under flr is '$row', the kernel refuses flr" ;; esac
        [ "$(cat "$(dev "$b")/reset_method")" = bus ] || fail "$b: reset_method changed by the refused write"
    done
    displays_off $RESET_GPUS
    rc=0; rvp bind $RESET_GPUS > /out/reset-bind-flr.txt 2>&1 || rc=$?
    cat /out/reset-bind-flr.txt
    [ $rc != 0 ] && [ "$(state $RESET_GPUS)" = "$before" ] || fail "bind under reset: flr: exit $rc, $(state $RESET_GPUS)"
    # auto: the kernel's own order, which is bus for these
    reset_policy auto
    rvp check --host-config $RESET_ROOT/etc/vfio-p2p/host.yaml --gpus "$(csv $RESET_GPUS)" --format json > /out/reset-check-auto.json
    for b in $RESET_GPUS; do
        row=$(reset_row /out/reset-check-auto.json "$b"); echo "$b reset: auto: check: $row"
        case $row in "pass reset: auto; bind leaves the kernel's order (bus)") ;; *) fail "$b: check under auto: '$row'" ;; esac
    done
    # bus: check passes, bind sets and records it, and each tenant handover resets the stand-in's own port
    reset_policy bus
    rvp check --host-config $RESET_ROOT/etc/vfio-p2p/host.yaml --gpus "$(csv $RESET_GPUS)" --format json > /out/reset-check-bus.json
    displays_off $RESET_GPUS
    rc=0; rvp bind $RESET_GPUS > /out/reset-bind-bus.txt 2>&1 || rc=$?
    cat /out/reset-bind-bus.txt
    [ $rc = 0 ] || fail "bind under reset: bus exited $rc"
    cp $R/run/vfio-p2p/state.json /out/reset-bind-record.json 2> /dev/null
    for b in $RESET_GPUS; do
        row=$(reset_row /out/reset-check-bus.json "$b"); echo "$b reset: bus: check: $row"
        case $row in "pass reset: bus; bind sets reset_method bus"*) ;; *) fail "$b: check under bus: '$row'" ;; esac
        [ "$(driver_of "$b")" = vfio-pci ] || fail "$b on '$(driver_of "$b")' after bind"
        [ "$(cat "$(dev "$b")/reset_method")" = bus ] || fail "$b: reset_method '$(cat "$(dev "$b")/reset_method")' after bind, expected bus"
        # reset_method was exactly `bus` already: bind writes and records nothing (a change is
        # recorded with what it replaced: bind's own tests; the stand-ins offer nothing else)
        jqr -e --arg b "$b" '.devices[$b] != null and .devices[$b].reset == null' < /out/reset-bind-record.json > /dev/null ||
            fail "$b: the bind record (/run/vfio-p2p/state.json) is missing or records a reset change where none was made"
        # the handover: a VMM opens the device (vfio-pci resets it) and closes it (again)
        reset_mark "handover-$b"; dmesg_mark "handover-$b"
        vp check --gpus "$b" --deep --format json > /out/reset-handover-$b.json
        reset_mark "sysfs-$b"; dmesg_mark "sysfs-$b"
        echo 1 > "$(dev "$b")/reset" || fail "$b: writing 1 to reset failed"
        reset_mark "end-$b"; dmesg_mark "end-$b"
        dmesg_since "handover-$b" | sed "/vfio-p2p-lab: end-$b starts/q" > /out/reset-dmesg-$b.txt
        echo "$b level A's kernel log (pciehp dynamic debug):"; grep pciehp_reset_slot /out/reset-dmesg-$b.txt | sed 's/^/  /'
        # two lines per reset (mask, unmask): open, close and sysfs; only where the kernel has that
        # debug line (6.1, 6.12; sid's 7.2 has none: its log names a reset once per bridge, "unlocked
        # secondary bus reset via: pciehp_reset_slot", which an earlier stage may have used up)
        if grep -q 'pciehp_reset_slot' /proc/dynamic_debug/control; then
            [ "$(grep -c "$(port_bdf "$b"): pciehp: pciehp_reset_slot: SLOTCTRL" /out/reset-dmesg-$b.txt)" -ge 6 ] ||
                fail "$b: level A's kernel log has not 3 slot resets of its port $(port_bdf "$b") (pciehp_reset_slot)"
        else
            KLOG="no pciehp_reset_slot debug line in this kernel: the resets are asserted from the trace only"
            echo "note: $KLOG"
        fi
        echo "$b handover (check --deep opens and closes the VFIO device):"; reset_events "handover-$b" | sed 's/^/  /'
        echo "$b sysfs reset:"; reset_events "sysfs-$b" | sed 's/^/  /'
        bus_reset_seen "handover-$b" "$b" vfio_pci_core && n=$((n + 1)) ||
            fail "$b: no bus reset of its port ($(port_of "$b")) from vfio-pci when the device was opened and closed"
        bus_reset_seen "sysfs-$b" "$b" reset_store || fail "$b: no bus reset of its port ($(port_of "$b")) from sysfs reset"
    done
    # the assertion can fail: the other stand-in's port is not what these resets hit
    other=$(echo $RESET_GPUS | cut -d' ' -f1)
    bus_reset_seen "handover-$(echo $RESET_GPUS | cut -d' ' -f2)" "$other" vfio_pci_core &&
        fail "the handover of $(echo $RESET_GPUS | cut -d' ' -f2) also matches $other's port: the check cannot tell ports apart"
    rc=0; rvp unbind $RESET_GPUS || rc=$?
    [ $rc = 0 ] && [ "$(state $RESET_GPUS)" = "$before" ] || fail "unbind: exit $rc, $(state $RESET_GPUS), before: $before"
    cp $TR/trace /out/reset-trace.txt
    NOTE="flr refused by kernel and check; bus: $n handover(s) reset the stand-in's own port (kprobe pci_reset_secondary_bus from vfio-pci; $KLOG)"
    [ -z "$WHY" ]
}
