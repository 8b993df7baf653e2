# shellcheck shell=dash
# shellcheck disable=SC2086 # lists of BDFs and options: split on purpose
# shellcheck disable=SC2016 # the $ in single quotes are jq's
# Stage ch, sourced by level-a.sh (the helpers there: C, vp, jqr, fail, b_section, ...).
#
# Cloud Hypervisor for real (docs/integrations.md, "Cloud Hypervisor"): level B boots under a CH
# built from its source (tests/lab/run copies LAB_CH to $CH; CI cannot build CH, so without it
# the stage says it was skipped), from `vfio-p2p gen cloud-hypervisor`'s arguments as they are
# (the kernel, initramfs and command line, lab_b=ch, from vm-ch.yaml: gen refuses a CH VM that
# boots nothing), plus what the lab adds: the serial console into /out, an API socket (CH's own
# report of the guest addresses) and a vsock (CID 3). CH
# has no vendor override, so level B's /init shows the stand-ins to the agent as 10de:2330 the
# way level A's present_as_nvidia does (sysfs files bind-mounted; the capability list is CH's).
# The agent's scan must find the planned cliques at 0xd4 (CH's offset), `expect` must pass an
# expectation made in level A from the plan and the addresses CH reports (vm.info), served over
# CH's vsock (its unix socket), and fail a wrong one.

CH_LOG=/out/level-b-ch.log
CH_API=/tmp/ch-api.sock
CH_VSOCK=/tmp/ch-vsock.sock
CH_EXPECT_PORT=7390   # as in stage incus: level-b.sh fetches it (the wrong one: +1)

# ch_expect_server: each connection to CH's vsock port 7390 (7391: wrong) gets an expectation made
# now from CH's device tree (vm.info: each device's id and guest pci_bdf), gen's ids (id=gpuN on
# path=/sys/bus/pci/devices/HOST/) and the plan's cliques
ch_expect_server() {
    cat > $R/tmp/lab-ch-expect.sh << 'EOF'
#!/bin/sh
# $1: right or wrong
curl -s --max-time 20 --unix-socket /tmp/ch-api.sock http://localhost/api/v1/vm.info | tee /tmp/out/ch-vm-info.json |
jq -c --arg wrong "$1" --slurpfile gen /tmp/out/ch-gen.json --slurpfile plan /tmp/out/plan-ch.json '
    [$gen[0][] | select(startswith("path=")) | capture("^path=/sys/bus/pci/devices/(?<h>[^/]+)/,id=(?<id>[^,]+)")] as $ids
    | .device_tree as $t
    | {version: 1, vm: "lab-b-ch", gpus: [$ids[] | .h as $h | select($plan[0].assignments | has($h))
        | {host_bdf: $h, guest_bdf: $t[.id].pci_bdf,
           clique: ($plan[0].assignments[$h] | if $wrong == "wrong" then (if . == null then 7 else (. + 1) % 16 end) else . end),
           vendor: "0x10de", device: "0x2330"}]}'
EOF
    C socat UNIX-LISTEN:${CH_VSOCK}_$CH_EXPECT_PORT,fork EXEC:"sh /tmp/lab-ch-expect.sh right" > /out/ch-expect-server.log 2>&1 &
    CH_SRV="$!"
    C socat UNIX-LISTEN:${CH_VSOCK}_$((CH_EXPECT_PORT + 1)),fork EXEC:"sh /tmp/lab-ch-expect.sh wrong" >> /out/ch-expect-server.log 2>&1 &
    CH_SRV="$CH_SRV $!"
}

# ch_boot LIMIT: level B under CH, gen's arguments first (program name dropped), then the lab's
ch_boot() {
    local limit=$1
    jqr -r '.[1:][] | @sh' < /out/ch-gen.json | tr '\n' ' ' > /out/ch-args.sh
    eval "set -- $(cat /out/ch-args.sh)"
    set -- "$@" --serial "file=$O/${CH_LOG#/out/}" --console off --api-socket "path=$CH_API" --vsock "cid=3,socket=$CH_VSOCK"
    printf '%s\n' "$CH" "$@" > /out/ch-argv-run.txt
    echo "== cloud-hypervisor, limit $limit s: $(tr '\n' ' ' < /out/ch-argv-run.txt)"
    C timeout -k 5 "$limit" "$CH" "$@" < /dev/null > /out/ch.out 2>&1 &
    CH_PID=$!
}

stage_ch() {
    local t0 rc s limit
    if [ ! -x "$R$CH" ]; then
        SKIP="NOTE: no Cloud Hypervisor binary (LAB_CH=PATH of one built from source; CI cannot build it)"
        return 0
    fi
    [ -c /dev/kvm ] || { fail "Cloud Hypervisor needs KVM: no /dev/kvm in level A"; return 1; }
    ensure_vfio $GPUS_B
    C "$CH" --version > /out/ch-version.txt 2>&1
    echo "$(head -n1 /out/ch-version.txt)"
    # console: none: the lab adds its own serial (a file it reads back), as the recording did
    printf 'name: lab-b-ch\nmemory_mib: %s\nvcpus: %s\nconsole: none\nkernel: %s\ninitramfs: %s\ncmdline: "%s"\n' \
        "$MEM_B" "$VCPUS_B" "$KERNEL" "$INITRD_B" "console=ttyS0 quiet panic=-1 lab_b=ch" > /out/vm-ch.yaml
    vp plan --gpus "$(csv $GPUS_B)" $GEN_OPTS --format json > /out/plan-ch.json
    rc=0; vp gen cloud-hypervisor --config $O/vm-ch.yaml --gpus "$(csv $GPUS_B)" $GEN_OPTS --format json \
        --expect-out $O/expect-ch-gen.json > /out/ch-gen.json || rc=$?
    echo "== gen cloud-hypervisor (exit $rc)"; cat /out/ch-gen.json
    [ $rc = 0 ] && is_json /out/ch-gen.json || { fail "gen cloud-hypervisor exited $rc"; return 1; }
    rc=0; vp check --vmm cloud-hypervisor --gpus "$(csv $GPUS_B)" $GEN_OPTS --format json > /out/ch-check.json || rc=$?
    echo "check --vmm cloud-hypervisor (exit $rc): $(jqr -c '[.checks[]? | [.check, .status]]' < /out/ch-check.json 2> /dev/null)"
    vp snapshot --output $O/ch-snapshot > /dev/null || fail "snapshot of level A failed"
    rm -f $R${CH_VSOCK}_* $R$CH_API
    : > $CH_LOG
    ch_expect_server
    limit=$(b_limit "$TIMEOUT_B_KVM")
    t0=$(up)
    ch_boot "$limit"
    while ! grep -q LAB-B-DONE $CH_LOG 2> /dev/null && kill -0 $CH_PID 2> /dev/null; do up > /out/heartbeat; sleep 3; done
    wait $CH_PID; rc=$?
    NOTE="level B under $(head -n1 /out/ch-version.txt) (nested KVM): $(awk "BEGIN { printf \"%.0f\", $(up) - $t0 }") s"
    echo "cloud-hypervisor exit $rc"; cat /out/ch.out
    for s in $CH_SRV; do kill $s 2> /dev/null; done
    tr -d '\r' < $CH_LOG | sed 's/^/B| /'
    grep -q LAB-B-DONE $CH_LOG || { fail "level B under Cloud Hypervisor did not finish (exit $rc)"; return 1; }
    # Cloud Hypervisor's clique capability sits at 0xd4; the expectation is made from CH's addresses
    scan_matches_plan $CH_LOG /out/b-ch-SCAN.json /out/plan-ch.json 0xd4 || return 1
    expect_verdicts $CH_LOG b-ch
    # gen's --expect-out predicts CH's numbering (decide/cloud_hypervisor.rs); the lab's argv adds
    # `--console off` (one number fewer) and `--vsock` (one more), so the GPUs land where gen said
    if jqr -e --slurpfile ch $O/ch-vm-info.json '[.gpus[].guest_bdf] | sort == ([$ch[0].device_tree[] | select(.id | test("^gpu[0-9]+$")) | .pci_bdf] | sort)' \
        < /out/expect-ch-gen.json > /dev/null 2>&1; then echo "gen's --expect-out addresses are CH's"
    else fail "gen's --expect-out addresses $(jqr -c '[.gpus[].guest_bdf]' < /out/expect-ch-gen.json) are not CH's (ch-vm-info.json)"; fi
    [ -z "$WHY" ]
}
