#!/bin/busybox sh
# shellcheck shell=dash
# /init of level B, the guest started from `vfio-p2p gen qemu`'s arguments. Runs our agent and
# prints its results between markers on the console, which level A reads (level-a.sh b_section):
#   LAB-B-SCAN-BEGIN / <JSON> / LAB-B-SCAN-END rc=N, the same for EXPECT and WRONG, LAB-B-DONE
# (booted with lab_b=topo, by stage guest-topo: only TOPO, then LAB-B-DONE; with lab_b=incus,
# by stage incus: SCAN, EXPECT and WRONG against expectations fetched over vsock)
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
dmesg -n 1   # keep kernel messages out of the JSON on the console
FW=/sys/firmware/qemu_fw_cfg/by_name
modprobe qemu_fw_cfg || echo "LAB-B: modprobe qemu_fw_cfg failed"
# the guest side of virtio-vsock (stage fleet); virtio_pci first, it may be a module
modprobe virtio_pci 2> /dev/null
modprobe vmw_vsock_virtio_transport || echo "LAB-B: modprobe vmw_vsock_virtio_transport failed"

up() { cut -d' ' -f1 /proc/uptime; }
echo "LAB-B: kernel $(uname -r), up $(up)s"
for d in /sys/bus/pci/devices/*; do
    [ "$(cat "$d/vendor")" = 0x10de ] || continue
    # the bytes where QEMU puts the clique capability, for the record
    echo "LAB-B: ${d##*/} $(cat "$d/vendor"):$(cat "$d/device") class $(cat "$d/class") at 0xc8:" \
        "$(dd if="$d/config" bs=8 skip=25 count=1 2> /dev/null | hexdump -v -e '8/1 " %02x"')"
done
echo "LAB-B: fw_cfg expect.json: $(cat $FW/opt/vfio-p2p/expect.json/raw 2>&1)"
echo "LAB-B: up $(up)s, running the agent"

# section NAME CMD...: the command's stdout between markers, its stderr after them
section() {
    local name=$1 rc
    shift
    echo "LAB-B-$name-BEGIN"
    timeout 60 "$@" 2> /tmp/stderr
    rc=$?
    echo "LAB-B-$name-END rc=$rc"
    sed "s/^/LAB-B-STDERR $name: /" /tmp/stderr
}
# stage guest-topo (level-a.sh) boots this guest with lab_b=topo: only the path labels
if grep -q 'lab_b=topo' /proc/cmdline; then
    echo "LAB-B: NUMA nodes online: $(cat /sys/devices/system/node/online)"
    for d in /sys/bus/pci/devices/*; do echo "LAB-B: $(readlink -f "$d") numa_node $(cat "$d/numa_node")"; done
    section TOPO vfio-p2p-agent topo --format json
    # gen nccl's file for this guest (fw_cfg), checked against what the guest sees
    if cat $FW/opt/vfio-p2p-lab/nccl-topo.xml/raw > /tmp/nccl-topo.xml 2> /dev/null; then
        section NCCLTOPO vfio-p2p-agent --format json nccl-topo /tmp/nccl-topo.xml
    else
        echo "LAB-B: no fw_cfg opt/vfio-p2p-lab/nccl-topo.xml"
    fi
    echo "LAB-B-DONE up $(up)s"
    sync
    poweroff -f
fi
# stage address-space (level-a.sh) boots this guest with lab_b=addr: its physical address width
# and where the firmware put the 64-bit BAR of level A's ivshmem (1af4:1110, BAR 2: 64-bit
# prefetchable), from sysfs and the kernel's own log, then off
if grep -q 'lab_b=addr' /proc/cmdline; then
    echo "LAB-B-ADDR bits $(sed -n 's/^address sizes.*: \([0-9]*\) bits physical.*/\1/p' /proc/cpuinfo | head -n1)"
    for d in /sys/bus/pci/devices/*; do
        [ "$(cat "$d/vendor"):$(cat "$d/device")" = 0x1af4:0x1110 ] || continue
        echo "LAB-B-ADDR bar2 ${d##*/} $(sed -n 3p "$d/resource")"
    done
    dmesg | grep -E 'root bus resource \[mem|addressable|BAR 2|bridge window .*64bit' | sed 's/^/LAB-B-ADDR dmesg /'
    echo "LAB-B-DONE up $(up)s"
    sync
    poweroff -f
fi
# stage ch (stage-ch.sh) boots this guest under Cloud Hypervisor with lab_b=ch: CH has no vendor
# override, so the stand-ins (1234:1111, class 0x0380) are shown to the agent as 10de:2330 here,
# the way level A's present_as_nvidia does: vendor, device and a copy of config with the ids
# patched, bind-mounted over the sysfs files; the capabilities in the copy are CH's own
# shellcheck disable=SC2059 # the format is the escape
byte() { printf "\\$(printf %03o "$1")"; }
if grep -q 'lab_b=ch' /proc/cmdline; then
    for d in /sys/bus/pci/devices/*; do
        [ "$(cat "$d/vendor"):$(cat "$d/device"):$(cat "$d/class")" = 0x1234:0x1111:0x038000 ] || continue
        f=/tmp/nv/${d##*/}; mkdir -p "$f"
        echo 0x10de > "$f/vendor"; echo 0x2330 > "$f/device"; cat "$d/config" > "$f/config"
        { byte 0xde; byte 0x10; byte 0x30; byte 0x23; } | dd of="$f/config" conv=notrunc 2> /dev/null
        for a in vendor device config; do mount --bind "$f/$a" "$d/$a"; done
        echo "LAB-B: ${d##*/} shown as 10de:2330 (CH has no vendor override); at 0xd4:" \
            "$(dd if="$d/config" bs=4 skip=53 count=2 2> /dev/null | hexdump -v -e '8/1 " %02x"')"
    done
fi
section SCAN vfio-p2p-agent scan --format json
# stage incus (stage-incus.sh) boots this guest as an Incus VM with lab_b=incus, stage ch with
# lab_b=ch: the VMM picks the guest addresses, so level A makes the expectation from the VMM's
# own report of them once the guest runs and serves it over vsock (port 7390; the wrong one,
# every clique moved by one, on 7391)
if grep -qE 'lab_b=(incus|ch)' /proc/cmdline; then
    fetch() { # PORT FILE
        local n=0
        while [ $n -lt 20 ]; do
            timeout 30 socat -u VSOCK-CONNECT:2:"$1" - > "$2" 2> /tmp/fetch.err && [ -s "$2" ] && return 0
            n=$((n + 1)); sleep 3
        done
        echo "LAB-B: no expectation on vsock port $1: $(cat /tmp/fetch.err)"
    }
    fetch 7390 /tmp/expect.json
    echo "LAB-B: expectation from level A: $(cat /tmp/expect.json)"
    section EXPECT vfio-p2p-agent expect --expect /tmp/expect.json --format json
    fetch 7391 /tmp/wrong.json
    section WRONG vfio-p2p-agent expect --expect /tmp/wrong.json --format json
    echo "LAB-B-DONE up $(up)s"
    sync
    # under Incus level A reads this console from Incus (incus console --show-log), which has
    # nothing once QEMU is gone: level A stops the VM when it has read LAB-B-DONE
    grep -q 'lab_b=incus' /proc/cmdline && sleep 900
    poweroff -f
fi
section EXPECT vfio-p2p-agent expect --format json
# must not pass: the harness moved every clique of the real expectation by one
section WRONG vfio-p2p-agent expect --expect $FW/opt/vfio-p2p-lab/wrong-expect.json/raw --format json
# fleet (docs/fleet.md): the findings go to the host's collector over vsock (port from fw_cfg)
section SEND vfio-p2p-agent expect --send --format json
# level A now swaps the host's plan for this CID for a wrong one (level-a.sh fleet_arm):
# the same findings, sent again, must be judged FAIL
sleep 8
section SEND2 vfio-p2p-agent expect --send --format json
# a hostile sender on the same CID: garbage, an oversized body, a field the schema lacks
hostile() {
    timeout 30 socat -u - VSOCK-CONNECT:2:7389
    echo "LAB-B-HOSTILE $1 rc=$?"
}
echo 'not json' | hostile garbage
head -c 1048576 /dev/zero | hostile oversized
echo '{"version":1,"vm":"lab-b","domain":"lab-b","boot_id":"0","agent_version":"x","measured":false,"agent_exit":0,"gpus":[]}' |
    hostile unknown-field
# p2p-dma (level-a.sh stage_p2p_dma, only when level A passed QEMU's edu 1234:11e8 through):
# the edu's DMA engine copies a pattern out of each stand-in's BAR 0 into its own buffer (peer
# read) and back into another page of that BAR (peer write). Both go device -> level A's IOMMU ->
# the peer BAR, the path a guest's GPU P2P takes; the pattern is read back through MMIO. edu
# registers (QEMU docs/specs/edu.rst): 0x80 source, 0x88 destination, 0x90 count, 0x98 command
# (bit 0 start/busy, bit 1 direction: 0 = PCI address -> buffer, 1 = buffer -> PCI address);
# its buffer is at 0x40000 (4 KiB; QEMU aborts on a range outside it). 32-bit register writes
# set the whole address, so peers must sit below 4 GiB (the stand-ins' BAR 0 is a 32-bit BAR).
#   LAB-B-P2P gpu=BDF bar0=A src=A dst=A want=W,W read=W,W mmio=ok|bad result=lands|absent
#   LAB-B-P2P-CONTROL iova=A mapped=no|yes: a write to an IOVA nothing maps (level A logs the fault)
P2P_BUF=0x40000
P2P_WORDS=2   # each devmem is a process: ~0.1-0.3 s under nested KVM
P2P_CONTROL_IOVA=0x40000000   # above level B's 512 MiB of RAM, below q35's PCI hole
hex() { printf '0x%x' "$1"; }
rd32() { devmem "$(hex "$1")" 32; }
wr32() { devmem "$(hex "$1")" 32 "$(hex "$2")"; }
# words ADDR: the P2P_WORDS 32-bit words at ADDR, comma-joined
words() {
    local k=0 out=""
    while [ $k -lt $P2P_WORDS ]; do out="$out${out:+,}$(hex $(($(rd32 $(($1 + k * 4))))))"; k=$((k + 1)); done
    echo "$out"
}
# edu_dma EDU_BAR SRC DST CMD: one copy of P2P_WORDS words; waits (at most 10 s) for its end
edu_dma() {
    local n=0
    wr32 $(($1 + 0x80)) "$2"
    wr32 $(($1 + 0x88)) "$3"
    wr32 $(($1 + 0x90)) $((P2P_WORDS * 4))
    wr32 $(($1 + 0x98)) "$4"
    usleep 120000   # the edu runs a DMA 100 ms (virtual time) after its start
    while [ $(($(rd32 $(($1 + 0x98))) & 1)) = 1 ] && [ $n -lt 200 ]; do usleep 50000; n=$((n + 1)); done
    [ $n -lt 200 ] || echo "LAB-B: edu DMA $4 from $(hex "$2") to $(hex "$3") did not finish"
}
bar0() { hex $(($(head -n1 "$1/resource" | cut -d' ' -f1))); }
# mem_on DEV [BUS_MASTER]: memory decoding (and bus mastering) on, as a driver would set it
# shellcheck disable=SC2059 # the format is the octal escape of the byte
mem_on() { printf "\\00$((2 + ${2:-0} * 4))\\000" | dd of="$1/config" bs=1 seek=4 conv=notrunc 2> /dev/null; }
p2p_dma() {
    local edu="" e d i=0 b src dst k want got mmio t0 iova a
    for d in /sys/bus/pci/devices/*; do
        [ "$(cat "$d/vendor"):$(cat "$d/device")" = 0x1234:0x11e8 ] && edu=$d
    done
    [ -n "$edu" ] || return 0
    # without /dev/mem every devmem fails and the arithmetic on its output would kill /init
    [ -c /dev/mem ] || { echo "LAB-B: p2p-dma: no /dev/mem (a kernel without CONFIG_DEVMEM): not run"; return 0; }
    t0=$(up)
    mem_on "$edu" 1
    e=$(bar0 "$edu")
    echo "LAB-B: p2p-dma: edu ${edu##*/} BAR 0 at $e, id $(hex $(($(rd32 "$e"))))"
    for d in /sys/bus/pci/devices/*; do
        [ "$(cat "$d/vendor")" = 0x10de ] || continue
        mem_on "$d"
        b=$(bar0 "$d"); src=$((b + 0x1000)); dst=$((b + 0x2000))
        # an unassigned BAR (0) would aim the DMA at RAM; the edu's 32-bit writes cannot reach 4 GiB
        if [ $((b)) = 0 ] || [ $((dst + 0x1000)) -gt $((0xffffffff)) ]; then
            echo "LAB-B-P2P gpu=${d##*/} bar0=$b src=$(hex $src) dst=$(hex $dst) want=none read=none mmio=bad result=absent"
            i=$((i + 1)); continue
        fi
        k=0; want=""
        while [ $k -lt $P2P_WORDS ]; do
            a=$((0x50320000 + (i << 8) + k))   # "P2", the stand-in, the word
            want="$want${want:+,}$(hex $a)"
            wr32 $((src + k * 4)) $a
            wr32 $((dst + k * 4)) 0
            k=$((k + 1))
        done
        mmio=ok; [ "$(words $src)" = "$want" ] || mmio=bad
        edu_dma "$e" $src $P2P_BUF 1   # peer read: stand-in BAR -> edu buffer
        edu_dma "$e" $P2P_BUF $dst 3   # peer write: edu buffer -> stand-in BAR
        got=$(words $dst)
        echo "LAB-B-P2P gpu=${d##*/} bar0=$b src=$(hex $src) dst=$(hex $dst) want=$want read=$got mmio=$mmio" \
            "result=$([ "$got" = "$want" ] && echo lands || echo absent)"
        i=$((i + 1))
    done
    # the control: neither level B's RAM nor a BAR (what its QEMU maps for DMA) is at this address
    iova=$P2P_CONTROL_IOVA
    grep 'System RAM' /proc/iomem | while read -r a _; do
        [ $((0x${a%-*})) -le $((iova)) ] && [ $((0x${a#*-})) -ge $((iova)) ] && echo "LAB-B: $iova is RAM: $a"
    done > /tmp/control
    cat /sys/bus/pci/devices/*/resource | while read -r a z _; do
        [ $((a)) != 0 ] && [ $((a)) -le $((iova)) ] && [ $((z)) -ge $((iova)) ] && echo "LAB-B: $iova is a BAR: $a-$z"
    done >> /tmp/control
    cat /tmp/control
    edu_dma "$e" $P2P_BUF $iova 3
    echo "LAB-B-P2P-CONTROL iova=$iova mapped=$([ -s /tmp/control ] && echo yes || echo no)"
    echo "LAB-B-P2P-END stand-ins=$i seconds=$(awk "BEGIN { print $(up) - $t0 }")"
}
p2p_dma
echo "LAB-B-DONE up $(up)s"
sync
poweroff -f
