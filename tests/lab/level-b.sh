#!/bin/busybox sh
# shellcheck shell=dash
# /init of level B, the guest started from `vfio-p2p gen qemu`'s arguments. Runs our agent and
# prints its results between markers on the console, which level A reads (level-a.sh stage_guest):
#   LAB-B-SCAN-BEGIN / <scan JSON> / LAB-B-SCAN-END rc=N, LAB-B-EXPECT rc=N, LAB-B-WRONG rc=N, LAB-B-DONE
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
dmesg -n 1   # keep kernel messages out of the JSON on the console
FW=/sys/firmware/qemu_fw_cfg/by_name
modprobe qemu_fw_cfg || echo "LAB-B: modprobe qemu_fw_cfg failed"

echo "LAB-B: kernel $(uname -r), up $(cut -d' ' -f1 /proc/uptime)s"
for d in /sys/bus/pci/devices/*; do
    echo "LAB-B: ${d##*/} $(cat "$d/vendor"):$(cat "$d/device") class $(cat "$d/class")"
    # the bytes where QEMU puts the clique capability, for the record
    [ "$(cat "$d/vendor")" = 0x10de ] && hexdump -C -s 0xc0 -n 16 "$d/config" | sed -n "1s/^/LAB-B: ${d##*/} /p"
done
echo "LAB-B: fw_cfg expect.json: $(cat $FW/opt/vfio-p2p/expect.json/raw 2>&1)"

echo LAB-B-SCAN-BEGIN
vfio-p2p-agent scan --format json
echo "LAB-B-SCAN-END rc=$?"
vfio-p2p-agent expect
echo "LAB-B-EXPECT rc=$?"
# must not pass: the harness moved every clique of the real expectation by one
vfio-p2p-agent expect --expect $FW/opt/vfio-p2p-lab/wrong-expect.json/raw
echo "LAB-B-WRONG rc=$?"
echo LAB-B-DONE
sync
poweroff -f
