#!/bin/busybox sh
# shellcheck shell=dash
# /init of level A, the "GPU server" VM of tests/lab/run. Runs our vfio-p2p binary for real
# against this kernel's sysfs and /dev/vfio, then level B from what `vfio-p2p gen qemu` produced.
# Every stage prints "LAB-STAGE <name> PASS|FAIL|SKIP <seconds> <why>" (also to /out/stages.txt);
# stage details go to /out/<stage>.log. Always powers off.
# shellcheck disable=SC2086 # $GPUS and friends are lists of BDFs: split on purpose
# shellcheck disable=SC2016 # the $ in single quotes are jq variables
# shellcheck disable=SC2015 # "test && test || fail": fail only records, so this is what is meant
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
up() { cut -d' ' -f1 /proc/uptime; }

R=/hostroot   # the build machine's /, read-only over 9p: our binaries, qemu, jq, the kernel for B
O=/tmp/out    # /out (writable 9p share, results) as seen inside the chroot
# C CMD...: run a program of the build machine against this VM's /sys, /dev and /proc
C() { chroot $R /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin NO_COLOR=1 "$@"; }
# vp ARGS...: our binary; a hang fails its stage instead of eating level A's time
vp() { C timeout 120 "$VFIO_P2P" "$@"; }
jqr() { C jq "$@"; }   # jq: reads stdin, so files come from level A's side (/out/...)

mount_shares() {
    # a module built into the kernel (trixie's virtio_pci) is in /sys/module already
    for m in virtio_pci 9pnet_virtio 9p; do modprobe $m || [ -d /sys/module/$m ] || return 1; done
    mkdir -p $R /out
    mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144,cache=loose hostroot $R || return 1
    mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 labout /out || return 1
    mount -t proc proc $R/proc && mount -t sysfs sysfs $R/sys && mount -t devtmpfs devtmpfs $R/dev &&
        mount -t tmpfs tmpfs $R/tmp && mount -t tmpfs tmpfs $R/run &&
        mkdir -p $R$O && mount --bind /out $R$O
}

# ------------------------------------------------------------------------------ helpers
WHY=""; NFAIL=0; NOTE=""   # NOTE: what a passing stage wants to say in the summary
# fail MSG: record a failed assertion and go on checking; the summary shows the first three
fail() {
    echo "FAIL: $*"
    NFAIL=$((NFAIL + 1))
    if [ $NFAIL -le 3 ]; then WHY="${WHY:+$WHY; }$*"; fi
}
dev() { echo /sys/bus/pci/devices/$1; }
driver_of() { basename "$(readlink "$(dev "$1")/driver" 2>/dev/null)" 2>/dev/null; }
group_of() { basename "$(readlink "$(dev "$1")/iommu_group")"; }
# state BDF...: what bind/unbind may change, to compare before/after
state() { local b; for b in "$@"; do echo "$b driver=$(driver_of "$b") override=$(cat "$(dev "$b")/driver_override")"; done; }
# is_json FILE: the command printed one JSON document (an unimplemented command prints nothing)
is_json() { [ -s "$1" ] && jqr -e 'type == "object" or type == "array"' < "$1" > /dev/null 2>&1; }
csv() { echo "$*" | tr ' ' ','; }
# sysfs_bind BDF DRIVER: a fixture bind through sysfs, for what is not under test (edu, repairs)
sysfs_bind() {
    [ "$(driver_of "$1")" = "$2" ] && return 0
    [ -e "$(dev "$1")/driver" ] && echo "$1" > "$(dev "$1")/driver/unbind"
    echo "$2" > "$(dev "$1")/driver_override"
    echo "$1" > /sys/bus/pci/drivers_probe
    [ "$(driver_of "$1")" = "$2" ]
}
# ensure_vfio BDF...: later stages need the devices on vfio-pci even when the bind stage failed
ensure_vfio() {
    local b
    for b in "$@"; do
        [ "$(driver_of "$b")" = vfio-pci ] && continue
        echo "note: $b is on '$(driver_of "$b")', binding it to vfio-pci through sysfs for this stage"
        sysfs_bind "$b" vfio-pci || fail "cannot bind $b to vfio-pci even through sysfs"
    done
}

# present_as_nvidia: show the stand-ins to our tool as NVIDIA parts (10de:2330), which it plans
# cliques for; the same override level B gets from QEMU's x-pci-vendor-id. Only the chroot's
# sysfs is covered (vendor, device and a patched copy of config bind-mounted over the files):
# the kernel, vfio-pci and QEMU still see the real 1234:1111.
# byte N: write one byte (busybox printf knows octal escapes, not \\x)
# shellcheck disable=SC2059 # the format is the escape
byte() { printf "\\$(printf %03o "$1")"; }
present_as_nvidia() {
    local b real f a
    for b in $GPUS; do
        real=$(readlink -f "$(dev "$b")")
        f=/tmp/nv/$b
        mkdir -p "$f"
        echo 0x10de > "$f/vendor"
        echo "$NV_DEVICE" > "$f/device"
        cat "$real/config" > "$f/config"
        { byte 0xde; byte 0x10; byte $((NV_DEVICE & 255)); byte $((NV_DEVICE >> 8)); } |
            dd of="$f/config" conv=notrunc 2> /dev/null
        for a in vendor device config; do mount --bind "$f/$a" "$R$real/$a" || return 1; done
    done
}

# ------------------------------------------------------------------------------ stages
# tree: the emulated server is what the other stages assume (catches QEMU/kernel changes)
stage_tree() {
    local b path
    [ -e /sys/kernel/iommu_groups/0 ] || fail "no IOMMU groups (intel_iommu=on / intel-iommu missing?)"
    C lspci -tv
    for b in $GPUS; do
        [ -e "$(dev "$b")" ] || { fail "stand-in $b missing"; continue; }
        [ "$(cat "$(dev "$b")/class")" = 0x038000 ] || fail "$b class $(cat "$(dev "$b")/class"), expected 0x038000"
        [ "$(driver_of "$b")" = "$STANDIN_DRIVER" ] || fail "$b driver '$(driver_of "$b")', expected $STANDIN_DRIVER (the host driver a bind must restore)"
        echo "$b group $(group_of "$b") numa $(cat "$(dev "$b")/numa_node") driver $(driver_of "$b") $(readlink -f "$(dev "$b")")"
    done
    # where each role must sit (host bridge / ports) and its NUMA node
    for b in "$GPU_SW0 pci0000:10/0000:10:00.0/0000:11:00.0/0000:12:00.0 0" "$GPU_SW1 pci0000:10/0000:10:00.0/0000:11:00.0/0000:12:01.0 0" \
             "$GPU_RP pci0000:10/0000:10:01.0 0" "$GPU_HB pci0000:20/0000:20:00.0 0" "$GPU_FAR pci0000:80/0000:80:00.0 1"; do
        set -- $b
        path=$(readlink -f "$(dev "$1")")
        [ "$path" = "/sys/devices/$2/$1" ] || fail "$1 is at $path, expected below $2"
        [ "$(cat "$(dev "$1")/numa_node")" = "$3" ] || fail "$1 numa_node $(cat "$(dev "$1")/numa_node"), expected $3"
    done
    [ "$(cat "$(dev "$EDU")/class")" = 0x00ff00 ] || fail "edu $EDU missing"
    [ "$(group_of $GPU_SW0)" != "$(group_of $GPU_SW1)" ] || fail "switch stand-ins share an IOMMU group"
    if [ "$AS_NVIDIA" = 1 ]; then
        [ "$(C cat "/sys/bus/pci/devices/$GPU_SW0/vendor")" = 0x10de ] || fail "the NVIDIA overlay is missing in the chroot"
    fi
    [ -c /dev/kvm ] || fail "no /dev/kvm in level A (kvm_amd with emulated SVM)"
}

# expected_label A B: nvidia-smi's label for the pair, from the tree built by tests/lab/run
expected_label() {
    case " $1 $2 " in
        *" $GPU_FAR "*) echo SYS ;;                                     # the other socket
        *" $GPU_HB "*) echo NODE ;;                                     # another host bridge, same node
        " $GPU_SW0 $GPU_SW1 "|" $GPU_SW1 $GPU_SW0 ") echo PIX ;;        # one switch
        *) echo PHB ;;                                                  # root ports of one host bridge
    esac
}

stage_topo() {
    local rc=0 got a b want lbl f
    vp topo --format json > /out/topo.json || rc=$?
    cat /out/topo.json
    [ $rc = 0 ] || fail "topo exited $rc"
    is_json /out/topo.json || { fail "topo printed no JSON (not implemented?)"; return 1; }
    got=$(jqr -r '[.gpus[].bdf] | sort | join(" ")' < /out/topo.json)
    [ "$got" = "$GPUS" ] || fail "gpus [$got], expected the stand-ins [$GPUS] (and not edu $EDU)"
    for b in $GPUS; do
        f=$(jqr -r --arg b "$b" '.gpus[] | select(.bdf == $b) | "\(.iommu_group) \(.numa_node) \(.driver)"' < /out/topo.json)
        want="$(group_of "$b") $(cat "$(dev "$b")/numa_node") $(driver_of "$b")"
        [ "$f" = "$want" ] || fail "$b: topo says group/numa/driver '$f', sysfs '$want'"
    done
    # every pair, both directions: the matrix must be symmetric and match the tree
    jqr -r '[.gpus[].bdf] as $g | range(0; $g | length) as $i | range(0; $g | length) as $j
            | "\($g[$i]) \($g[$j]) \(.matrix[$i][$j])"' < /out/topo.json > /tmp/pairs
    for a in $GPUS; do for b in $GPUS; do
        lbl=$(grep "^$a $b " /tmp/pairs | cut -d' ' -f3)
        if [ "$a" = "$b" ]; then want=X; else want=$(expected_label "$a" "$b"); fi
        echo "$lbl" | grep -qxE "$want" || fail "matrix[$a][$b] = '$lbl', expected $want"
    done; done
    for f in table yaml; do
        vp topo --format $f > /out/topo.$f && grep -q PIX /out/topo.$f || fail "topo --format $f: exit/output wrong"
    done
    vp topo --format dot > /out/topo.dot && grep -qE '^ *(di)?graph' /out/topo.dot || fail "topo --format dot: no graph"
    # a snapshot of this host reads back as the same topology (and is the lab's example host)
    rc=0; vp snapshot --output $O/snapshot > /dev/null || rc=$?
    vp --sysfs-root $O/snapshot topo --format json > /out/topo-snapshot.json || rc=$?
    jqr -e --slurpfile live $O/topo.json '{gpus, matrix} == ($live[0] | {gpus, matrix})' < /out/topo-snapshot.json > /dev/null ||
        fail "topo of a snapshot (exit $rc) differs from the live topo"
    [ -z "$WHY" ]
}

# clique_of FILE BDF: the plan's assignment (a number or null)
clique_of() { jqr -r --arg b "$2" '.assignments[$b]' < "$1"; }

# plan_ok LEVEL FILE: the GPUs whose path is at most LEVEL share a clique; single GPUs get none
plan_ok() {
    local s0 s1 rp hb far
    s0=$(clique_of "$2" "$GPU_SW0"); s1=$(clique_of "$2" "$GPU_SW1"); rp=$(clique_of "$2" "$GPU_RP")
    hb=$(clique_of "$2" "$GPU_HB"); far=$(clique_of "$2" "$GPU_FAR")
    echo "$1: sw0=$s0 sw1=$s1 rp=$rp hb=$hb far=$far"
    case $1 in
        pix|pxb) [ "$s0" != null ] && [ "$s0" = "$s1" ] && [ "$rp $hb $far" = "null null null" ] ;;
        phb) [ "$s0" != null ] && [ "$s0" = "$s1" ] && [ "$rp" = "$s0" ] && [ "$hb $far" = "null null" ] ;;
        node) [ "$s0" != null ] && [ "$s0 $s0 $s0" = "$s1 $rp $hb" ] && [ "$far" = null ] ;;
        sys) [ "$s0" != null ] && [ "$s0 $s0 $s0 $s0" = "$s1 $rp $hb $far" ] ;;
    esac || fail "plan ($1): cliques sw0=$s0 sw1=$s1 rp=$rp hb=$hb far=$far do not follow the tree"
}

# plan_json NAME ARGS...: run plan, keep its JSON in /out/plan-NAME.json, check it is consistent
plan_json() {
    local name=$1 rc=0
    shift
    vp plan --gpus "$(csv $GPUS)" "$@" --format json > /out/plan-$name.json || rc=$?
    echo "== plan $* (exit $rc)"; cat /out/plan-$name.json
    [ $rc = 0 ] || fail "plan $* exited $rc"
    is_json /out/plan-$name.json || { fail "plan $* printed no JSON (not implemented?)"; return 1; }
    # cliques and assignments must say the same thing, with ids QEMU accepts
    jqr -e '([.cliques[] | .id as $id | .gpus[] | {key: ., value: $id}] | from_entries) as $c
            | ($c | length) == ([.assignments[] | select(. != null)] | length)
              and all(.assignments | to_entries[] | select(.value != null); $c[.key] == .value)
              and all(.cliques[]; .id >= 0 and .id <= 15)' < /out/plan-$name.json > /dev/null ||
        fail "plan $*: cliques[] and assignments disagree or an id is outside 0..15"
}

stage_plan() {
    local lvl rc=0
    # QEMU 7.2's switch ports have no ACS: the switch would route the guests' P2P untranslated.
    # Our plan must refuse that pair and say why, as it would on such a real host.
    vp plan --gpus "$(csv $GPUS)" --format json > /out/plan-default.json 2> /out/plan-default.err || rc=$?
    echo "== plan (exit $rc)"; cat /out/plan-default.json /out/plan-default.err
    [ $rc != 0 ] && grep -qi untranslated /out/plan-default.err ||
        fail "plan of the ACS-less switch pair: exit $rc, expected a refusal that names the untranslated path"
    # with the operator's consent the cliques follow the P2P level
    for lvl in pix pxb phb node sys; do
        plan_json $lvl --p2p-level $lvl --allow-untranslated-p2p && plan_ok $lvl /out/plan-$lvl.json
    done
    [ -z "$WHY" ]
}

# displays_off BDF...: switch off the stand-ins' DRM connectors (bochs-drm always reports its
# virtual display connected), as an operator moves the display off a GPU before passing it through
displays_off() {
    local b c
    for b in "$@"; do
        for c in "$(dev "$b")"/drm/card*/card*-*/status; do [ -e "$c" ] && echo off > "$c"; done
    done
}

stage_bind() {
    local before after rc n b
    before=$(state $GPUS)
    echo "before: $before"
    # a GPU that drives a display is in use on the host: bind must refuse and touch nothing
    rc=0; vp bind $GPU_SW0 || rc=$?
    [ $rc != 0 ] && [ "$(state $GPUS)" = "$before" ] || fail "bind of a GPU with a connected display: exit $rc, $(state $GPU_SW0)"
    displays_off $GPUS
    rc=0; vp bind --dry-run $GPUS || rc=$?
    [ $rc = 0 ] || fail "bind --dry-run exited $rc"
    [ "$(state $GPUS)" = "$before" ] || fail "bind --dry-run changed the devices: $(state $GPUS)"
    # a failure half-way must roll back to exactly the old drivers and driver_override values
    for n in $FAIL_AFTER; do
        displays_off $GPUS   # a rollback re-probes bochs-drm, whose connectors come back on
        rc=0; C VFIO_P2P_FAIL_AFTER="$n" timeout 120 "$VFIO_P2P" bind $GPU_SW0 $GPU_SW1 || rc=$?
        after=$(state $GPUS)
        echo "failure injected at sysfs write $n: exit $rc, after: $after"
        [ $rc != 0 ] || fail "bind with VFIO_P2P_FAIL_AFTER=$n exited 0"
        [ "$after" = "$before" ] || fail "not rolled back after failure at write $n: $after"
    done
    displays_off $GPUS
    rc=0; vp bind $GPUS || rc=$?
    [ $rc = 0 ] || fail "bind exited $rc"
    for b in $GPUS; do
        [ "$(driver_of "$b")" = vfio-pci ] || fail "$b on '$(driver_of "$b")' after bind"
        [ -c /dev/vfio/"$(group_of "$b")" ] || fail "no /dev/vfio/$(group_of "$b") for $b"
    done
    # unbind gives the device back to its host driver
    rc=0; vp unbind $GPU_RP || rc=$?
    [ $rc = 0 ] || fail "unbind exited $rc"
    [ "$(state $GPU_RP)" = "$(echo "$before" | grep "^$GPU_RP ")" ] || fail "unbind: $(state $GPU_RP), before bind: $(echo "$before" | grep "^$GPU_RP ")"
    displays_off $GPU_RP
    rc=0; vp bind $GPU_RP || rc=$?
    [ $rc = 0 ] && [ "$(driver_of $GPU_RP)" = vfio-pci ] || fail "re-bind of $GPU_RP: exit $rc, driver $(driver_of $GPU_RP)"
    state $GPUS
    ls -l /dev/vfio
    [ -z "$WHY" ]
}

hidden_xml() { # a libvirt domain with the GPUs assigned and the hypervisor hidden from the guest
    echo "<domain type='kvm'><name>hidden</name><memory unit='MiB'>1024</memory><os><type arch='x86_64' machine='q35'>hvm</type></os>"
    echo "<features><acpi/><kvm><hidden state='on'/></kvm></features><devices>"
    for b in "$@"; do
        echo "$b" | sed 's/^\(....\):\(..\):\(..\)\.\(.\)$/<hostdev mode="subsystem" type="pci" managed="no"><driver name="vfio"\/><source><address domain="0x\1" bus="0x\2" slot="0x\3" function="0x\4"\/><\/source><\/hostdev>/'
    done
    echo "</devices></domain>"
}

# new_failures BASE OTHER: the findings (not passing) of check report OTHER that BASE passes
new_failures() {
    jqr -c --slurpfile base "$O/${1#/out/}" '[$base[0].checks[] | select(.status | test("^pass$"; "i")) | [.check, .subject]] as $ok
        | [.checks[] | select((.status | test("^pass$"; "i") | not) and ([.check, .subject] as $k | $ok | index([$k]) != null))]' < "$2"
}

stage_check() {
    # a PHB pair: no clique at the default level, so nothing but the host is judged
    local rc base q="/usr/bin/qemu-system-x86_64" pair="$GPU_SW0,$GPU_RP"
    ensure_vfio $GPUS
    # --deep: open the groups and devices through the VFIO ioctls, as QEMU will
    rc=0; vp check --gpus "$pair" --qemu $q --deep --format json > /out/check.json || rc=$?
    echo "== check (exit $rc)"; cat /out/check.json
    is_json /out/check.json || { fail "check printed no JSON (not implemented?)"; return 1; }
    base=$rc
    [ $rc -le 1 ] || fail "check fails ($rc) on GPUs bound to vfio-pci: $(jqr -c '[.checks[] | select(.status | test("fail"; "i")) | .check]' < /out/check.json)"
    # the switch pair without ACS: the plan check fails and says why
    rc=0; vp check --gpus "$GPU_SW0,$GPU_SW1" --qemu $q --format json > /out/check-switch.json || rc=$?
    echo "== check switch pair (exit $rc)"; cat /out/check-switch.json
    [ $rc = 2 ] && new_failures /out/check.json /out/check-switch.json | grep -qi untranslated ||
        fail "check of the ACS-less switch pair: exit $rc, expected a failure that names the untranslated path"
    # hidden hypervisor: `kvm=off` on the command line, or libvirt's <kvm><hidden state='on'/>
    rc=0; vp check --gpus "$pair" --qemu $q --qemu-args "-machine q35 -cpu host,kvm=off" --format json > /out/check-kvm-off.json || rc=$?
    echo "== check kvm=off (exit $rc)"; cat /out/check-kvm-off.json
    [ $rc -ge 1 ] || fail "check passes with -cpu host,kvm=off"
    new_failures /out/check.json /out/check-kvm-off.json | grep -qiE 'hidden|kvm=off' ||
        fail "check with kvm=off: no new finding that names the hidden hypervisor"
    hidden_xml $GPU_SW0 $GPU_RP > /out/hidden.xml
    rc=0; vp check --gpus "$pair" --qemu $q --domain-xml $O/hidden.xml --format json > /out/check-hidden-xml.json || rc=$?
    echo "== check hidden xml (exit $rc)"; cat /out/check-hidden-xml.json
    [ $rc -ge 1 ] || fail "check passes a domain with <kvm><hidden state='on'/>"
    new_failures /out/check.json /out/check-hidden-xml.json | grep -qi 'hidden' ||
        fail "check with <hidden state='on'/>: no new finding that names it"
    # the VFIO state is read for real: a GPU taken off vfio-pci must fail the check
    echo "$GPU_RP" > "$(dev $GPU_RP)/driver/unbind"
    rc=0; vp check --gpus "$pair" --qemu $q --format json > /out/check-unbound.json || rc=$?
    echo "== check with $GPU_RP unbound (exit $rc)"; cat /out/check-unbound.json
    [ $rc = 2 ] || fail "check exits $rc (not 2) for a GPU not bound to vfio-pci"
    echo "$GPU_RP" > /sys/bus/pci/drivers_probe    # driver_override still says vfio-pci
    NOTE="baseline check exit $base (0 pass, 1 warn)"
    echo "$NOTE"
    [ -z "$WHY" ]
}

# vm_yaml: the level-B VM for gen's --config: small enough to boot inside level A
vm_yaml() {
    printf 'name: lab-b\nmemory_mib: %s\nvcpus: %s\nguest_topology: %s\nfirmware: bios\n' "$MEM_B" "$VCPUS_B" "$GUEST_TOPOLOGY"
    printf 'verify: vsock\nvsock_cid: %s\n' "$FLEET_CID"
    # level B boots from -kernel; its disk (gen on this host refuses a missing one) and console
    # are vm.yaml's all the same: QEMU opens the disk at gen's slot and the console is gen's
    head -c 1048576 /dev/zero > /out/lab-b-disk.raw
    printf 'disks:\n  - path: %s/lab-b-disk.raw\nconsole: serial\n' "$O"
}

# fleet (docs/fleet.md): the collector's state directory inside the chroot, and seen from here
FLEET=/tmp/fleet
FLEET_A=$R$FLEET
FLEET_CID=3
FLEET_SWAP=""

# fleet_start: the collector, listening on vsock for the rest of level A's life; and the plan a
# wrong host would have registered for the same CID (the wrong expectation, as lab-b-wrong)
fleet_start() {
    modprobe vhost_vsock || fail "modprobe vhost_vsock failed"
    [ -s $FLEET_A/plans/lab-b.json ] || { fail "gen --state-dir registered no plan for lab-b"; return 1; }
    cp $FLEET_A/plans/lab-b.json /out/fleet-plan-right.json
    [ -s /out/expect-wrong.json ] || fail "no wrong expectation to make the wrong plan of"
    jqr -c --slurpfile w $O/expect-wrong.json '.domain = "lab-b-wrong" | .expectation = ($w[0] | .vm = "lab-b-wrong")' \
        < /out/fleet-plan-right.json > /out/fleet-plan-wrong.json
    [ -s /out/fleet-plan-wrong.json ] || fail "could not make the wrong plan"
    C timeout "$TIMEOUT_A" "$VFIO_P2P" collect --state-dir $FLEET --min-interval 0 --deadline 20 \
        --textfile $FLEET/metrics/vfio_p2p.prom > /out/fleet-collect.log 2>&1 &
}

# fleet_arm LIMIT: before each boot of level B (at most LIMIT s), CID 3 is lab-b's; once lab-b's
# record is in, the plan for CID 3 becomes lab-b-wrong's, so level B's second report is judged
# against the wrong plan
fleet_arm() {
    [ -n "$FLEET_SWAP" ] && kill "$FLEET_SWAP" 2> /dev/null
    # a boot cut short (nested KVM, then TCG) starts over: no records, the log read from here on
    rm -rf $FLEET_A/records
    wc -l < /out/fleet-collect.log > /out/fleet-log-mark
    rm -f $FLEET_A/plans/lab-b-wrong.json
    cp /out/fleet-plan-right.json $FLEET_A/plans/.lab-b.tmp
    mv $FLEET_A/plans/.lab-b.tmp $FLEET_A/plans/lab-b.json
    (
        C timeout $(($1 + 10)) "$VFIO_P2P" collect --wait lab-b --since "$(date +%s)" --timeout "$1" --state-dir $FLEET \
            > /out/fleet-wait.txt 2>&1
        echo "collect --wait exit $?" >> /out/fleet-wait.txt
        rm -f $FLEET_A/plans/lab-b.json
        # a plan appears whole: write beside it, then rename (as gen --state-dir does)
        cp /out/fleet-plan-wrong.json $FLEET_A/plans/.lab-b-wrong.tmp
        mv $FLEET_A/plans/.lab-b-wrong.tmp $FLEET_A/plans/lab-b-wrong.json
    ) &
    FLEET_SWAP=$!
}

stage_gen() {
    local rc b want got f
    ensure_vfio $GPUS_B
    vm_yaml > /out/vm-b.yaml
    vp plan --gpus "$(csv $GPUS_B)" $GEN_OPTS --format json > /out/plan-b.json
    rc=0; vp gen qemu --config $O/vm-b.yaml --gpus "$(csv $GPUS_B)" $GEN_OPTS --guest-topology "$GUEST_TOPOLOGY" \
        --format json --expect-out $O/expect.json --state-dir $FLEET > /out/gen.json || rc=$?
    echo "== gen qemu (exit $rc)"; cat /out/gen.json
    [ $rc = 0 ] || fail "gen qemu exited $rc"
    is_json /out/gen.json || { fail "gen qemu printed no JSON (not implemented?)"; return 1; }
    jqr -e 'type == "array" and all(.[]; type == "string")' < /out/gen.json > /dev/null ||
        { fail "gen qemu --format json is not an array of arguments"; return 1; }
    # each -device vfio-pci of ours carries the clique the plan gives it (none for null)
    for b in $GPUS_B; do
        want=$(clique_of /out/plan-b.json "$b")
        got=$(jqr -r --arg b "$b" '[.[] | select(startswith("{")) | fromjson | select(.driver == "vfio-pci" and .host == $b)]
                    | if length == 1 then .[0]["x-nv-gpudirect-clique"] else "\(length) devices" end' < /out/gen.json)
        echo "$b: plan clique $want, generated $got"
        [ "$got" = "$want" ] || fail "$b: generated clique '$got', plan says '$want'"
    done
    [ "$(jqr '[.assignments[] | select(. != null)] | length' < /out/plan-b.json)" -ge 2 ] ||
        fail "the level-B GPUs ($GPUS_B with $GEN_OPTS) get no clique: nothing for the guest to check"
    f="name=opt/vfio-p2p/expect.json,file=$O/expect.json"
    jqr -e --arg f "$f" 'index($f) != null' < /out/gen.json > /dev/null || fail "no -fw_cfg $f"
    echo "== expect.json"; cat /out/expect.json
    is_json /out/expect.json || fail "--expect-out wrote no JSON"
    # verify: vsock: the device, the port in the expectation, the plan registered for the collector
    jqr -e --arg d "vhost-vsock-pci,guest-cid=$FLEET_CID,id=vsock0" 'index($d) != null' < /out/gen.json > /dev/null ||
        fail "no -device vhost-vsock-pci with guest-cid $FLEET_CID"
    jqr -e '.report.vsock_port == 7389' < /out/expect.json > /dev/null || fail "expect.json has no report port"
    # vm.yaml's disk (virtio at pcie.0 slot 3, booting), no NIC, the console on stdio
    jqr -e --arg f "file=$O/lab-b-disk.raw,format=raw,if=none,id=disk0" 'index($f) != null' < /out/gen.json > /dev/null ||
        fail "no -drive for vm.yaml's disk"
    jqr -e '[.[] | select(startswith("{")) | fromjson | select(.driver == "virtio-blk-pci" and .addr == "0x3" and .bootindex == 1)] | length == 1' \
        < /out/gen.json > /dev/null || fail "no booting virtio-blk-pci at pcie.0 slot 3"
    jqr -e '(index("-serial") as $i | .[$i + 1] == "mon:stdio") and (index("-nic") as $i | .[$i + 1] == "none")' \
        < /out/gen.json > /dev/null || fail "no -serial mon:stdio or -nic none"
    jqr -e --argjson c $FLEET_CID '.cid == $c and .expectation.vm == "lab-b"' < $FLEET_A/plans/lab-b.json > /dev/null ||
        fail "gen --state-dir did not register lab-b with CID $FLEET_CID"
    for f in argv shell; do
        vp gen qemu --config $O/vm-b.yaml --gpus "$(csv $GPUS_B)" $GEN_OPTS --format $f > /out/gen.$f &&
            grep -q x-nv-gpudirect-clique /out/gen.$f || fail "gen qemu --format $f: exit/output wrong"
    done
    [ -z "$WHY" ]
}

stage_qemu_neg() {
    local out rc
    ensure_vfio $GPU_SW0
    # edu is a fixture here (bind is tested on GPUs): straight through sysfs
    sysfs_bind $EDU vfio-pci || { fail "cannot bind edu $EDU to vfio-pci"; return 1; }
    # neg NAME REGEX DEVICE-JSON: QEMU must refuse to start with this device
    neg() {
        rc=0; out=$(C timeout 60 qemu-system-x86_64 -machine q35 -accel tcg -nodefaults -display none -S -m 64 \
            -monitor none -serial none -device "$3" 2>&1) || rc=$?
        echo "$1: exit $rc: $out"
        [ $rc != 0 ] && [ $rc != 124 ] && echo "$out" | grep -qE "$2" || fail "$1: QEMU did not refuse with '$2' (exit $rc)"
    }
    neg non-display 'unsupported PCI class' \
        "{\"driver\":\"vfio-pci\",\"host\":\"$EDU\",\"x-pci-vendor-id\":4318,\"x-nv-gpudirect-clique\":1}"
    # why the harness adds x-pci-vendor-id to gen's output: without it QEMU refuses the stand-ins
    neg no-vendor-override 'invalid device vendor' \
        "{\"driver\":\"vfio-pci\",\"host\":\"$GPU_SW0\",\"x-nv-gpudirect-clique\":1}"
    [ -z "$WHY" ]
}

# b_args ACCEL [FILE]: gen's arguments (FILE, default /out/gen.json) as a shell-quoted string,
# with what the lab changes:
# - the stand-ins need QEMU's vendor override for the clique check (see stage qemu-neg), and the
#   device id that level A's overlay shows (present_as_nvidia), so the guest sees the same part;
# - under TCG (no nested KVM) the accelerator and -cpu host are swapped for their TCG forms.
b_args() {
    jqr -r --arg accel "$1" --argjson dev $((NV_DEVICE)) '
        map(if startswith("{") and ((fromjson? // {}) | .driver == "vfio-pci")
            then fromjson | .["x-pci-vendor-id"] = 4318 | .["x-pci-device-id"] = $dev | tojson else . end)
        | if $accel == "kvm" then . else
            [range(length) as $i | .[$i] as $a | (if $i > 0 then .[$i - 1] else "" end) as $opt
             | if $opt == "-machine" or $opt == "-M" then $a | gsub("accel=kvm"; "accel=tcg") | gsub(",kernel-irqchip=on"; "")
               elif $opt == "-cpu" and ($a | startswith("host")) then "max"
               elif $opt == "-accel" then "tcg"
               elif $a == "-enable-kvm" then empty
               else $a end]
          end
        | @sh' < "${2:-/out/gen.json}"
}

# b_limit SECONDS: that, or less if level A's own limit (tests/lab/run) would cut level B short
b_limit() {
    local left
    left=$(awk -v t="$TIMEOUT_A" -v u="$(up)" 'BEGIN { printf "%d", t - u - 20 }')
    if [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}

# ---------------------------------------------------------- level B boots: watched, with a fallback
# Nested KVM (level A's KVM on TCG's emulated SVM) boots level B in ~50 s, TCG in ~200 s, but nested
# KVM is not always sound: on one CI machine a level B under it printed nothing until level A's
# limit and took every later stage with it. So each boot is watched (watch_b): a level B whose
# console stays silent for STALL_B_KVM s (it reaches /init in ~20 s) is stopped; under TCG only
# STALL_B_TCG (default 0: off) and the boot's limit apply, since TCG is slow but sound. Under LAB_ACCEL_B=auto a
# nested-KVM boot that did not reach LAB-B-DONE is booted again under TCG, and once nested KVM has
# failed the later boots of this level A go straight to TCG (KVM_FAILED).
KVM_FAILED=""
b_accel() { # the accelerator for the next boot of level B
    case $ACCEL_B in
        auto) if [ -c /dev/kvm ] && [ -z "$KVM_FAILED" ]; then echo kvm; else echo tcg; fi ;;
        *) echo "$ACCEL_B" ;;
    esac
}
# watch_b LOG STALL: in the background of a boot. Stops level B's QEMU once LOG has not grown for
# STALL s (0: never), and beats /out/heartbeat every 10 s, which tells tests/lab/run that level A
# itself is alive while level B's console is silent (under TCG its kernel prints nothing for minutes)
watch_b() {
    local log=$1 stall=$2 size=-1 cur last beat=0
    last=$(up)
    while sleep 2; do
        beat=$((beat + 1)); [ $((beat % 5)) = 0 ] && up > /out/heartbeat
        [ "$stall" -gt 0 ] || continue
        cur=$(wc -c < "$log" 2> /dev/null || echo 0)
        if [ "$cur" != "$size" ]; then size=$cur; last=$(up); continue; fi
        awk -v u="$(up)" -v l="$last" -v s="$stall" 'BEGIN { exit !(u - l > s) }' || continue
        echo "level B printed nothing for $stall s: stopping it"
        killall -TERM qemu-system-x86_64; sleep 3; killall -KILL qemu-system-x86_64 2> /dev/null
        return
    done
}
boot_b_once() { # LAUNCHER LOG ACCEL: one boot (LAUNCHER ACCEL LIMIT), watched by watch_b
    local limit stall=$STALL_B_TCG watcher
    limit=$(b_limit "$TIMEOUT_B_TCG")
    [ "$3" = kvm ] && { limit=$(b_limit "$TIMEOUT_B_KVM"); stall=$STALL_B_KVM; }
    : > "$2"
    [ "$limit" -ge 30 ] || { echo "no time left for level B under $3"; return; }
    watch_b "$2" "$stall" &
    watcher=$!
    "$1" "$3" "$limit"
    kill "$watcher" 2> /dev/null
    wait "$watcher" 2> /dev/null
}
# boot_b LAUNCHER LOG: boot level B (nested KVM first under auto, see above); sets B_ACCEL, B_SECS
boot_b() {
    local t0 accel
    t0=$(up); accel=$(b_accel)
    boot_b_once "$1" "$2" "$accel"
    if [ "$accel" = kvm ] && [ "$ACCEL_B" = auto ] && ! grep -q LAB-B-DONE "$2"; then
        cp "$2" "${2%.log}-kvm.log"
        KVM_FAILED=1
        echo "LAB-PROGRESS level B under nested KVM did not finish (${2%.log}-kvm.log): TCG from here on" | tee /dev/console
        accel=tcg
        boot_b_once "$1" "$2" tcg
    fi
    B_ACCEL=$accel
    B_SECS=$(awk "BEGIN { printf \"%.0f\", $(up) - $t0 }")
}

# run_b ACCEL TIMEOUT: boot level B from gen's arguments; its console goes to /out/level-b.log
run_b() {
    echo "== level B, accel $1, limit $2 s"
    fleet_arm "$2"
    b_args "$1" > /out/b-args-$1.sh
    echo "arguments from gen (as changed by the lab): $(cat /out/b-args-$1.sh)"
    eval "set -- $2 $(cat /out/b-args-$1.sh)"
    local limit=$1
    shift
    # shellcheck disable=SC2046 # p2p_dma_device prints words for QEMU's argv, or nothing
    C timeout -k 5 "$limit" "$@" $(p2p_dma_device) -nodefaults -monitor none -no-reboot \
        -kernel "$KERNEL" -initrd "$INITRD_B" -append "console=ttyS0 quiet panic=-1" \
        -fw_cfg name=opt/vfio-p2p-lab/wrong-expect.json,file=$O/expect-wrong.json \
        < /dev/null > /out/level-b.log 2>&1
    echo "level B QEMU exit $?"
}

# b_section NAME [LOG [OUT]]: the JSON level B printed for NAME (level-b.sh section) into OUT
# (default /out/b-NAME.json); prints the command's exit status. LOG: the console log (default
# /out/level-b.log)
b_section() {
    tr -d '\r' < "${2:-/out/level-b.log}" | sed -n "/^LAB-B-$1-BEGIN/,/^LAB-B-$1-END/p" | sed '1d;$d' > "${3:-/out/b-$1.json}"
    tr -d '\r' < "${2:-/out/level-b.log}" | sed -n "s/^LAB-B-$1-END rc=//p"
}

# scan_matches_plan LOG SCAN PLAN [OFFSET]: the agent's scan in LOG (kept in SCAN) exited 0 and
# finds GPUS_B with PLAN's cliques; with OFFSET, every clique's capability sits there. 1: no scan
scan_matches_plan() {
    local rc want got
    rc=$(b_section SCAN "$1" "$2")
    [ "$rc" = 0 ] || fail "agent scan exited '$rc'"
    is_json "$2" || { fail "agent scan printed no JSON"; return 1; }
    want=$(jqr -r --arg g "$GPUS_B" '[.assignments as $a | $g | split(" ")[] | $a[.] | tostring] | sort | join(" ")' < "$3")
    got=$(jqr -r '[.gpus[].clique | tostring] | sort | join(" ")' < "$2")
    echo "cliques in the guest: [$got], planned: [$want]"
    [ "$got" = "$want" ] || fail "agent scan finds cliques [$got], plan says [$want]"
    [ -z "${4:-}" ] || jqr -e --arg o "$4" 'all(.gpus[]; if .clique == null then .cap_offset == null else .cap_offset == $o end)' < "$2" > /dev/null ||
        fail "cap_offset is not $4 for every GPU with a clique"
}

# expect_verdicts LOG NAME: the agent's `expect` in LOG passed the right expectation (exit 0) and
# found the wrong one wrong (exit 1, a report: not a crash); reports in /out/NAME-{EXPECT,WRONG}.json
expect_verdicts() {
    local rc
    rc=$(b_section EXPECT "$1" "/out/$2-EXPECT.json")
    [ "$rc" = 0 ] || fail "agent expect exited '$rc'"
    rc=$(b_section WRONG "$1" "/out/$2-WRONG.json")
    [ "$rc" = 1 ] || fail "agent expect with the wrong expectation exited '$rc', not 1"
}

stage_guest() {
    local accel rc got want
    [ -s /out/gen.json ] && is_json /out/expect.json || { fail "no arguments from gen qemu (stage gen failed or not run)"; return 1; }
    ensure_vfio $GPUS_B
    # a wrong expectation for the negative run: every clique moved by one (null becomes 7)
    jqr -c 'walk(if type == "object" then with_entries(
            if (.key | test("clique"; "i")) and (.value | type) == "number" then .value = ((.value + 1) % 16)
            elif (.key | test("clique"; "i")) and .value == null then .value = 7 else . end) else . end)' \
        < /out/expect.json > /out/expect-wrong.json
    jqr -e --slurpfile w $O/expect-wrong.json '. != $w[0]' < /out/expect.json > /dev/null ||
        fail "cannot derive a wrong expectation (no clique field in expect.json?)"
    fleet_start
    dmesg_mark guest-boot
    boot_b run_b /out/level-b.log
    accel=$B_ACCEL
    NOTE="level B under $accel: $B_SECS s"
    echo "LAB-PROGRESS $NOTE"
    tr -d '\r' < /out/level-b.log | sed 's/^/B| /'
    grep -q LAB-B-DONE /out/level-b.log || { fail "level B ($accel) did not finish"; return 1; }
    # the guest sees every assigned GPU with the plan's clique, at QEMU 7.2's offset 0xc8
    scan_matches_plan /out/level-b.log /out/b-SCAN.json /out/plan-b.json 0xc8 || return 1
    rc=$(b_section EXPECT)
    [ "$rc" = 0 ] || fail "agent expect (fw_cfg) exited '$rc'"
    is_json /out/b-EXPECT.json || fail "agent expect printed no JSON report"
    [ -z "$WHY" ]
}

# guest-wrap: level B started through `vfio-p2p qemu-wrap` from gen's arguments with every
# clique taken out: the wrapper puts the planned cliques back and the agent finds them
# (docs/integrations.md: Nova and any other libvirt user)
run_b_wrapped() { # ACCEL LIMIT: level B through the wrapper; console and wrapper log in /out/level-b-wrap.log
    local accel=$1 limit=$2
    echo "== level B through qemu-wrap, accel $accel, limit $limit s"
    b_args "$accel" /out/gen-noclique.json > /out/b-wrap-args-$accel.sh
    echo "arguments from gen without cliques (as changed by the lab): $(cat /out/b-wrap-args-$accel.sh)"
    eval "set -- $(cat /out/b-wrap-args-$accel.sh)"
    shift  # the program: the wrapper runs the real QEMU
    C timeout -k 5 "$limit" "$VFIO_P2P" qemu-wrap $GEN_OPTS --qemu /usr/bin/qemu-system-x86_64 -- "$@" \
        -nodefaults -monitor none -no-reboot \
        -kernel "$KERNEL" -initrd "$INITRD_B" -append "console=ttyS0 quiet panic=-1" \
        < /dev/null > /out/level-b-wrap.log 2>&1
    echo "level B (wrapped) QEMU exit $?"
}

stage_guest_wrap() {
    local accel rc got want n
    [ -s /out/gen.json ] && is_json /out/expect.json || { fail "no arguments from gen qemu (stage gen failed or not run)"; return 1; }
    ensure_vfio $GPUS_B
    jqr -c 'map(if startswith("{") and ((fromjson? // {}) | .driver == "vfio-pci")
                then fromjson | del(.["x-nv-gpudirect-clique"]) | tojson else . end)' < /out/gen.json > /out/gen-noclique.json
    ! grep -q x-nv-gpudirect-clique /out/gen-noclique.json || { fail "cliques left in gen-noclique.json"; return 1; }
    # gen's vhost-vsock-pci (verify: vsock) needs /dev/vhost-vsock; no collector listens here
    modprobe vhost_vsock || fail "modprobe vhost_vsock failed"
    boot_b run_b_wrapped /out/level-b-wrap.log
    accel=$B_ACCEL
    NOTE="level B through qemu-wrap under $accel: $B_SECS s"
    echo "LAB-PROGRESS $NOTE"
    tr -d '\r' < /out/level-b-wrap.log | sed 's/^/B| /'
    grep -q LAB-B-DONE /out/level-b-wrap.log || { fail "level B through the wrapper ($accel) did not finish"; return 1; }
    # the wrapper said what it added: one line per GPU the plan gives a clique
    want=$(jqr '[.assignments[] | select(. != null)] | length' < /out/plan-b.json)
    n=$(tr -d '\r' < /out/level-b-wrap.log | grep -c '^vfio-p2p qemu-wrap: .* added x-nv-gpudirect-clique=')
    echo "wrapper added $n clique(s), plan has $want"
    [ "$n" = "$want" ] || fail "the wrapper logged $n added cliques, the plan has $want"
    scan_matches_plan /out/level-b-wrap.log /out/b-SCAN.json /out/plan-b.json || return 1
    rc=$(b_section EXPECT /out/level-b-wrap.log)
    cat /out/b-EXPECT.json
    [ "$rc" = 0 ] || fail "agent expect (fw_cfg) exited '$rc'"
    [ -z "$WHY" ]
}

stage_guest_wrong() {
    local rc
    grep -q LAB-B-DONE /out/level-b.log 2>/dev/null || { fail "level B did not run (stage guest)"; return 1; }
    rc=$(b_section WRONG)
    cat /out/b-WRONG.json
    tr -d '\r' < /out/level-b.log | grep '^LAB-B-STDERR WRONG'
    # exit 1 with a report, not an error without one: the mismatch was found, not a crash
    [ "$rc" = 1 ] || fail "agent expect with a wrong expectation exited '$rc', not 1"
    is_json /out/b-WRONG.json || fail "agent expect with a wrong expectation printed no JSON report"
    [ -z "$WHY" ]
}

# fleet: level B's reports reached the collector over vsock and were judged against the plan of
# the domain owning CID 3: PASS for the right plan, FAIL for the wrong one; the hostile sends
# were refused and stored nothing
stage_fleet() {
    local rc n
    grep -q LAB-B-DONE /out/level-b.log 2>/dev/null || { fail "level B did not run (stage guest)"; return 1; }
    echo "== collector"; cat /out/fleet-collect.log
    # what the collector said during the last boot of level B
    tail -n +$(($(cat /out/fleet-log-mark) + 1)) /out/fleet-collect.log > /out/fleet-collect-last.log
    echo "== collect --wait lab-b"; cat /out/fleet-wait.txt
    tr -d '\r' < /out/level-b.log | grep -E '^LAB-B-(STDERR SEND|HOSTILE)'
    rc=$(b_section SEND); [ "$rc" = 0 ] || fail "agent expect --send exited '$rc'"
    rc=$(b_section SEND2); [ "$rc" = 0 ] || fail "agent expect --send (second) exited '$rc'"
    grep -q "^collect --wait exit 0" /out/fleet-wait.txt || fail "collect --wait lab-b did not exit 0 (PASS)"
    vp verdicts --state-dir $FLEET --format json > /out/fleet-verdicts.json || fail "verdicts failed"
    echo "== verdicts"; cat /out/fleet-verdicts.json
    jqr -e --argjson c $FLEET_CID '[.[] | select(.domain == "lab-b")] | length == 1 and .[0].verdict == "PASS" and .[0].cid == $c' \
        < /out/fleet-verdicts.json > /dev/null || fail "no PASS record for lab-b"
    jqr -e '[.[] | select(.domain == "lab-b-wrong")] | length == 1 and .[0].verdict == "FAIL"
            and any(.[0].problems[]; test("clique")) and any(.[0].problems[]; test("claims to be .lab-b."))' \
        < /out/fleet-verdicts.json > /dev/null || fail "no FAIL record (clique, claimed name) for lab-b-wrong"
    jqr -e 'length == 2' < /out/fleet-verdicts.json > /dev/null || fail "records for other domains than lab-b, lab-b-wrong"
    # the hostile sends: each refused, nothing stored beyond the two reports
    n=$(grep -c "refused CID $FLEET_CID" /out/fleet-collect-last.log)
    [ "$n" -ge 3 ] || fail "the collector refused $n of level B's 3 hostile sends"
    n=$(grep -c "stored " /out/fleet-collect-last.log)
    [ "$n" = 2 ] || fail "the collector stored $n records, not 2"
    for d in lab-b lab-b-wrong; do
        n=$(find $FLEET_A/records/$d -mindepth 1 -maxdepth 1 ! -name latest.json | wc -l)
        [ "$n" = 1 ] || fail "$d has $n boot records, not 1"
    done
    vp verdicts --state-dir $FLEET --format prometheus > /out/fleet-metrics.prom
    grep -qx 'vfio_p2p_verdict_pass{domain="lab-b"} 1' /out/fleet-metrics.prom &&
        grep -qx 'vfio_p2p_verdict_pass{domain="lab-b-wrong"} 0' /out/fleet-metrics.prom || fail "metrics lack the two verdicts"
    cmp -s /out/fleet-metrics.prom $FLEET_A/metrics/vfio_p2p.prom || fail "the collector's textfile differs from verdicts --format prometheus"
    cp -r $FLEET_A /out/fleet-state
    NOTE="lab-b PASS, lab-b-wrong FAIL, $(grep -c "refused CID" /out/fleet-collect-last.log) refused"
    [ -z "$WHY" ]
}

# hook: what libvirt would run around a guest's start and stop, with gen's domain XML
stage_hook() {
    local rc before b
    # start from the host drivers: the hook binds what the domain asks for
    rc=0; vp unbind --all || rc=$?
    [ $rc = 0 ] || fail "unbind --all exited $rc"
    for b in $GPUS; do [ "$(driver_of "$b")" = "$STANDIN_DRIVER" ] || fail "$b on '$(driver_of "$b")' after unbind --all"; done
    before=$(state $GPUS)
    vm_yaml > /out/vm-b.yaml
    rc=0; vp gen libvirt --config $O/vm-b.yaml --gpus "$(csv $GPUS_B)" $GEN_OPTS > /out/domain-gen.xml || rc=$?
    [ $rc = 0 ] && grep -q x-nv-gpudirect-clique /out/domain-gen.xml || { fail "gen libvirt: exit $rc, no clique in the XML"; return 1; }
    # the hook binds managed='no' hostdevs (libvirt binds managed='yes' ones itself)
    sed "s/managed='yes'/managed='no'/" /out/domain-gen.xml > /out/domain.xml
    displays_off $GPUS_B
    rc=0; vp hook run lab-b prepare begin - < /out/domain.xml > /out/hook-prepare.txt 2>&1 || rc=$?
    echo "== hook prepare begin (exit $rc)"; cat /out/hook-prepare.txt
    [ $rc = 0 ] || fail "hook prepare begin exited $rc"
    # gen was told --allow-untranslated-p2p, the hook's host policy was not: a finding
    grep -qi untranslated /out/hook-prepare.txt || fail "hook prepare does not flag the clique across the ACS-less switch"
    for b in $GPUS_B; do [ "$(driver_of "$b")" = vfio-pci ] || fail "$b on '$(driver_of "$b")' after prepare begin"; done
    rc=0; vp hook run lab-b release end - < /out/domain.xml > /out/hook-release.txt 2>&1 || rc=$?
    echo "== hook release end (exit $rc)"; cat /out/hook-release.txt
    [ $rc = 0 ] || fail "hook release end exited $rc"
    [ "$(state $GPUS)" = "$before" ] || fail "release end did not restore the drivers: $(state $GPUS)"
    # a hidden hypervisor is a finding (stderr; the default policy lets the guest start)
    sed "s|<features>|<features><kvm><hidden state='on'/></kvm>|" /out/domain.xml > /out/domain-hidden.xml
    displays_off $GPUS_B
    rc=0; vp hook run lab-b prepare begin - < /out/domain-hidden.xml > /out/hook-hidden.txt 2>&1 || rc=$?
    echo "== hook prepare begin, hidden hypervisor (exit $rc)"; cat /out/hook-hidden.txt
    grep -qi hidden /out/hook-hidden.txt || fail "hook prepare does not report the hidden hypervisor"
    vp hook run lab-b release end - < /out/domain-hidden.xml
    [ "$(state $GPUS)" = "$before" ] || fail "release end (hidden) did not restore the drivers: $(state $GPUS)"
    [ -z "$WHY" ]
}

# fabric (issue #30): the hook's Fabric Manager partition activation, for real on this kernel's
# sysfs, with FM played by the stand-in library (tests/fm-standin, VFIO_P2P_FM_LIBRARY). The host
# root is a directory whose sys, dev, proc, run are the chroot's own and whose
# etc/vfio-p2p/host.yaml is this stage's (`fabric: shared-nvswitch`). FM's partition 7 is
# exactly $GPU_RP; the VM (lab-fm) has it as its one managed='no' hostdev.
FR=/tmp/fabric-root            # the host root, in the chroot
FMJ=$O/fm-standin.json         # the stand-in's state, in the chroot (/out/fm-standin.json here)
fm_vp() { C VFIO_P2P_FM_LIBRARY="$FM_STANDIN" VFIO_P2P_FM_STANDIN="$FMJ" timeout 120 "$VFIO_P2P" --sysfs-root $FR "$@"; }
fm_state() { # [JQ-EDIT]: the stand-in's partition 7 = $GPU_RP, none active, plus the edit
    jqr -n --arg gpu "$GPU_RP" '{running: true, partitions: [{id: 7, gpus: [{module_id: 1, pci: $gpu, links: 18, max_links: 18}]}, {id: 8, gpus: [{module_id: 2, pci: "0000:21:00.0", links: 18, max_links: 18}]}]}'" | ${1:-.}" > /out/fm-standin.json
}
fm_active() { jqr -r '[.partitions[] | select(.active) | .id] | join(",")' < /out/fm-standin.json; }
fm_policy() { printf 'fabric: shared-nvswitch\nhook_policy: %s\n' "$1" > $R$FR/etc/vfio-p2p/host.yaml; }
fm_domain() {
    echo "<domain type='kvm'><name>lab-fm</name><devices>"
    echo "$GPU_RP" | sed 's/^\(....\):\(..\):\(..\)\.\(.\)$/<hostdev mode="subsystem" type="pci" managed="no"><driver name="vfio"\/><source><address domain="0x\1" bus="0x\2" slot="0x\3" function="0x\4"\/><\/source><\/hostdev>/'
    echo "</devices></domain>"
}
# fm_hook NAME OP SUB: the hook as libvirt runs it; output in /out/fabric-NAME.txt, exit in $rc
fm_hook() {
    displays_off $GPU_RP
    rc=0; fm_vp hook run lab-fm "$2" "$3" - < /out/fabric-domain.xml > /out/fabric-"$1".txt 2>&1 || rc=$?
    echo "== $1: hook $2 $3 (exit $rc)"; cat /out/fabric-"$1".txt
}
fm_recorded() { [ -s $R/run/vfio-p2p/fabric.json ] && jqr -r '.partitions | keys | join(",")' < $R/run/vfio-p2p/fabric.json; }
stage_fabric() {
    local before rc
    [ -n "$FM_STANDIN" ] && [ -f "$R$FM_STANDIN" ] || { fail "no stand-in FM library ('$FM_STANDIN'): cargo build --release -p vfio-p2p-fm-standin"; return 1; }
    mkdir -p $R$FR/etc/vfio-p2p
    for d in sys dev proc run boot; do ln -sfn /$d $R$FR/$d; done
    fm_domain > /out/fabric-domain.xml
    rc=0; vp unbind --all || rc=$?
    [ $rc = 0 ] || fail "unbind --all exited $rc"
    before=$(state $GPUS)
    echo "before: $before"

    # activation on prepare (after the bind, the GPU reset), deactivation on release
    fm_policy deny; fm_state
    fm_hook activate prepare begin
    [ $rc = 0 ] || fail "prepare (deny, FM up): exit $rc"
    [ "$(driver_of $GPU_RP)" = vfio-pci ] || fail "$GPU_RP on '$(driver_of $GPU_RP)' after prepare"
    [ "$(fm_active)" = 7 ] || fail "after prepare FM has '$(fm_active)' active, expected 7"
    [ "$(fm_recorded)" = 7 ] || fail "after prepare the record has '$(fm_recorded)', expected 7"
    grep -q 'no reset method' /out/fabric-activate.txt && NOTE="$GPU_RP has no sysfs reset: activated unreset"
    jqr -r '.calls[]' < /out/fm-standin.json
    fm_hook deactivate release end
    [ $rc = 0 ] || fail "release: exit $rc"
    [ -z "$(fm_active)" ] || fail "after release FM has '$(fm_active)' active"
    [ -z "$(fm_recorded)" ] || fail "after release the record has '$(fm_recorded)'"
    [ "$(state $GPUS)" = "$before" ] || fail "release did not restore the drivers: $(state $GPUS)"

    # FM refuses (NVLink training, in use) or the connection drops before the activation: under
    # deny the bind is rolled back, exactly, and no partition is left active
    for edit in '.fail_activate = {"7": "nvlink_error"}' '.fail_activate = {"7": "in_use"}' '.connection_lost_after = 3'; do
        fm_state "$edit"
        fm_hook "deny-$(echo "$edit" | tr -dc 'a-z_')" prepare begin
        [ $rc = 1 ] || fail "prepare (deny, $edit): exit $rc, expected 1"
        [ "$(state $GPUS)" = "$before" ] || fail "deny, $edit: not rolled back: $(state $GPUS)"
        [ -z "$(fm_active)" ] || fail "deny, $edit: FM has '$(fm_active)' active"
        [ -z "$(fm_recorded)" ] || fail "deny, $edit: recorded '$(fm_recorded)'"
    done
    grep -q 'rolled back' /out/fabric-deny-fail_activatenvlink_error.txt || fail "the NVLink refusal does not say it rolled back"
    # under warn the guest starts, bound, without NVLink; release gives the GPU back
    fm_policy warn; fm_state '.fail_activate = {"7": "nvlink_error"}'
    fm_hook warn-refused prepare begin
    [ $rc = 0 ] || fail "prepare (warn, FM refuses): exit $rc"
    grep -q 'warning: .*starts without NVLink' /out/fabric-warn-refused.txt || fail "warn: no 'starts without NVLink' warning"
    [ "$(driver_of $GPU_RP)" = vfio-pci ] || fail "warn: $GPU_RP on '$(driver_of $GPU_RP)'"
    fm_hook warn-refused-release release end
    [ "$(state $GPUS)" = "$before" ] || fail "warn: release did not restore: $(state $GPUS)"
    # FM not running: warn starts the guest, deny refuses naming the fix, before binding anything
    fm_state '.running = false'
    fm_hook warn-down prepare begin
    [ $rc = 0 ] && grep -q 'systemctl start nvidia-fabricmanager' /out/fabric-warn-down.txt || fail "warn, FM down: exit $rc, no fix named"
    fm_hook warn-down-release release end
    fm_policy deny
    fm_hook deny-down prepare begin
    [ $rc = 1 ] && grep -q 'systemctl start nvidia-fabricmanager' /out/fabric-deny-down.txt || fail "deny, FM down: exit $rc, no fix named"
    [ "$(state $GPUS)" = "$before" ] || fail "deny, FM down: devices moved: $(state $GPUS)"
    [ -z "$WHY" ]
}

# guest-topo (issue #22): level B from `gen qemu` mirror with all five stand-ins, booted with
# lab_b=topo (level-b.sh runs only `vfio-p2p-agent topo`); the guest's path label of every pair
# must be level A's host label: PIX (switch), PHB (root ports of one host bridge), NODE (host
# bridges of node 0), SYS (node 0 to node 1), through one expander per host bridge on its NUMA node.
topo_b_boot() { # ACCEL LIMIT: one boot; console to /out/level-b-topo.log
    echo "== level B (topo), accel $1, limit $2 s"
    b_args "$1" /out/gen-topo.json > /out/b-topo-args-$1.sh
    eval "set -- $2 $(cat /out/b-topo-args-$1.sh)"
    local limit=$1
    shift
    C timeout -k 5 "$limit" "$@" -nodefaults -monitor none -no-reboot \
        -kernel "$KERNEL" -initrd "$INITRD_B" -append "console=ttyS0 quiet panic=-1 lab_b=topo" \
        -fw_cfg name=opt/vfio-p2p-lab/nccl-topo.xml,file=$O/nccl-topo.xml \
        < /dev/null > /out/level-b-topo.log 2>&1
    echo "level B (topo) QEMU exit $?"
}

stage_guest_topo() {
    local rc accel a b host guest want got n=0 labels=""
    ensure_vfio $GPUS
    printf 'name: lab-b-topo\nmemory_mib: %s\nvcpus: %s\nguest_topology: mirror\nfirmware: bios\n' "$MEM_B" "$VCPUS_B" > /out/vm-b-topo.yaml
    rc=0; vp gen qemu --config $O/vm-b-topo.yaml --gpus "$(csv $GPUS)" $GEN_OPTS --format json \
        --expect-out $O/expect-topo.json > /out/gen-topo.json 2> /out/gen-topo.err || rc=$?
    cat /out/gen-topo.json /out/gen-topo.err
    [ $rc = 0 ] && is_json /out/gen-topo.json || { fail "gen qemu (mirror, all five) exited $rc or printed no JSON"; return 1; }
    # one expander per host bridge of level A (10, 20, 80), on guest nodes 0, 0, 1; memory bound
    got=$(jqr -r '[.[] | select(startswith("{")) | fromjson | select(.driver == "pxb-pcie") | .numa_node] | join(" ")' < /out/gen-topo.json)
    [ "$got" = "0 0 1" ] || fail "expanders on guest nodes [$got], want [0 0 1] (one per host bridge)"
    jqr -e '[.[] | select(test("host-nodes=[01],policy=bind"))] | length == 2' < /out/gen-topo.json > /dev/null ||
        fail "no memory backend bound to each host node"
    # (other warnings are expected: the ACS-less switch pair, the GPUs without a clique)
    grep -q 'in the guest, .* on the host' /out/gen-topo.err &&
        fail "gen warned that a pair's label will differ: $(grep 'in the guest, .* on the host' /out/gen-topo.err | head -n1)"
    # the NCCL file for the same guest, handed to level B through fw_cfg (checked below)
    rc=0; vp gen nccl --config $O/vm-b-topo.yaml --gpus "$(csv $GPUS)" $GEN_OPTS -o $O/nccl-topo.xml \
        2> /out/gen-nccl-topo.err || rc=$?
    cat /out/nccl-topo.xml /out/gen-nccl-topo.err
    [ $rc = 0 ] || { fail "gen nccl (mirror, all five) exited $rc"; return 1; }
    boot_b topo_b_boot /out/level-b-topo.log
    accel=$B_ACCEL
    NOTE="level B under $accel: $B_SECS s"
    tr -d '\r' < /out/level-b-topo.log | sed 's/^/B| /'
    grep -q LAB-B-DONE /out/level-b-topo.log || { fail "level B (topo, $accel) did not finish"; return 1; }
    tr -d '\r' < /out/level-b-topo.log | grep -q 'NUMA nodes online: 0-1' || fail "level B does not have NUMA nodes 0-1"
    tr -d '\r' < /out/level-b-topo.log | sed -n '/^LAB-B-TOPO-BEGIN/,/^LAB-B-TOPO-END/p' | sed '1d;$d' > /out/b-TOPO.json
    rc=$(tr -d '\r' < /out/level-b-topo.log | sed -n 's/^LAB-B-TOPO-END rc=//p')
    [ "$rc" = 0 ] || fail "agent topo exited '$rc'"
    is_json /out/b-TOPO.json || { fail "agent topo printed no JSON"; return 1; }
    # per pair: host BDFs (from the expectation), the host label it carries, the guest's label
    jqr -r --slurpfile e $O/expect-topo.json '($e[0].gpus | map({key: .guest_bdf, value: .host_bdf}) | from_entries) as $h
        | .pairs[] | "\($h[.a]) \($h[.b]) \(.host) \(.guest)"' < /out/b-TOPO.json > /out/topo-pairs.txt
    while read -r a b host guest; do
        want=$(expected_label "$a" "$b")
        echo "$a $b: level A $want, expectation $host, guest $guest"
        [ "$host" = "$want" ] || fail "$a $b: expectation says $host, level A's tree is $want"
        [ "$guest" = "$want" ] || fail "$a $b: guest reads $guest, host $want"
        n=$((n + 1)); labels="$labels $guest"
    done < /out/topo-pairs.txt
    [ $n = 10 ] || fail "$n pairs checked, want 10"
    for want in PIX PHB NODE SYS; do
        case " $labels " in *" $want "*) ;; *) fail "no $want pair among the guest's labels" ;; esac
    done
    # the agent in level B checked gen's NCCL file against what that guest sees
    tr -d '\r' < /out/level-b-topo.log | sed -n '/^LAB-B-NCCLTOPO-BEGIN/,/^LAB-B-NCCLTOPO-END/p' | sed '1d;$d' > /out/b-NCCLTOPO.json
    rc=$(tr -d '\r' < /out/level-b-topo.log | sed -n 's/^LAB-B-NCCLTOPO-END rc=//p')
    is_json /out/b-NCCLTOPO.json || { fail "agent nccl-topo printed no JSON (rc '$rc')"; return 1; }
    [ "$rc" = 0 ] || fail "agent nccl-topo exited '$rc': $(jqr -c .problems < /out/b-NCCLTOPO.json)"
    got=$(jqr -r '[.gpus[] | select(.in_guest)] | length' < /out/b-NCCLTOPO.json)
    [ "$got" = 5 ] || fail "$got of the NCCL file's GPUs are in the guest, want 5"
    NOTE="$n/10 pairs host = guest (PIX PHB NODE SYS), NCCL file agrees ($got/5 GPUs, 0 problems), $NOTE"
}

# cdev: check sees /dev/iommu and the VFIO device cdevs (or their absence, as on every Debian
# kernel) and says which IOMMU backends this host offers; --iommu-backend iommufd fails with
# the fix exactly when there is no iommufd, and gen's auto picks what check said
stage_cdev() {
    local rc iommu=no cdev=no kv row st
    local q=/usr/bin/qemu-system-x86_64 pair="$GPU_SW0,$GPU_RP"
    ensure_vfio $GPUS
    kv=$(uname -r)
    [ -e /dev/iommu ] && iommu=yes
    ls /dev/vfio/devices/vfio* > /dev/null 2>&1 && cdev=yes
    echo "kernel $kv: /dev/iommu $iommu, VFIO cdevs $cdev"
    C grep -E 'CONFIG_(IOMMUFD|VFIO_DEVICE_CDEV|VFIO_PCI_DMABUF)[= ]' /boot/config-$kv || echo "(no /boot/config-$kv in the chroot)"
    rc=0; vp check --gpus "$pair" --qemu $q --format json > /out/check-cdev.json || rc=$?
    row=$(jqr -r '.checks[] | select(.check == "iommu-backend") | .saw' < /out/check-cdev.json)
    echo "== check (exit $rc): iommu-backend: $row"
    if [ $iommu = yes ] && [ $cdev = yes ]; then
        echo "$row" | grep -q 'legacy and iommufd' || fail "the host has /dev/iommu and VFIO cdevs, check says: $row"
    else
        echo "$row" | grep -q 'legacy only' || fail "no iommufd here, check says: $row"
        [ $iommu = yes ] || echo "$row" | grep -q '/dev/iommu does not exist' || fail "check does not name the missing /dev/iommu: $row"
    fi
    rc=0; vp check --gpus "$pair" --qemu $q --iommu-backend iommufd --format json > /out/check-cdev-iommufd.json || rc=$?
    st=$(jqr -r '.checks[] | select(.check == "iommu-backend") | .status' < /out/check-cdev-iommufd.json)
    echo "== check --iommu-backend iommufd (exit $rc): iommu-backend $st"
    if [ $iommu = yes ] && [ $cdev = yes ]; then
        [ "$st" = pass ] || fail "--iommu-backend iommufd on a host with iommufd: $st"
    else
        [ "$st" = fail ] && [ $rc = 2 ] || fail "--iommu-backend iommufd without iommufd: $st, exit $rc (expected fail, 2)"
        jqr -r '.checks[] | select(.check == "iommu-backend") | .fix' < /out/check-cdev-iommufd.json | grep -q -- '--iommu-backend legacy' ||
            fail "the failure does not give the fix (--iommu-backend legacy)"
    fi
    rc=0; vp gen qemu --gpus "$pair" --iommu-backend auto --qemu $q > /out/gen-auto.txt 2> /out/gen-auto.err || rc=$?
    cat /out/gen-auto.err
    if [ $iommu = yes ] && [ $cdev = yes ]; then :; else
        grep -q 'auto: legacy' /out/gen-auto.err || fail "gen --iommu-backend auto did not pick legacy without iommufd"
        grep -q iommufd /out/gen-auto.txt && fail "gen auto emitted iommufd on a host without it"
    fi
    NOTE="kernel $kv: /dev/iommu $iommu, VFIO cdev $cdev; check: $(echo "$row" | cut -c1-120)"
    echo "$NOTE"
    [ -z "$WHY" ]
}

# p2p-dma: an IOMMU-routed peer write for real. Level B (stage guest's boot) gets QEMU's edu
# beside its stand-ins; level-b.sh (p2p_dma) has the edu's DMA engine copy a pattern out of each
# stand-in's BAR 0 (peer read) and into another page of it (peer write), then writes to an IOVA
# that nothing maps (the control). The DMA goes edu -> level A's IOMMU (level B's VFIO mappings)
# -> the peer BAR, the path of a guest's GPU P2P. Whether it lands is what `check` predicts for
# the backend: legacy VFIO maps peer BARs into the IOMMU; iommufd without dma-buf BARs does not.
# Timings here are functional (TCG / nested KVM), not performance.

# p2p_dma_device [IOMMUFD]: level B's extra -device, the edu on vfio-pci (level A's edu has
# dma_mask widened to 64 bits, tests/lab/run topology_args): in run_b only when this stage is
# selected; in run_b_iommufd always, on gen's iommufd object IOMMUFD (stage iommufd asserts it)
p2p_dma_device() {
    [ -n "${1:-}" ] || case " $LAB_STAGES " in *" p2p-dma "*) ;; *) return 0 ;; esac
    sysfs_bind $EDU vfio-pci > /dev/null 2>&1 || { echo "note: cannot bind edu $EDU to vfio-pci" >&2; return 0; }
    echo "-device vfio-pci,host=$EDU,id=p2p-edu${1:+,iommufd=$1}"
}

# p2p_dma_backend: the backend level B ran under (gen's arguments; P2P_BACKEND overrides)
p2p_dma_backend() {
    if [ -n "${P2P_BACKEND:-}" ]; then echo "$P2P_BACKEND"
    elif grep -q iommufd /out/gen.json; then echo iommufd
    else echo legacy; fi
}

# p2p_dma_predicted BACKEND: what `check --iommu-backend BACKEND` predicts for a peer write
# into level B's stand-ins: lands (legacy; iommufd with dma-buf BARs), faults, or unknown
p2p_dma_predicted() {
    local row
    vp check --gpus "$(csv $GPUS_B)" --qemu /usr/bin/qemu-system-x86_64 --iommu-backend "$1" $GEN_OPTS \
        --format json > /out/check-p2p-dma.json
    jqr -r '.checks[] | select(.check | test("^iommu")) | "\(.check) \(.status): \(.saw)"' < /out/check-p2p-dma.json >&2
    row=$(jqr -r '[.checks[] | select(.check == "iommufd-p2p")][0] // {} | "\(.status) \(.saw)"' < /out/check-p2p-dma.json)
    if jqr -e '.checks[] | select(.check == "iommu-backend") | .saw | startswith("legacy for this VM")' \
        < /out/check-p2p-dma.json > /dev/null; then echo lands
    else case $row in
        "pass "*"peer BARs are mapped"*) echo lands ;;
        *"peer BARs cannot be mapped"*) echo faults ;;
        *) echo unknown ;;
    esac; fi
}

# p2p_dma_field LINE KEY: the value of KEY=... in a LAB-B-P2P line
p2p_dma_field() { echo " $1" | sed -n "s/.* $2=\([^ ]*\).*/\1/p"; }
# p2p_dma_fault PAGE: level A's IOMMU logged a fault of the edu at this page, in the kernel log
# of this level B's boot ($dmesg of the calling p2p_dma_assert)
p2p_dma_fault() {
    case $1 in 0x[0-9a-fA-F]*) ;; *) return 1 ;; esac   # not a number: no arithmetic error in /init
    # Linux 6.1: "DMAR: [DMA Write NO_PASID] Request device [00:14.0] fault addr 0x40000000 [fault reason ...";
    # Linux 7.2 names the device with its domain: "Request device [0000:00:14.0] fault addr ..."
    grep -qE "device \[(0000:)?$(echo "${EDU#0000:}" | sed 's/\./\\./')\].* fault addr (0x)?$(printf '%x' $(($1 & ~0xfff)))( |$)" \
        "$dmesg"
}
# dmesg_mark NAME / dmesg_since NAME: level A's kernel log from NAME's mark on (one level B's
# boot: the ring holds the earlier ones too; the lab kernel prints no timestamps to cut by)
dmesg_mark() { echo "vfio-p2p-lab: $1 starts" > /dev/kmsg; }
dmesg_since() { dmesg | sed -n "/vfio-p2p-lab: $1 starts/,\$p"; }

# p2p_dma_assert OUTCOME LOG EXPECT DMESG: level B's LAB-B-P2P lines in LOG against the
# predicted OUTCOME (lands | faults), one verdict per stand-in (named by host BDF through gen's
# EXPECT), level A's faults read from DMESG (that boot's kernel log, dmesg_since); the control
# write must fault in either case. Stages p2p-dma (legacy) and iommufd assert their boots with it.
p2p_dma_assert() {
    local want=$1 log=$2 expect=$3 dmesg=$4 line gpu host res src dst n=0 seen=""
    tr -d '\r' < "$log" | sed -n 's/^LAB-B-P2P //p' > /tmp/p2p-lines
    while read -r line; do
        gpu=$(p2p_dma_field "$line" gpu); res=$(p2p_dma_field "$line" result)
        src=$(p2p_dma_field "$line" src); dst=$(p2p_dma_field "$line" dst)
        host=$(jqr -r --arg g "$gpu" '[.gpus[] | select(.guest_bdf == $g) | .host_bdf][0] // "?"' < "$expect")
        n=$((n + 1)); seen="$seen $host"
        [ "$(p2p_dma_field "$line" mmio)" = ok ] || fail "$host (guest $gpu): the pattern did not even read back through MMIO"
        case $want in
            lands)
                echo "$host (guest $gpu): $([ "$res" = lands ] && echo PASS || echo FAIL) lands: wrote $(p2p_dma_field "$line" want), read back $(p2p_dma_field "$line" read)"
                [ "$res" = lands ] || fail "$host: the peer write did not land (read $(p2p_dma_field "$line" read), want $(p2p_dma_field "$line" want))"
                p2p_dma_fault "$src" || p2p_dma_fault "$dst" && fail "$host: level A's IOMMU logged a fault at its BAR" ;;
            faults)
                echo "$host (guest $gpu): $([ "$res" = absent ] && echo PASS || echo FAIL) faults: read back $(p2p_dma_field "$line" read), DMAR fault $(p2p_dma_fault "$dst" && echo logged || echo missing)"
                [ "$res" = absent ] || fail "$host: the peer write landed, predicted to fault"
                p2p_dma_fault "$src" || p2p_dma_fault "$dst" || fail "$host: no DMAR fault of ${EDU#0000:} at $src or $dst in level A" ;;
            *) fail "no prediction to assert ($want)" ;;
        esac
    done < /tmp/p2p-lines
    for host in $GPUS_B; do case "$seen " in *" $host "*) ;; *) fail "no peer DMA result for stand-in $host" ;; esac; done
    [ $n = "$(echo $GPUS_B | wc -w)" ] || fail "$n peer DMA results, $(echo $GPUS_B | wc -w) stand-ins"
    # the control: a write where nothing is mapped must fault, or a fault could not be seen at all
    line=$(tr -d '\r' < "$log" | sed -n 's/^LAB-B-P2P-CONTROL //p')
    [ -n "$line" ] || { fail "level B ran no control write"; return; }
    [ "$(p2p_dma_field "$line" mapped)" = no ] || fail "the control IOVA is mapped in level B: $line"
    if p2p_dma_fault "$(p2p_dma_field "$line" iova)"; then echo "control: write to $(p2p_dma_field "$line" iova) faulted in level A: PASS"
    else fail "the control write to $(p2p_dma_field "$line" iova) left no DMAR fault in level A's log"; fi
}

# p2p_dma_passes OUTCOME LOG EXPECT DMESG: p2p_dma_assert's verdict alone (a subshell: the stage's own
# failures are untouched)
# shellcheck disable=SC2030 # WHY and NFAIL are reset for this subshell only, on purpose
p2p_dma_passes() (WHY=""; NFAIL=0; p2p_dma_assert "$@"; [ -z "$WHY" ])

# shellcheck disable=SC2031 # WHY here is the stage's own; p2p_dma_passes resets a copy
stage_p2p_dma() {
    local backend want rc secs
    grep -q LAB-B-DONE /out/level-b.log 2>/dev/null || { fail "level B did not run (stage guest)"; return 1; }
    dmesg_since guest-boot > /out/p2p-dma-dmesg.txt
    [ -s /out/p2p-dma-dmesg.txt ] || fail "level A's kernel log lost the mark before level B's boot (ring overrun?)"
    echo "== level A's IOMMU faults"; grep DMAR /out/p2p-dma-dmesg.txt | grep -i fault
    echo "== level B"; tr -d '\r' < /out/level-b.log | grep -E '^LAB-B(: p2p-dma|: edu|-P2P)'
    grep -q '^LAB-B-P2P-END' /out/level-b.log || { fail "level B has no p2p-dma results (edu not passed through?)"; return 1; }
    backend=$(p2p_dma_backend)
    want=$(p2p_dma_predicted "$backend")
    echo "== backend $backend: check predicts the peer write $want"
    p2p_dma_assert "$want" /out/level-b.log /out/expect.json /out/p2p-dma-dmesg.txt
    # the assertions can fail: the same results against the other prediction must not pass
    p2p_dma_passes "$([ "$want" = lands ] && echo faults || echo lands)" /out/level-b.log /out/expect.json /out/p2p-dma-dmesg.txt > /out/p2p-dma-opposite.log &&
        fail "the results also pass the opposite prediction (see p2p-dma-opposite.log)"
    secs=$(tr -d '\r' < /out/level-b.log | sed -n 's/^LAB-B-P2P-END .*seconds=//p')
    NOTE="$backend: check predicts $want; $(grep -c "^LAB-B-P2P " /out/level-b.log) stand-in(s) $want, control faulted; functional timing (TCG/nested), not performance: ${secs}s in level B"
    [ -z "$WHY" ]
}

# iommufd (LAB_KERNEL=iommufd): level B from gen's arguments with --iommu-backend iommufd
# (-object iommufd + vfio-pci,iommufd=). What `check --iommu-backend iommufd` predicts must be
# what happens: the clique offset the agent finds in level B, and whether QEMU could map the
# peer BARs into the IOAS, read from QEMU's own stderr (warnings and -trace lines):
# - QEMU 10.0 (backends/iommufd.c iommufd_backend_map_dma): IOMMU_IOAS_MAP cannot pin a BAR's
#   PFNMAP: "IOMMU_IOAS_MAP failed: Bad address, PCI BAR?", then hw/vfio's
#   "vfio_container_dma_map(...) = -14 (Bad address)", and the VM starts anyway;
# - QEMU 11.1 (hw/vfio/region.c vfio_region_create_dma_buf, QemuVersion::BAR_DMABUF): each BAR is
#   exported as a dma-buf (trace vfio_region_dmabuf) and mapped with IOMMU_IOAS_MAP_FILE (trace
#   iommufd_backend_map_file_dma, ret 0); without the kernel's export it says "dma-buf not
#   supported in kernel, using mmap fallback, P2P DMA will not work" / "dma-buf unavailable".
IOMMUFD_TRACE="-trace enable=iommufd_backend_map* -trace enable=vfio_region_dmabuf*"

run_b_iommufd() { # ACCEL LIMIT: level B; console in /out/level-b-iommufd.log, QEMU's stderr in .qemu.log
    echo "== level B with iommufd, accel $1, limit $2 s"
    b_args "$1" /out/gen-iommufd.json > /out/b-iommufd-args-$1.sh
    echo "arguments from gen (as changed by the lab): $(cat /out/b-iommufd-args-$1.sh)"
    eval "set -- $2 $(cat /out/b-iommufd-args-$1.sh)"
    local limit=$1
    shift
    # shellcheck disable=SC2046 # p2p_dma_device prints words for QEMU's argv, or nothing
    C timeout -k 5 "$limit" "$@" $(p2p_dma_device "$(iommufd_object_id)") $IOMMUFD_TRACE -nodefaults -monitor none -no-reboot \
        -kernel "$KERNEL" -initrd "$INITRD_B" -append "console=ttyS0 quiet panic=-1" \
        < /dev/null > /out/level-b-iommufd.log 2> /out/level-b-iommufd.qemu.log
    echo "level B QEMU exit $?"
}

# iommufd_object_id: the id of gen's -object iommufd (the edu joins it)
iommufd_object_id() {
    jqr -r '. as $a | [range(length - 1) | select($a[.] == "-object") | $a[. + 1]
            | select(startswith("iommufd,")) | capture("(^|,)id=(?<id>[^,]+)").id][0] // empty' < /out/gen-iommufd.json
}

# bar_mapping_seen QEMU-LOG: mapped | not-mapped | unclear, from QEMU's own words
bar_mapping_seen() {
    local failed dmabuf mapped_file
    failed=$(grep -cE 'IOMMU_IOAS_MAP(_FILE)? failed: .*PCI BAR\?|peer-to-peer transactions on BARs are not supported|dma-buf unavailable|dma-buf not supported in kernel' "$1")
    dmabuf=$(grep -c 'vfio_region_dmabuf ' "$1")
    mapped_file=$(grep -cE 'iommufd_backend_map_file_dma .*\(0\)' "$1")
    echo "QEMU log: $failed BAR mapping failure(s), $dmabuf BAR dma-buf(s), $mapped_file IOMMU_IOAS_MAP_FILE mapping(s) that succeeded" >&2
    if [ "$failed" -gt 0 ]; then echo not-mapped
    elif [ "$dmabuf" -gt 0 ] && [ "$mapped_file" -gt 0 ]; then echo mapped
    else echo unclear; fi
}

# iommufd_peer_dma OUTCOME: the edu's peer DMA in the iommufd boot (level-b.sh p2p_dma) against
# OUTCOME, what check's BAR verdict implies (mapped: lands; not mapped: faults); sets P2P_SEEN
# shellcheck disable=SC2031 # WHY here is the stage's own; p2p_dma_passes resets a copy
iommufd_peer_dma() {
    local n log=/out/level-b-iommufd.log expect=/out/expect-iommufd.json dmesg=/out/iommufd-p2p-dma-dmesg.txt
    P2P_SEEN="not run"
    echo "== peer DMA under iommufd (edu on iommufd=$(iommufd_object_id)): check's verdict means it $1"
    echo "level A's IOMMU faults in this boot:"; grep DMAR "$dmesg" | grep -i fault
    tr -d '\r' < "$log" | grep -E '^LAB-B(: p2p-dma|: edu|-P2P)'
    grep -q '^LAB-B-P2P-END' "$log" || { fail "level B with iommufd has no p2p-dma results (edu not passed through?)"; return; }
    p2p_dma_assert "$1" "$log" "$expect" "$dmesg"
    p2p_dma_passes "$([ "$1" = lands ] && echo faults || echo lands)" "$log" "$expect" "$dmesg" \
        > /out/iommufd-p2p-dma-opposite.log && fail "the iommufd peer DMA results also pass the opposite prediction"
    n=$(tr -d '\r' < "$log" | grep -c '^LAB-B-P2P ')
    P2P_SEEN="$1 for $n stand-in(s) as predicted, control faulted"
}

stage_iommufd() {
    local q=/usr/bin/qemu-system-x86_64 accel rc row predicted seen want got offsets
    [ -e /dev/iommu ] || { fail "no /dev/iommu: boot the lab kernel (LAB_KERNEL=iommufd)"; return 1; }
    ensure_vfio $GPUS_B
    ls /dev/vfio/devices/vfio* > /dev/null 2>&1 || fail "no VFIO device cdev under /dev/vfio/devices"
    modprobe vhost_vsock || [ -d /sys/module/vhost_vsock ] || fail "no vhost_vsock"
    # the prediction: check with the backend, the QEMU that will run level B and gen's options
    rc=0; vp check --gpus "$(csv $GPUS_B)" $GEN_OPTS --qemu $q --iommu-backend iommufd --format json > /out/check-iommufd.json || rc=$?
    echo "== check --iommu-backend iommufd (exit $rc)"; cat /out/check-iommufd.json
    is_json /out/check-iommufd.json || { fail "check printed no JSON"; return 1; }
    row=$(jqr -r '.checks[] | select(.check == "iommufd-p2p") | "\(.status | ascii_downcase) \(.saw)"' < /out/check-iommufd.json)
    echo "iommufd-p2p: $row"
    # the lab kernel has no /boot/config-* in the chroot: a pass rests on its /proc/config.gz
    # (IKCONFIG_PROC), not on the version alone
    case $row in pass*) [ ! -e /proc/config.gz ] || echo "$row" | grep -q 'with CONFIG_VFIO_PCI_DMABUF' ||
        fail "check did not read the kernel's options from /proc/config.gz: '$row'" ;; esac
    case $row in
        pass*) predicted=mapped ;;
        warn*"cannot be mapped"* | fail*"cannot be mapped"*) predicted=not-mapped ;;
        *) fail "check has no iommufd-p2p verdict to test: '$row'"; return 1 ;;
    esac
    vp plan --gpus "$(csv $GPUS_B)" $GEN_OPTS --format json > /out/plan-iommufd.json
    # the offsets check predicts for the GPUs that get a clique ("... at 0xC8" / "falls back to 0xD4")
    want=$(jqr -r --slurpfile p $O/plan-iommufd.json '[.checks[] | select(.check == "clique-placement")
            | select(.subject as $s | $p[0].assignments[$s] != null) | .saw | ascii_downcase
            | if test("0xd4$") then "0xd4" elif test("0xc8$") then "0xc8" else "?" end] | sort | join(" ")' < /out/check-iommufd.json)
    # the arguments: gen's own, iommufd asked for
    printf 'name: lab-b-iommufd\nmemory_mib: %s\nvcpus: %s\nguest_topology: %s\nfirmware: bios\n' "$MEM_B" "$VCPUS_B" "$GUEST_TOPOLOGY" > /out/vm-b-iommufd.yaml
    rc=0; vp gen qemu --config $O/vm-b-iommufd.yaml --gpus "$(csv $GPUS_B)" $GEN_OPTS --iommu-backend iommufd --qemu $q \
        --format json --expect-out $O/expect-iommufd.json > /out/gen-iommufd.json 2> /out/gen-iommufd.err || rc=$?
    echo "== gen qemu --iommu-backend iommufd (exit $rc)"; cat /out/gen-iommufd.err /out/gen-iommufd.json
    [ $rc = 0 ] && is_json /out/gen-iommufd.json || { fail "gen qemu --iommu-backend iommufd: exit $rc"; return 1; }
    jqr -e '. as $a | [range(length - 1) | select($a[.] == "-object" and ($a[. + 1] | startswith("iommufd,id=")))] | length == 1' \
        < /out/gen-iommufd.json > /dev/null || fail "gen emitted not exactly one -object iommufd,id=…"
    jqr -e '[.[] | select(startswith("{")) | fromjson | select(.driver == "vfio-pci")] | length > 0 and all(.[]; .iommufd != null)' \
        < /out/gen-iommufd.json > /dev/null || fail "a vfio-pci device without iommufd="
    dmesg_mark iommufd-boot
    boot_b run_b_iommufd /out/level-b-iommufd.log
    accel=$B_ACCEL
    dmesg_since iommufd-boot > /out/iommufd-p2p-dma-dmesg.txt
    [ -s /out/iommufd-p2p-dma-dmesg.txt ] || fail "level A's kernel log lost the mark before level B's boot (ring overrun?)"
    echo "== QEMU's stderr (BAR mapping)"; cat /out/level-b-iommufd.qemu.log
    tr -d '\r' < /out/level-b-iommufd.log | sed 's/^/B| /'
    grep -q LAB-B-DONE /out/level-b-iommufd.log || { fail "level B ($accel) with iommufd did not finish"; return 1; }
    seen=$(bar_mapping_seen /out/level-b-iommufd.qemu.log)
    echo "peer BARs: check predicted $predicted, QEMU's log shows $seen"
    [ "$seen" = "$predicted" ] || fail "peer BARs: check predicted $predicted, QEMU's log shows $seen"
    # the guest sees the planned cliques at the offsets check predicted
    rc=$(b_section SCAN /out/level-b-iommufd.log /out/b-iommufd-SCAN.json)
    [ "$rc" = 0 ] && is_json /out/b-iommufd-SCAN.json || { fail "agent scan exited '$rc'"; return 1; }
    got=$(jqr -r '[.gpus[] | select(.clique != null) | .cap_offset] | sort | join(" ")' < /out/b-iommufd-SCAN.json)
    echo "clique offsets in the guest: [$got], check predicted: [$want]"
    [ -n "$want" ] && [ "$got" = "$want" ] || fail "clique offsets in the guest [$got], check predicted [$want]"
    want=$(jqr -r --arg g "$GPUS_B" '[.assignments as $a | $g | split(" ")[] | $a[.] | tostring] | sort | join(" ")' < /out/plan-iommufd.json)
    got=$(jqr -r '[.gpus[].clique | tostring] | sort | join(" ")' < /out/b-iommufd-SCAN.json)
    [ "$got" = "$want" ] || fail "agent scan finds cliques [$got], plan says [$want]"
    offsets=$(jqr -r '[.gpus[] | select(.clique != null) | .cap_offset] | unique | join(",")' < /out/b-iommufd-SCAN.json)
    iommufd_peer_dma "$([ "$predicted" = mapped ] && echo lands || echo faults)"
    NOTE="$(C qemu-system-x86_64 --version | head -n1 | sed 's/ *Copyright.*//'), Linux $(uname -r): peer BARs $seen as check predicted; peer DMA $P2P_SEEN; cliques at $offsets; level B $accel $B_SECS s"
    echo "$NOTE"
    [ -z "$WHY" ]
}

# stage incus (Incus for real), in a file of its own
# shellcheck source=tests/lab/stage-incus.sh
. /stage-incus.sh
# stage ch (Cloud Hypervisor for real), likewise
# shellcheck source=tests/lab/stage-ch.sh
. /stage-ch.sh
# stages reset and address-space (issue #32), likewise
# shellcheck source=tests/lab/stage-reset.sh
. /stage-reset.sh
# shellcheck source=tests/lab/stage-address-space.sh
. /stage-address-space.sh

# ------------------------------------------------------------------------------ main
run_stage() {
    local name=$1 t0 res
    case " $LAB_STAGES " in *" $name "*) ;; *) echo "LAB-STAGE $name SKIP 0 not selected" | tee -a /out/stages.txt; return ;; esac
    echo "LAB-PROGRESS $name ..."
    t0=$(up); WHY=""; NFAIL=0; NOTE=""; SKIP=""
    # SKIP: what a stage that cannot run here (its program absent from the stack) says instead
    if "stage_$(echo "$name" | tr - _)" > /out/"$name".log 2>&1 && [ -z "$WHY" ]; then res=PASS; else res=FAIL; fi
    [ -z "$SKIP" ] || { res=SKIP; NOTE=$SKIP; }
    sed "s/^/[$name] /" /out/"$name".log
    [ $NFAIL -le 3 ] || WHY="$WHY; ... $NFAIL failures in all, see $name.log"
    echo "LAB-STAGE $name $res $(awk "BEGIN { printf \"%.1f\", $(up) - $t0 }") ${WHY:-$NOTE}" | tee -a /out/stages.txt
}

if ! mount_shares; then
    echo "LAB-STAGE boot FAIL $(up) cannot mount the 9p shares"
else
    # shellcheck source=/dev/null # written by tests/lab/run (write_env)
    . /out/lab.env
    GPUS="$GPU_SW0 $GPU_SW1 $GPU_RP $GPU_HB $GPU_FAR"
    # the stand-ins start on a host driver like real GPUs do, so bind/rollback have something to restore
    for m in bochs vfio_pci vfio_iommu_type1; do modprobe $m || echo "modprobe $m failed"; done
    # a KVM host: check looks for /dev/kvm, level B may use it (TCG's emulated SVM)
    modprobe kvm_amd 2> /dev/null || modprobe kvm_intel 2> /dev/null || echo "no KVM module loads"
    if [ "$AS_NVIDIA" = 1 ]; then present_as_nvidia || echo "present_as_nvidia failed"; fi
    echo "LAB-STAGE boot PASS $(awk "BEGIN { printf \"%.1f\", $(up) }") kernel $(uname -r)"
    for s in $LAB_STAGES; do run_stage "$s"; done
    sync
    umount /out
fi
# tests/lab/run tells this power-off from a reset or a kernel death by this line
echo "LAB-END poweroff"
poweroff -f
