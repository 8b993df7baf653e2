#!/bin/busybox sh
# /init of Level A for tests/qemu-patches/run.  Mounts this machine's / (9p, read-only) at /hostroot
# and the result dir (9p "qpout") at /out, binds the two display-class stand-ins to vfio-pci, then:
#   1. Debian's QEMU (unpatched) must refuse gpu0 (capability at 0xC8) with the clique property,
#      and must accept gpu1 (0xC8 free) - the control case;
#   2. the patched QEMU must accept gpu0 (trace: offset 0xd4) and gpu1 (0xc8);
#   3. Level B, started by the patched QEMU with both devices, must see the clique capabilities at
#      0xD4 / 0xC8, last in the chain (init-b.sh).
# Prints "QP-CHECK <name>: OK|FAIL ..." lines and "QP-RESULT: PASS|FAIL", then powers off.
/bin/busybox --install -s /bin
export PATH=/bin:/sbin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
up() { cut -d' ' -f1 /proc/uptime; }
log() { echo "LEVELA: $*"; }
ok() { echo "QP-CHECK $1: OK $2"; }
bad() { echo "QP-CHECK $1: FAIL $2"; }
R=/hostroot
C="chroot $R"

setup() {
    for m in virtio_pci 9pnet_virtio 9p; do modprobe $m || log "modprobe $m failed"; done
    mkdir -p $R /out
    mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144,cache=loose hostroot $R || return 1
    mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 qpout /out || return 1
    mount -t proc proc $R/proc; mount -t sysfs sysfs $R/sys; mount -t devtmpfs devtmpfs $R/dev
    mount -t tmpfs tmpfs $R/tmp; mount -t tmpfs tmpfs $R/run
}

find_dev() { # vendor:device -> first BDF
    for d in /sys/bus/pci/devices/*; do
        [ "$(cat $d/vendor):$(cat $d/device)" = "$1" ] && { echo ${d##*/}; return; }
    done
}

bind_vfio() {
    d=/sys/bus/pci/devices/$1
    [ -e $d/driver ] && echo $1 > $d/driver/unbind
    echo vfio-pci > $d/driver_override
    echo $1 > /sys/bus/pci/drivers_probe
    drv=$(basename "$(readlink $d/driver 2>/dev/null)"); g=$(basename "$(readlink $d/iommu_group 2>/dev/null)")
    if [ "$drv" = vfio-pci ] && [ -c /dev/vfio/$g ]; then ok bind-$1 "vfio-pci, iommu_group $g"; else bad bind-$1 "driver=$drv group=$g"; fi
}

main() {
    log "init at $(up)s"
    setup || { bad mount "9p mounts failed"; return; }
    . /out/qp.env
    FW="-L /usr/share/qemu -L /usr/share/seabios"
    DEB=/usr/bin/qemu-system-x86_64
    log "Debian QEMU: $($C $DEB --version | head -n1)"
    log "patched QEMU: $QP_PATCHED: $($C $QP_PATCHED --version | head -n1)"
    modprobe vfio; modprobe vfio_iommu_type1; modprobe vfio_pci
    GPU0=$(find_dev 0x1af4:0x1050); GPU1=$(find_dev 0x1234:0x1111)
    log "gpu0 (virtio-gpu-pci) = $GPU0, gpu1 (bochs-display) = $GPU1"
    [ -n "$GPU0" ] && [ -n "$GPU1" ] || { bad standins "not found"; return; }
    for b in $GPU0 $GPU1; do
        log "Level A config space of $b (class $(cat /sys/bus/pci/devices/$b/class)):"
        hexdump -C -n 256 /sys/bus/pci/devices/$b/config | sed 's/^/LEVELA-HEX /'
        od -An -tx1 -v /sys/bus/pci/devices/$b/config | awk -v dev=$b -f /capwalk.awk | sed 's/^/LEVELA-CAPS /'
    done
    if od -An -tx1 -v /sys/bus/pci/devices/$GPU0/config | awk -v dev=x -f /capwalk.awk | grep -q '^CAP x .*off=0xc8 '; then
        ok standin-c8-taken "$GPU0 has a capability starting at 0xc8"
    else bad standin-c8-taken "$GPU0 has no capability at 0xc8 (layout changed?)"; fi
    if od -An -tx1 -v /sys/bus/pci/devices/$GPU1/config | awk -v dev=x -f /capwalk.awk | grep -q '^CAP x .*off=0xc[89a-f] '; then
        bad standin-c8-free "$GPU1 has a capability in 0xc8..0xcf"
    else ok standin-c8-free "$GPU1 leaves 0xc8 free"; fi
    bind_vfio $GPU0; bind_vfio $GPU1

    # qtry <qemu> <vfio-pci opts> [extra]: realize the device, then quit at once (-S + monitor 'quit')
    qtry() {
        out=$(echo quit | $C timeout 120 $1 $FW -machine q35 -accel tcg -m 64 -nodefaults -display none -S \
              -monitor stdio -serial none $3 -device "vfio-pci,$2" 2>&1); rc=$?
        echo "$out" | grep -v -E '^\(qemu\)|QEMU [0-9.]* monitor|^quit' | sed 's/^/LEVELA-QEMU /'
    }
    NV="x-pci-vendor-id=0x10de,x-nv-gpudirect-clique=1,rombar=0"
    log "===== unpatched (Debian) QEMU ====="
    qtry $DEB "host=$GPU0,$NV"
    echo "$out" > /out/unpatched-gpu0.txt
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && echo "$out" | grep -q -i 'offset c8'; then
        ok unpatched-refuses-c8 "rc=$rc: $(echo "$out" | grep -i 'offset c8' | head -n1)"
    else bad unpatched-refuses-c8 "rc=$rc (expected a refusal mentioning offset c8)"; fi
    qtry $DEB "host=$GPU1,$NV"
    if [ $rc -eq 0 ]; then ok unpatched-accepts-free-c8 "rc=0"; else bad unpatched-accepts-free-c8 "rc=$rc"; fi
    log "===== patched QEMU ====="
    qtry $QP_PATCHED "host=$GPU0,$NV" "-trace vfio_add_nv_gpudirect_cap"
    echo "$out" > /out/patched-gpu0.txt
    if [ $rc -eq 0 ] && echo "$out" | grep -q 'clique 1 at config offset 0xd4'; then
        ok patched-gpu0-d4 "$(echo "$out" | grep -E 'offset 0xd4|warning' | tr '\n' ' ')"
    else bad patched-gpu0-d4 "rc=$rc"; fi
    qtry $QP_PATCHED "host=$GPU1,$NV" "-trace vfio_add_nv_gpudirect_cap"
    if [ $rc -eq 0 ] && echo "$out" | grep -q 'clique 1 at config offset 0xc8'; then
        ok patched-gpu1-c8 "$(echo "$out" | grep 'offset 0xc8')"
    else bad patched-gpu1-c8 "rc=$rc"; fi
    qtry $QP_PATCHED "host=$GPU0,x-nv-gpudirect-clique=1"
    if [ $rc -ne 0 ] && echo "$out" | grep -q 'invalid device vendor'; then ok patched-vendor-check "still refuses without the vendor override"
    else bad patched-vendor-check "rc=$rc"; fi

    log "===== Level B (patched QEMU) ====="
    KVMOK=no
    if grep -q -w -E 'vmx|svm' /proc/cpuinfo; then
        modprobe kvm_amd 2>/dev/null || modprobe kvm_intel 2>/dev/null
        [ -c /dev/kvm ] && KVMOK=yes
    fi
    DEVB="-device pcie-root-port,id=brp1,bus=pcie.0,chassis=1,slot=1
          -device vfio-pci,host=$GPU0,bus=brp1,x-pci-vendor-id=0x10de,x-pci-device-id=0x20b0,x-nv-gpudirect-clique=1,rombar=0
          -device pcie-root-port,id=brp2,bus=pcie.0,chassis=2,slot=2
          -device vfio-pci,host=$GPU1,bus=brp2,x-pci-vendor-id=0x10de,x-pci-device-id=0x2330,x-nv-gpudirect-clique=2,rombar=0"
    run_b() {
        case $1 in kvm) cpu=host; tmo=150 ;; *) cpu=max; tmo=900 ;; esac
        log "Level B accel=$1"
        t0=$(up)
        $C timeout $tmo $QP_PATCHED $FW -machine q35 -nodefaults -display none -no-reboot -monitor none \
            -accel $1 -cpu $cpu -smp 1 -m 256 -serial stdio -trace vfio_add_nv_gpudirect_cap \
            -kernel $QP_KERNEL -initrd $QP_INITRD_B \
            -append "console=ttyS0 quiet panic=-1 qp_expect=20b0:0xd4:1,2330:0xc8:2 qp_agent=$QP_AGENT" \
            $DEVB 2>&1 | tee /tmp/levelB.log
        log "Level B accel=$1 wall $(awk "BEGIN{print $(up) - $t0}") s"
        grep -q 'LEVELB-RESULT: PASS' /tmp/levelB.log
    }
    accel=$QP_ACCEL_B; [ "$accel" = auto ] && { [ $KVMOK = yes ] && accel=kvm || accel=tcg; }
    if ! run_b $accel && [ "$QP_ACCEL_B" = auto ] && [ $accel = kvm ]; then
        cp /tmp/levelB.log /out/levelB-kvm-failed.log
        log "nested KVM run did not PASS; retrying Level B with TCG"
        run_b tcg
    fi
    cp /tmp/levelB.log /out/levelB.log
    if grep -q 'LEVELB-RESULT: PASS' /tmp/levelB.log; then ok levelB "$(grep LEVELB-RESULT /tmp/levelB.log | tr -d '\r')"
    else bad levelB "$(grep LEVELB-RESULT /tmp/levelB.log | tr -d '\r')"; fi
}

main 2>&1 | tee /tmp/levelA.log
[ -d /out ] && cp /tmp/levelA.log /out/levelA.log
if grep -q 'QP-CHECK .*: FAIL' /tmp/levelA.log || ! grep -q 'QP-CHECK levelB: OK' /tmp/levelA.log; then
    echo "QP-RESULT: FAIL uptime=$(up)s $(grep 'QP-CHECK .*: FAIL' /tmp/levelA.log | cut -d: -f1 | tr '\n' ' ')"
else
    echo "QP-RESULT: PASS uptime=$(up)s"
fi
sync; umount /out 2>/dev/null
poweroff -f
