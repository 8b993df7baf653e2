#!/usr/bin/env bash
# Issue 15's reproducers (1-9) and issue 28's (r2-*), each run against the built binaries
# with a time limit;
# prints one table row per case: id, exit code, seconds, first line of the message.
#   tests/hostile/reproduce.sh [TARGET_DIR]   (default $CARGO_TARGET_DIR/release, else
#   target/release; build it first: cargo build --release --bins)
# Exit codes 101/134/>128 (panic, abort, signal) and 124 (killed at the limit) are failures;
# the script exits 1 if any case ends that way. Issue 28's cases also check what they print
# (`expect ID PATTERN`: the case's output must match, else it fails).
set -u
here=$(cd "$(dirname "$0")" && pwd)
# cargo's target directory: $CARGO_TARGET_DIR (relative to where cargo runs: the current one)
default_target=$here/../../target
[ -n "${CARGO_TARGET_DIR:-}" ] && default_target=$(realpath -m "$CARGO_TARGET_DIR")
target=${1:-$default_target/release}
bin=$target/vfio-p2p
agent=$target/vfio-p2p-agent
limit=${HOSTILE_LIMIT:-20}
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
bad=0

# case ID STDIN-FILE COMMAND... : runs it, prints "ID | rc | s | message".
case_() {
	local id=$1 input=$2
	shift 2
	local t0 t1 rc msg
	t0=$(date +%s.%N)
	timeout -s KILL "$limit" "$@" <"$input" >"$w/out" 2>"$w/err"
	rc=$?
	t1=$(date +%s.%N)
	msg=$( (grep -m1 -E 'error|warning|refus|panick|overflow|memory' "$w/err" || head -n1 "$w/err" || true) | cut -c1-170)
	[ -z "$msg" ] && msg="(stdout) $(head -n1 "$w/out" | cut -c1-150)"
	case $rc in 101 | 124 | 134 | 137 | 1[3-9][0-9] | 2[0-9][0-9]) bad=1 msg="FAIL: $msg" ;; esac
	printf '%-4s | %3s | %6.2f | %s\n' "$id" "$rc" "$(echo "$t1 - $t0" | bc)" "$msg"
}
null=/dev/null
nest() { # nest N: a domain with N nested elements inside <devices>
	printf '<domain type="kvm"><name>vm</name><devices>'
	for ((i = 0; i < $1; i++)); do printf '<a>'; done
	for ((i = 0; i < $1; i++)); do printf '</a>'; done
	printf '</devices></domain>\n'
}
"$bin" --example lab snapshot -o "$w/lab" >/dev/null
lab=$w/lab
gpu_bdf=0000:03:00.0 # the lab example's first GPU, below switch downstream port 02:00.0
port_bdf=0000:02:00.0
vm=$here/../fixtures/sysfs/h200x4-vm # a real VM's sysfs: the agent's input
agent_gpu=0000:00:06.0
fresh() { rm -rf "$w/t" && cp -a "$lab" "$w/t" && echo "$w/t"; }
tgpu() { echo "$w/t/sys/bus/pci/devices/$gpu_bdf"; }
afresh() { rm -rf "$w/t" && cp -a "$vm" "$w/t" && echo "$w/t"; }
agpu() { echo "$w/t/sys/bus/pci/devices/$agent_gpu"; }

echo "id   |  rc |      s | message"
nest 10000 >"$w/deep10k.xml"
nest 20000 >"$w/deep20k.xml"
case_ 1a $null "$bin" --example lab check --domain-xml "$w/deep10k.xml"
case_ 1b "$w/deep20k.xml" "$bin" --sysfs-root "$lab" hook run --dry-run vm prepare begin -
case_ 1c $null "$bin" libvirt patch "$w/deep10k.xml"

case_ 2a $null "$bin" --example lab place --shape 1x4294967296
case_ 2b $null "$bin" --example lab place --shape 100000x1

python3 "$here/flat_host.py" 1000 >"$w/flat1000.json"
case_ 3 $null "$bin" --sysfs-root "$w/flat1000.json" plan

t=$(fresh); rm "$(tgpu)/config"; mkfifo "$(tgpu)/config"
case_ 4a $null "$bin" --sysfs-root "$t" topo
case_ 4b $null "$bin" --sysfs-root "$t" check
case_ 4c $null "$bin" --sysfs-root "$t" plan
case_ 4d $null "$bin" --sysfs-root "$t" bind --dry-run "$gpu_bdf"
case_ 4e $null "$bin" --sysfs-root "$t" snapshot -o "$w/snap4e"
t=$(afresh); rm "$(agpu)/config"; mkfifo "$(agpu)/config"
case_ 4f $null "$agent" scan --sysfs-root "$t"
t=$(fresh); rm "$(tgpu)/numa_node"; mkfifo "$(tgpu)/numa_node"
case_ 4g $null "$bin" --sysfs-root "$t" topo
mkfifo "$w/nvfifo"
case_ 4h $null "$bin" --example lab plan --nvlink "$w/nvfifo"

case_ 5a $null "$bin" --example lab plan --nvlink /dev/zero
t=$(fresh); mkdir -p "$t/etc/vfio-p2p"
printf 'nvlink: {source: nvidia-smi, file: /dev/zero}\n' >"$t/etc/vfio-p2p/host.yaml"
case_ 5b $null "$bin" --sysfs-root "$t" plan --host-config "$t/etc/vfio-p2p/host.yaml"
case_ 5c $null "$agent" expect --sysfs-root "$vm" --expect /dev/zero
t=$(afresh); fw=$t/sys/firmware/qemu_fw_cfg/by_name/opt/vfio-p2p/expect.json
mkdir -p "$fw"; ln -s /dev/zero "$fw/raw"
case_ 5d $null "$agent" expect --sysfs-root "$t"
t=$(afresh); rm "$(agpu)/config"; ln -s /dev/zero "$(agpu)/config"
case_ 5e $null "$agent" scan --sysfs-root "$t"
t=$(afresh); rm "$(agpu)/config"; truncate -s 1G "$(agpu)/config"
case_ 5f $null "$agent" scan --sysfs-root "$t"
case_ 5g $null "$bin" --sysfs-root "$t" topo
t=$(fresh); rm "$(tgpu)/config"; ln -s /dev/zero "$(tgpu)/config"
case_ 5h $null "$bin" --sysfs-root "$t" topo

t=$(fresh); mkdir -p "$t/etc/vfio-p2p"
printf '<domain><name>vm\377</name></domain>' >"$w/nonutf8.xml"
printf 'hook_policy: warn\n' >"$t/etc/vfio-p2p/host.yaml"
case_ 6a "$w/nonutf8.xml" "$bin" --sysfs-root "$t" hook run vm prepare begin -
printf 'hook_policy: deny\n' >"$t/etc/vfio-p2p/host.yaml"
case_ 6b "$w/nonutf8.xml" "$bin" --sysfs-root "$t" hook run vm prepare begin -

# 7: the extended capability list of a switch downstream port points at itself.
t=$(fresh)
python3 - "$t/sys/bus/pci/devices/$port_bdf/config" <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
b[0x100:0x104] = (0x0001 | (1 << 16) | (0x100 << 20)).to_bytes(4, "little")  # AER, next = 0x100
open(p, "wb").write(b)
PY
case_ 7a $null "$bin" --sysfs-root "$t" plan
case_ 7b $null "$bin" --sysfs-root "$t" check

flat() { python3 "$here/flat_host.py" 2 "$@" >"$w/f.json" && echo "$w/f.json"; }
case_ 8a $null "$bin" --sysfs-root "$(flat 'iommu_group="4294967301"')" topo
case_ 8b $null "$bin" --sysfs-root "$(flat 'iommu_group="-1"')" topo
case_ 8c $null "$bin" --sysfs-root "$(flat 'iommu_group="abc"')" topo
case_ 8d $null "$bin" --sysfs-root "$(flat 'numa_node="4294967295"')" topo
case_ 8e $null "$bin" --sysfs-root "$(flat 'driver_override="nvidia\nvfio-pci"')" topo
t=$(fresh); rm "$(tgpu)"; ln -s .. "$(tgpu)"
case_ 8f $null "$bin" --sysfs-root "$t" bind --dry-run "$gpu_bdf"

cap=$here/../fixtures/nvidia-smi/h200x2-topo-m.txt
sed 's/^GPU0\(.*\)NV18/GPU0\1SYS/' "$cap" >"$w/asym.txt"
case_ 9a $null "$bin" --example flat-vm plan --nvlink "$w/asym.txt"
printf '0, 00000000:00:06.0\n1, 00000000:00:06.0\n' >"$w/shared-map.txt"
grep -v '^[0-9], ' "$cap" | grep -v '^index' >"$w/matrix.txt"
case_ 9b $null "$bin" --example flat-vm plan --nvlink "$w/matrix.txt" --nvlink "$w/shared-map.txt"
printf '0, 00000000:00:06.0\n0, 00000000:00:07.0\n' >"$w/dup-map.txt"
case_ 9c $null "$bin" --example flat-vm plan --nvlink "$w/matrix.txt" --nvlink "$w/dup-map.txt"
printf '<domain><name>v\0m</name></domain>' >"$w/nul.xml"
case_ 9d $null "$bin" libvirt patch "$w/nul.xml"
printf '<domain><name>a</name></domain><domain><name>b</name></domain>' >"$w/two.xml"
case_ 9e $null "$bin" libvirt patch "$w/two.xml"
case_ 9f $null "$bin" --sysfs-root "$(flat vendor=12)" topo
python3 - "$w/dup-expect.json" <<'PY'
import json, sys
g = {"host_bdf": "0000:07:00.0", "guest_bdf": "0000:00:05.0", "clique": 0, "vendor": "0x10de", "device": "0x2335"}
json.dump({"version": 1, "vm": "vm", "gpus": [g] * 20000, "pairs": []}, open(sys.argv[1], "w"))
PY
case_ 9g $null "$agent" expect --sysfs-root "$vm" --expect "$w/dup-expect.json"
t=$(afresh); rm "$(agpu)/config"; mkdir "$(agpu)/config"
case_ 9h $null "$agent" scan --sysfs-root "$t"
t=$(fresh); printf 'x' >"$t/sys/bus/pci/devices.file"; rm -rf "$t/sys/bus/pci/devices"; ln -s ../devices.file "$t/sys/bus/pci/devices"
case_ 9i $null "$bin" --sysfs-root "$t" topo
case_ 9j $null "$bin" --sysfs-root /etc/hostname/x topo
# expect ID ERE: the last case's stdout+stderr must match, else it is a failure.
expect() {
	if ! LC_ALL=C grep -qE -- "$2" "$w/out" "$w/err"; then
		bad=1
		printf '%-4s | FAIL: output does not match /%s/\n' "$1" "$2"
	fi
}

# --- issue 28 ---
qemu=$(command -v qemu-system-x86_64 || true)
if [ -n "$qemu" ]; then
	qargs=(-machine q35,accel=tcg -nodefaults -display none)
	for dev in 'vfio-pci,host=0000:05:00.0,id=gpu0,' $'vfio-pci,host=0000:05:00.0,id=gpu0,romfile=/r\xff.rom' \
		'vfio-pci,sysfsdev=/sys/bus/pci/devices/0000:05:00.0/,id=gpu0' 'vfio-pci-nohotplug,host=0000:05:00.0,id=gpu0'; do
		case_ r2a $null "$bin" --example dual-socket-pcie qemu-wrap --qemu "$qemu" -- "${qargs[@]}" \
			-device "$dev" -device vfio-pci,host=0000:06:00.0,id=gpu1
		expect r2a 'gpu0,?.*x-nv-gpudirect-clique=0: vfio .*no such host device'
	done
	case_ r2b $null "$bin" --example dual-socket-pcie qemu-wrap --qemu "$qemu" -- "${qargs[@]}" \
		-global vfio-pci.x-nv-gpudirect-clique=5 -device vfio-pci,host=0000:05:00.0,id=gpu0
	expect r2b 'keeps x-nv-gpudirect-clique=5 as written \(from -global'
else
	echo "r2a  | skipped: qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)"
fi
kv=$here/../../configs/kubevirt
case_ r2c $null "$bin" --example dual-socket-pcie kubevirt on-define-domain --vmi $'{\xff' --domain "$(cat "$kv/example-domain.xml")"
expect r2c 'vmi is not UTF-8.*hook_policy: warn'
case_ r2d $null "$bin" --example dual-socket-pcie kubevirt on-define-domain --vmi "$(cat "$kv/example-vmi.json")" --domain $'<domain>\xfe</domain>'
expect r2d 'domain is not UTF-8.*hook_policy: warn'

t=$(fresh); mkdir -p "$t/proc/sys/kernel"; truncate -s 1G "$t/proc/sys/kernel/osrelease"
case_ r2e $null "$bin" --sysfs-root "$t" check
rm "$t/proc/sys/kernel/osrelease"; mkfifo "$t/proc/sys/kernel/osrelease"
case_ r2f $null "$bin" --sysfs-root "$t" check
rm "$t/proc/sys/kernel/osrelease"; ln -s /dev/zero "$t/proc/sys/kernel/osrelease"
case_ r2g $null "$bin" --sysfs-root "$t" check
rm "$t/proc/sys/kernel/osrelease"; echo 6.1.0 >"$t/proc/sys/kernel/osrelease"
{ printf 'CONFIG_VFIO=m\n' | gzip; printf 'CONFIG_IOMMUFD=y\n' | gzip; } >"$t/proc/config.gz"
case_ r2h $null "$bin" --sysfs-root "$t" check
expect r2h 'could not tell'
head -c 100000000 /dev/zero | gzip >"$t/proc/config.gz"
case_ r2i $null "$bin" --sysfs-root "$t" check
expect r2i 'could not tell'

s=$w/state; mkdir -p "$s/plans" "$s/records/d"; mkfifo "$s/plans/fifo.json"
# collect must get past the FIFO and listen: still running when stopped after 3 s
case_ r2j $null sh -c 'timeout 3 "$0" collect --state-dir "$1" --unix-socket "$2"=5; echo "collect exit $?"' "$bin" "$s" "$w/vsock"
expect r2j 'fifo.json is not a regular file'
expect r2j 'collect exit 124'
mkfifo "$s/records/d/latest.json"
case_ r2k $null "$bin" verdicts --state-dir "$s"
expect r2k 'latest.json is not a regular file'
case_ r2l $null "$bin" collect --wait d --timeout 2 --state-dir "$s"
expect r2l 'latest.json is not a regular file'
rm "$s/records/d/latest.json"; ln -s /dev/zero "$s/records/d/latest.json"
case_ r2m $null "$bin" verdicts --state-dir "$s"
expect r2m 'latest.json is not a regular file'

deep=$w/deep-topo.xml
{ printf '<system version="1">'; for ((i = 0; i < 100000; i++)); do printf '<a>'; done; for ((i = 0; i < 100000; i++)); do printf '</a>'; done; printf '</system>\n'; } >"$deep"
case_ r2n $null "$agent" nccl-topo "$deep" --sysfs-root "$vm"
expect r2n 'nested deeper than 256'

python3 "$here/flat_host.py" 10000 >"$w/flat10000.json"
case_ r2o $null "$bin" --sysfs-root "$w/flat10000.json" topo
expect r2o 'path matrix is left out'
python3 "$here/flat_host.py" 4000 >"$w/flat4000.json"
case_ r2p $null "$bin" --sysfs-root "$w/flat4000.json" plan
expect r2p 'not listed'

case_ r2q $null "$bin" --example lab gen proxmox $'--name=vm\nargs: -cpu host,kvm=off'
expect r2q -- '--name: name "vm\\nargs'
printf 'name: vm\nmemory_mib: 18446744073709551615\n' >"$w/mem.yaml"
case_ r2r $null "$bin" --example lab gen qemu --config "$w/mem.yaml"
expect r2r 'more than any host has'
printf 'name: vm\nfirmware: uefi\novmf_code: "/x\\n.fd"\n' >"$w/ovmf.yaml"
case_ r2s $null "$bin" --example lab gen libvirt --config "$w/ovmf.yaml"
expect r2s 'control character'
t=$(fresh); rm "$(tgpu)/config"; ln -s /dev/zero "$(tgpu)/config"
case_ r2t $null "$bin" --sysfs-root "$t" topo
expect r2t 'config: unreadable: not a regular file'
t=$(fresh); rm -f "$(tgpu)/driver"; ln -s driver "$(tgpu)/driver"
case_ r2u $null "$bin" --sysfs-root "$t" topo
expect r2u 'points at driver, not at a driver'

printf 'machine: q35\ncpu: host,hidden=YES\nhostpci0: 0000:05:00.0,pcie=1,x-vga=on\nhostpci1: 0000:06:00.0,pcie=1\n' >"$w/pve.conf"
case_ r2v $null "$bin" --example dual-socket-pcie check --proxmox-conf "$w/pve.conf"
expect r2v 'hidden=YES'
expect r2v 'x-vga=on'

dom() { # dom CLIQUE0 CLIQUE1: a domain with the dual-socket example's GPUs 05:00.0 and 06:00.0
	printf "<domain type='kvm' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'><name>vm1</name><devices>"
	for b in 05 06; do printf "<hostdev mode='subsystem' type='pci' managed='yes'><source><address domain='0x0000' bus='0x%s' slot='0x00' function='0x0'/></source><alias name='ua-gpu%s'/></hostdev>" $b $b; done
	printf "</devices><qemu:override>"
	printf "<qemu:device alias='ua-gpu05'><qemu:frontend><qemu:property name='x-nv-gpudirect-clique' type='unsigned' value='%s'/></qemu:frontend></qemu:device>" "$1"
	printf "<qemu:device alias='ua-gpu06'><qemu:frontend><qemu:property name='x-nv-gpudirect-clique' type='unsigned' value='%s'/></qemu:frontend></qemu:device>" "$2"
	printf "</qemu:override></domain>\n"
}
dom 0 1 >"$w/split.xml"
case_ r2w $null "$bin" --example dual-socket-pcie check --domain-xml "$w/split.xml"
expect r2w 'clique-split'
case_ r2x "$w/split.xml" "$bin" --example dual-socket-pcie hook run --dry-run vm1 prepare begin -
expect r2x 'plan puts these GPUs in one clique'
exit $bad
