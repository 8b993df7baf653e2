#!/bin/busybox sh
# shellcheck shell=dash
# /init of level B, the guest started from `vfio-p2p gen qemu`'s arguments. Runs our agent and
# prints its results between markers on the console, which level A reads (level-a.sh b_section):
#   LAB-B-SCAN-BEGIN / <JSON> / LAB-B-SCAN-END rc=N, the same for EXPECT and WRONG, LAB-B-DONE
# (booted with lab_b=topo, by stage guest-topo: only TOPO, then LAB-B-DONE)
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
section SCAN vfio-p2p-agent scan --format json
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
echo "LAB-B-DONE up $(up)s"
sync
poweroff -f
