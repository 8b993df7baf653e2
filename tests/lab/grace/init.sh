#!/bin/busybox sh
# shellcheck shell=dash
# /init of the aarch64 Grace guest (tests/lab/grace/run): shows the stand-ins to the agent as the
# planned NVIDIA part, records what the kernel made of the ACPI tables (NUMA nodes, generic
# initiators, the PCI tree, the SMMUs), runs the agent and prints everything between markers on
# the console, which run cuts into files:
#   GRACE-<NAME>-BEGIN / <output> / GRACE-<NAME>-END rc=N   (TREE, SCAN, EXPECT, WRONG), GRACE-DONE
/bin/busybox --install -s /bin
export PATH=/bin LD_LIBRARY_PATH=/usr/lib/aarch64-linux-gnu
mkdir -p /proc /sys /dev /tmp
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
dmesg -n 1   # keep kernel messages out of the sections on the console
up() { cut -d' ' -f1 /proc/uptime; }
echo "GRACE: kernel $(uname -r) $(uname -m), up $(up)s"

# byte N: one byte (busybox printf knows octal escapes, not \x)
# shellcheck disable=SC2059 # the format is the escape
byte() { printf "\\$(printf %03o "$1")"; }
# The stand-ins (bochs-display, 1234:1111, class 0x038000) take the GPUs' places; the agent
# judges NVIDIA display controllers only, so vendor, device and config's first 4 bytes are
# bind-mounted over with the planned part's ids (the same overlay as tests/lab/level-a.sh
# present_as_nvidia). The kernel still sees 1234:1111.
nv=$(sed -n 's/.*grace_nv_device=\(0x[0-9a-f]*\).*/\1/p' /proc/cmdline)
for d in /sys/bus/pci/devices/*; do
    [ "$(cat "$d/vendor"):$(cat "$d/device")" = 0x1234:0x1111 ] || continue
    real=$(readlink -f "$d"); f=/tmp/nv/${d##*/}; mkdir -p "$f"
    echo 0x10de > "$f/vendor"; echo "$nv" > "$f/device"; cat "$real/config" > "$f/config"
    { byte 0xde; byte 0x10; byte $((nv & 255)); byte $((nv >> 8)); } | dd of="$f/config" conv=notrunc 2> /dev/null
    for a in vendor device config; do mount --bind "$f/$a" "$real/$a"; done
    echo "GRACE: stand-in ${d##*/} shown as 10de:${nv#0x}"
done

section() {
    local name=$1 rc
    shift
    echo "GRACE-$name-BEGIN"
    timeout 120 "$@" 2> /tmp/stderr
    rc=$?
    echo "GRACE-$name-END rc=$rc"
    sed "s/^/GRACE-STDERR $name: /" /tmp/stderr
}
# tree: every file the agent's NUMA check reads, and each PCI function's place, one
# "path<TAB>content" line per file (the replay test writes them back into a tree)
tree() {
    local f d
    for f in /sys/devices/system/node/online /sys/devices/system/node/possible \
             /sys/devices/system/node/has_cpu /sys/devices/system/node/has_memory \
             /sys/devices/system/node/has_generic_initiator \
             /sys/devices/system/node/node*/cpulist /sys/devices/system/node/node*/distance; do
        [ -f "$f" ] && printf '%s\t%s\n' "$f" "$(tr '\n' ' ' < "$f" | sed 's/ *$//')"
    done
    for f in /sys/devices/system/node/node*/meminfo; do
        printf '%s\t%s\n' "$f" "$(grep MemTotal "$f" | tr -s ' ')"
    done
    for d in /sys/bus/pci/devices/*; do
        printf '%s\t%s\n' "$d" "$(readlink -f "$d")"
        for f in vendor device class numa_node; do printf '%s\t%s\n' "$d/$f" "$(cat "$d/$f")"; done
        [ -e "$d/iommu" ] && printf '%s\t%s\n' "$d/iommu" "$(readlink -f "$d/iommu")"
        [ -e "$d/iommu_group" ] && printf '%s\t%s\n' "$d/iommu_group" "$(readlink -f "$d/iommu_group")"
    done
}
echo "GRACE-TREE-BEGIN"; tree; echo "GRACE-TREE-END rc=$?"
# what the kernel logged of SRAT and the SMMUs (the generic initiators' PCI handles are only here)
section DMESG sh -c 'dmesg | grep -i -e SRAT -e "generic initiator" -e NUMA -e smmu -e "ACPI: PCI Root" -e "node [0-9]"'
echo "GRACE: up $(up)s, running the agent"
section SCAN /bin/vfio-p2p-agent --format json scan
section EXPECT /bin/vfio-p2p-agent --format json expect --expect /expect.json
section WRONG /bin/vfio-p2p-agent --format json expect --expect /wrong.json
section EXPECTTEXT /bin/vfio-p2p-agent expect --expect /expect.json
echo "GRACE-DONE up $(up)s"
sync
poweroff -f
