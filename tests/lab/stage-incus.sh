# shellcheck shell=dash
# shellcheck disable=SC2086 # lists of BDFs and options: split on purpose
# shellcheck disable=SC2016 # the $ in single quotes are jq's
# Stage incus, sourced by level-a.sh (the helpers there: C, vp, jqr, fail, b_section, ...).
#
# Incus for real (docs/integrations.md, "Incus"): level A runs incusd from the stack's root
# (Debian sid: Incus 7.0.2 with gpu_physical_clique), initialised minimally (a `dir` pool, no
# network); `vfio-p2p gen incus` makes the profile for level B's GPUs, Incus takes it, binds the
# stand-ins to vfio-pci itself and starts level B as an Incus VM. Incus refuses the profile with
# a misspelt key; `check --incus-config` passes the VM's expanded config and fails it without
# the cliques. In level B the agent's scan finds the planned cliques at 0xc8, and `expect`
# passes against an expectation made in level A from the plan and the guest addresses QEMU
# reports for Incus's devices (Incus picks those, so gen writes none): it reaches level B over
# vsock (level-b.sh, lab_b=incus), as does a wrong one (every clique moved by one), which fails.
#
# What the lab adds to the VM through Incus's own keys (the stand-ins are not NVIDIA parts, and
# sid's QEMU 11.1 does not boot a guest under level A's nested KVM): raw.qemu gives the lab's
# kernel and initramfs (Incus then starts the VM without its UEFI firmware), `-cpu max`, a second
# serial port into /out, a QMP socket for the guest addresses; raw.qemu.conf sets the machine's
# accel to tcg and gives each GPU device (`dev-incus_gpuN`) the NVIDIA ids, as the other stages do.
# Run it as `LAB_STACK=sid LAB_KERNEL_STACK=trixie LAB_STAGES=incus tests/lab/run`: level A then
# runs trixie's kernel under trixie's QEMU (sid's userspace, Incus and QEMU inside), where level B
# under TCG boots in ~11 minutes; under sid's own kernel and QEMU it did not in 15.

INCUS_VM=lab-b
INCUS_LOG=/out/level-b-incus.log
INCUS_TTYS0=/out/level-b-incus-ttyS0.log   # Incus's console; level B writes to both
INCUS_QMP=/run/lab-b-qmp.sock
INCUS_EXPECT_PORT=7390   # level B fetches its expectation here (the wrong one: +1)

# the client keeps its config under $HOME (/root is read-only here)
incus_c() { C HOME=/tmp timeout 300 incus "$@"; }
incus_sh() { C HOME=/tmp timeout 300 sh -c "$1"; }

# incusd_start: writable state on tmpfs (the root is read-only 9p), cgroup2, vhost_vsock, then
# incusd in the background and a minimal init: a dir pool and a root disk, no network
incusd_start() {
    local d
    # /var/cache/incus is not in the package (incusd makes it): a tmpfs over /var/cache, for the stage
    for d in /var/lib/incus /var/log/incus /var/cache; do mount -t tmpfs tmpfs $R$d || return 1; done
    mkdir -p $R/var/cache/incus
    grep -q " $R/sys/fs/cgroup " /proc/mounts || mount -t cgroup2 cgroup2 $R/sys/fs/cgroup || echo "note: no cgroup2"
    modprobe vhost_vsock || { fail "modprobe vhost_vsock failed (Incus VMs need it)"; return 1; }
    # incusd runs `modprobe vfio-pci`: under another stack's kernel (LAB_KERNEL_STACK) the root
    # has no modules of it, so it sees level A's (from the initramfs)
    if [ ! -d "$R/lib/modules/$(uname -r)" ]; then
        mount -t tmpfs tmpfs $R/lib/modules && mkdir $R/lib/modules/"$(uname -r)" &&
            mount --bind /lib/modules/"$(uname -r)" $R/lib/modules/"$(uname -r)" || { fail "cannot give incusd level A's modules"; return 1; }
    fi
    C HOME=/root timeout "$TIMEOUT_A" /usr/libexec/incus/incusd --group root --logfile $O/incusd.log \
        > /out/incusd.out 2>&1 &
    INCUSD=$!
    incus_c admin waitready --timeout 280 || { fail "incusd did not get ready (incusd.log)"; return 1; }
    printf 'storage_pools:\n- name: default\n  driver: dir\nprofiles:\n- name: default\n  devices:\n    root:\n      type: disk\n      path: /\n      pool: default\n      size: 64MiB\n' \
        > /out/incus-preseed.yaml
    incus_sh "incus admin init --preseed < $O/incus-preseed.yaml" || { fail "incus admin init --preseed failed"; return 1; }
    incus_c version
}

incusd_stop() {
    incus_c delete -f $INCUS_VM > /dev/null 2>&1
    incus_c admin shutdown --timeout 60 > /dev/null 2>&1 || kill "$INCUSD" 2> /dev/null
    wait "$INCUSD" 2> /dev/null
    for d in /var/cache /var/log/incus /var/lib/incus /lib/modules/"$(uname -r)" /lib/modules; do umount -l $R$d 2> /dev/null; done
}

# incus_expect_server: answers each vsock connection on INCUS_EXPECT_PORT (right) and the next
# port (wrong) with an expectation made now: the plan's cliques, the guest address QEMU reports
# (query-pci) for each of Incus's GPU devices, the profile's host address of each
incus_expect_server() {
    cat > $R/tmp/lab-incus-expect.sh << 'EOF'
#!/bin/sh
# $1: right or wrong; the expectation for level B, from QEMU's placement of Incus's devices
{ printf '%s\n' '{"execute":"qmp_capabilities"}' '{"execute":"query-pci"}'; sleep 3; } |
    socat - UNIX-CONNECT:/run/lab-b-qmp.sock > /tmp/query-pci.$1 2>&1
jq -c 'select(.return | type == "array")' < /tmp/query-pci.$1 | tee /tmp/out/incus-query-pci.json |
jq -c --arg wrong "$1" --rawfile map /tmp/out/incus-gpus.txt --slurpfile plan /tmp/out/plan-incus.json '
    def hx: if . < 16 then "0123456789abcdef"[.:. + 1] else ((. / 16 | floor) | hx) + (. % 16 | hx) end;
    def h2: ("0" + hx)[-2:];
    [.. | objects | select(has("qdev_id"))] as $devs
    | {version: 1, vm: "lab-b", gpus: [$map | split("\n")[] | select(length > 0) | split(" ") as [$n, $h]
        | ($devs[] | select(.qdev_id == "dev-incus_" + $n)) as $d
        | {host_bdf: $h, guest_bdf: "0000:\($d.bus | h2):\($d.slot | h2).\($d.function)",
           clique: ($plan[0].assignments[$h] | if $wrong == "wrong" then (if . == null then 7 else (. + 1) % 16 end) else . end),
           vendor: "0x10de", device: "0x2330"}]}'
EOF
    C socat VSOCK-LISTEN:$INCUS_EXPECT_PORT,reuseaddr,fork EXEC:"sh /tmp/lab-incus-expect.sh right" > /out/incus-expect-server.log 2>&1 &
    INCUS_SRV="$!"
    C socat VSOCK-LISTEN:$((INCUS_EXPECT_PORT + 1)),reuseaddr,fork EXEC:"sh /tmp/lab-incus-expect.sh wrong" >> /out/incus-expect-server.log 2>&1 &
    INCUS_SRV="$INCUS_SRV $!"
}

# incus_profile: gen incus for level B's GPUs (Incus asked for its extensions), taken by Incus;
# the same profile with the key misspelt, refused by Incus
incus_profile() {
    local rc out b want got
    # HOME: gen asks the server at hand for its API extensions (incus query /1.0)
    rc=0; C HOME=/tmp timeout 120 "$VFIO_P2P" gen incus --config $O/vm-incus.yaml --gpus "$(csv $GPUS_B)" $GEN_OPTS > /out/incus-profile.yaml 2> /out/incus-gen.err || rc=$?
    echo "== gen incus (exit $rc)"; cat /out/incus-profile.yaml /out/incus-gen.err
    [ $rc = 0 ] || { fail "gen incus exited $rc"; return 1; }
    awk '/^  gpu[0-9]+:$/ { n = $1; sub(":", "", n) } /^    pci: / && n { gsub("\"", "", $2); print n, $2; n = "" }' \
        /out/incus-profile.yaml > /out/incus-gpus.txt
    for b in $GPUS_B; do
        want=$(clique_of /out/plan-incus.json "$b")
        got=$(awk -v b="\"$b\"" '/^  [a-z]+[0-9]+:$/ { p = 0 } $1 == "pci:" && $2 == b { p = 1 }
            p && $1 == "nvidia.clique:" { gsub("\"", "", $2); print $2 }' /out/incus-profile.yaml)
        echo "$b: plan clique $want, profile ${got:-none}"
        [ "${got:-null}" = "$want" ] || fail "$b: gen incus wrote clique '${got:-none}', plan says '$want'"
    done
    incus_c profile create vfio-p2p-bad > /dev/null
    sed 's/nvidia\.clique:/nvidia.cliqe:/' /out/incus-profile.yaml > /out/incus-profile-wrong-key.yaml
    rc=0; out=$(incus_sh "incus profile edit vfio-p2p-bad < $O/incus-profile-wrong-key.yaml" 2>&1) || rc=$?
    echo "wrong key (nvidia.cliqe): exit $rc: $out"
    [ $rc != 0 ] && echo "$out" | grep -q 'nvidia.cliqe' || fail "Incus took a profile with nvidia.cliqe (exit $rc)"
    incus_c profile create vfio-p2p-$INCUS_VM > /dev/null
    rc=0; out=$(incus_sh "incus profile edit vfio-p2p-$INCUS_VM < $O/incus-profile.yaml" 2>&1) || rc=$?
    echo "generated profile: exit $rc $out"
    [ $rc = 0 ] || { fail "Incus refused gen incus's profile: $out"; return 1; }
}

# incus_vm: the VM from the default profile and gen's, with what the lab adds (see the top)
incus_vm() {
    local raw conf n
    incus_c init --empty --vm $INCUS_VM -p default -p vfio-p2p-$INCUS_VM -c security.secureboot=false ||
        { fail "incus init --vm failed"; return 1; }
    raw="$(incus_c profile get vfio-p2p-$INCUS_VM raw.qemu) -kernel $KERNEL -initrd $INITRD_B"
    # under TCG Incus's `-cpu host,hv_passthrough` is replaced (the later -cpu wins)
    [ "$INCUS_ACCEL" = kvm ] || raw="$raw -cpu max"
    # ttyS0 is Incus's console (a ring buffer: incus console --show-log); the lab's is ttyS1
    # (not quiet: the kernel's progress shows in both, the boot under TCG in TCG being slow)
    raw="$raw -append 'console=ttyS0 console=ttyS1 panic=-1 lab_b=incus' -serial file:$O/${INCUS_LOG#/out/}"
    raw="$raw -qmp unix:$INCUS_QMP,server=on,wait=off"
    conf=""
    [ "$INCUS_ACCEL" = kvm ] || conf=$(printf '[machine]\naccel = "tcg"\n')
    for n in $(cut -d' ' -f1 /out/incus-gpus.txt); do
        conf=$(printf '%s\n[device "dev-incus_%s"]\nx-pci-vendor-id = "%s"\nx-pci-device-id = "%s"\n' "$conf" "$n" 4318 $((NV_DEVICE)))
    done
    echo "raw.qemu: $raw"; printf 'raw.qemu.conf:\n%s\n' "$conf"
    incus_c config set $INCUS_VM raw.qemu="$raw" raw.qemu.conf="$conf" || { fail "incus config set raw.qemu failed"; return 1; }
}

# incus_check: check --incus-config on the VM's expanded config passes; without nvidia.clique it fails
incus_check() {
    local rc
    incus_c config show --expanded $INCUS_VM > /out/incus-expanded.yaml
    rc=0; vp check --incus-config $O/incus-expanded.yaml $GEN_OPTS --format json > /out/incus-check.json || rc=$?
    echo "check --incus-config (exit $rc; 0 pass, 1 warn): $(jqr -c '[.checks[]? | [.check, .status]]' < /out/incus-check.json 2> /dev/null)"
    [ $rc -le 1 ] || fail "check --incus-config fails ($rc) on Incus's expanded config"
    grep -v 'nvidia.clique:' /out/incus-expanded.yaml > /out/incus-expanded-noclique.yaml
    rc=0; vp check --incus-config $O/incus-expanded-noclique.yaml $GEN_OPTS --format json > /out/incus-check-noclique.json || rc=$?
    echo "without nvidia.clique (exit $rc): $(jqr -c '[.checks[]? | select(.status != "pass") | [.check, .status]]' < /out/incus-check-noclique.json 2> /dev/null)"
    [ $rc = 2 ] && grep -q clique-missing /out/incus-check-noclique.json ||
        fail "check --incus-config without nvidia.clique did not fail clique-missing (exit $rc)"
}

# incus_wait LIMIT: level B's console (second serial port) until LAB-B-DONE, beating /out/heartbeat
incus_qmp() { # COMMAND: its answer on the lab's QMP socket of level B's QEMU
    { echo '{"execute":"qmp_capabilities"}'; echo "$1"; sleep 2; } | C timeout 10 socat - UNIX-CONNECT:$INCUS_QMP 2>&1
}
# (every minute a line: the consoles' sizes, QEMU's CPU ticks, run state and RIP, to tell a slow
# guest from a stuck one)
incus_wait() {
    local t0 n=0 pid; t0=$(up)
    pid=$(cat $R/run/incus/$INCUS_VM/qemu.pid 2> /dev/null)
    echo "QEMU's serial ports: $(incus_qmp '{"execute":"query-chardev"}' | grep -o '"filename": *"[^"]*"' | tr '\n' ' ')"
    while ! grep -q LAB-B-DONE $INCUS_LOG $INCUS_TTYS0 2> /dev/null; do
        awk -v u="$(up)" -v t="$t0" -v l="$1" 'BEGIN { exit !(u - t > l) }' && return 1
        up > /out/heartbeat
        # Incus's own console (ttyS0, its ring buffer), as `incus console --show-log` shows it
        # (the whole log each time; kept only when it is longer than what is kept)
        [ $((n % 12)) = 0 ] && incus_c console $INCUS_VM --show-log > /out/incus-console-poll.log 2> /dev/null &&
            [ "$(wc -c < /out/incus-console-poll.log)" -gt "$(wc -c < $INCUS_TTYS0)" ] && cp /out/incus-console-poll.log $INCUS_TTYS0
        n=$((n + 1)); [ $((n % 12)) = 0 ] && echo "level B at $(up)s: console $(wc -c < $INCUS_LOG) bytes," \
            "QEMU $pid $(awk '{ print "utime", $14, "stime", $15 }' /proc/$pid/stat 2> /dev/null || echo gone)," \
            "$(incus_qmp '{"execute":"query-status"}' | grep -o '"status": *"[a-z-]*"')," \
            "$(incus_qmp '{"execute":"human-monitor-command","arguments":{"command-line":"info registers"}}' | grep -o 'RIP=[0-9a-f]*' | head -n1)," \
            "Incus's console (ttyS0) $(wc -c < $INCUS_TTYS0) bytes"
        sleep 5
    done
}

stage_incus() {
    local t0 rc s
    if [ ! -x $R/usr/libexec/incus/incusd ]; then
        SKIP="NOTE: no Incus in this stack's root (Incus with nvidia.clique is Debian sid's 7.0.2: LAB_STACK=sid)"
        return 0
    fi
    : > $INCUS_LOG; : > $INCUS_TTYS0
    # nested KVM where level A has it working (LAB_KERNEL_STACK=trixie), else TCG in TCG (slow)
    INCUS_ACCEL=$(b_accel)
    vp plan --gpus "$(csv $GPUS_B)" $GEN_OPTS --format json > /out/plan-incus.json
    printf 'name: %s\nmemory_mib: %s\nvcpus: %s\n' $INCUS_VM "$MEM_B" "$VCPUS_B" > /out/vm-incus.yaml
    incusd_start || { incusd_stop; return 1; }
    incus_profile && incus_vm || { incusd_stop; return 1; }
    # check before the start, as an operator would: the GPUs on vfio-pci (a running VM holds
    # their groups, which check opens), where Incus would bind them
    ensure_vfio $GPUS_B
    incus_check
    incus_expect_server
    t0=$(up)
    rc=0; incus_c start $INCUS_VM > /out/incus-start.log 2>&1 || rc=$?
    cat /out/incus-start.log
    if [ $rc != 0 ]; then
        fail "incus start exited $rc: $(tail -n 3 /out/incus-start.log | tr '\n' ' ')"
        cat $R/var/log/incus/$INCUS_VM/qemu.log 2> /dev/null
    else
        cp $R/run/incus/$INCUS_VM/qemu.conf /out/incus-qemu.conf 2> /dev/null ||
            cp $R/var/log/incus/$INCUS_VM/qemu.conf /out/incus-qemu.conf 2> /dev/null
        if [ "$INCUS_ACCEL" = kvm ]; then rc=$TIMEOUT_B_KVM; else rc=$TIMEOUT_B_TCG; fi
        incus_wait "$(b_limit "$rc")" || fail "level B under Incus ($INCUS_ACCEL) did not finish"
        NOTE="level B as an Incus VM ($INCUS_ACCEL): $(awk "BEGIN { printf \"%.0f\", $(up) - $t0 }") s"
    fi
    incus_c info $INCUS_VM > /out/incus-info.txt 2>&1
    incus_c console $INCUS_VM --show-log > /out/incus-console-last.log 2>&1
    [ "$(wc -c < /out/incus-console-last.log)" -le "$(wc -c < $INCUS_TTYS0)" ] || cp /out/incus-console-last.log $INCUS_TTYS0
    # the second serial port stayed empty in the runs here (Incus's QEMU wrote nothing there):
    # level B's markers are read from whichever console has them
    grep -q LAB-B-DONE $INCUS_LOG 2> /dev/null || cp $INCUS_TTYS0 $INCUS_LOG
    for s in $INCUS_SRV; do kill $s 2> /dev/null; done
    incusd_stop
    tr -d '\r' < $INCUS_LOG | sed 's/^/B| /'
    grep -q LAB-B-DONE $INCUS_LOG || { fail "level B under Incus printed no LAB-B-DONE"; return 1; }
    # the expectation is made from the addresses QEMU gave Incus's devices
    scan_matches_plan $INCUS_LOG /out/b-incus-SCAN.json /out/plan-incus.json 0xc8 || return 1
    expect_verdicts $INCUS_LOG b-incus
    [ -z "$WHY" ]
}
