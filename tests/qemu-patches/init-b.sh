#!/bin/busybox sh
# /init of Level B for tests/qemu-patches/run.  Checks the emulated GPUDirect clique capability of every
# 0x10de device against qp_expect=<device>:<offset>:<clique>,... from the kernel command line: the
# capability must be at that offset, carry that clique id (version 0), and be the last one in the chain.
# Also runs `vfio-p2p-agent scan --format json` when the image has it (qp_agent=1) and checks that it reports
# the same offsets and cliques (an agent that prints nothing, the early stub, is only noted).
/bin/busybox --install -s /bin
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev 2>/dev/null
echo "LEVELB: init started, kernel $(uname -r), uptime $(cut -d' ' -f1 /proc/uptime)s"
expect=$(sed -n 's/.*qp_expect=\([^ ]*\).*/\1/p' /proc/cmdline)
result=PASS; n=0
for e in $(echo $expect | tr ',' ' '); do
    did=${e%%:*}; rest=${e#*:}; off=${rest%%:*}; cl=${rest#*:}
    d=""
    for x in /sys/bus/pci/devices/*; do
        [ "$(cat $x/vendor):$(cat $x/device)" = "0x10de:0x$did" ] && d=$x
    done
    if [ -z "$d" ]; then echo "LEVELB: FAIL: no device 10de:$did"; result=FAIL; continue; fi
    n=$((n + 1)); bdf=${d##*/}
    echo "LEVELB: ---- $bdf 10de:$did class=$(cat $d/class): expect clique $cl at $off ----"
    hexdump -C -n 256 $d/config | sed 's/^/LEVELB-HEX /'
    od -An -tx1 -v $d/config | awk -v dev=$bdf -f /capwalk.awk > /tmp/caps
    sed 's/^/LEVELB: /' /tmp/caps
    p2p=$(grep '^P2P ' /tmp/caps | head -n1)
    ncaps=$(sed -n 's/^NCAPS [^ ]* //p' /tmp/caps)
    if [ -z "$p2p" ]; then echo "LEVELB: FAIL: $bdf: no P2P capability"; result=FAIL; continue; fi
    set -- $p2p   # P2P bdf idx= off= next= last= clique= ver= raw=[..]
    idx=${3#idx=}; poff=${4#off=}; last=${6#last=}; pcl=${7#clique=}; ver=${8#ver=}
    if [ "$poff" = "$off" ] && [ "$pcl" = "$cl" ] && [ "$ver" = 0 ] && [ "$last" = yes ] && [ $((idx + 1)) = "$ncaps" ]; then
        echo "LEVELB: OK: $bdf clique $pcl at $poff, next=0, capability $((idx + 1)) of $ncaps (last)"
    else
        echo "LEVELB: FAIL: $bdf: found [$p2p] with $ncaps caps; expected clique $cl at $off, last in chain"
        result=FAIL
    fi
    lspci -vv -s $bdf 2>&1 | grep -v libkmod | sed 's/^/LEVELB-LSPCI /'
done
[ "$n" -gt 0 ] || { echo "LEVELB: FAIL: nothing expected/found"; result=FAIL; }
if grep -q 'qp_agent=1' /proc/cmdline && [ -x /bin/vfio-p2p-agent ]; then
    # the project's guest agent must report the same offsets and cliques as the busybox walk
    echo "LEVELB: vfio-p2p-agent scan --format json:"
    vfio-p2p-agent scan --format json > /tmp/agent.json 2> /tmp/agent.err; arc=$?
    sed 's/^/LEVELB-AGENT /' /tmp/agent.json /tmp/agent.err
    if [ $arc -ne 0 ] || [ ! -s /tmp/agent.json ]; then
        # an agent without `scan` (the early stub printed nothing): note it, do not fail
        echo "LEVELB: NOTE: agent rc=$arc, $(wc -c < /tmp/agent.json) bytes of output: no scan result to check"
    else
        # pretty-printed JSON -> "AGENTGPU bdf device cap_offset clique cap_linked" (busybox awk, no jq)
        awk -F'"' '
            function flush() { if (bdf != "") print "AGENTGPU", bdf, dev, off, cl, lk; bdf = ""; dev = off = cl = lk = "-" }
            BEGIN { bdf = ""; dev = off = cl = lk = "-" }
            $2 == "bdf"        { flush(); bdf = $4 }
            $2 == "device"     { dev = $4 }
            $2 == "cap_offset" { off = ($4 == "" ? "-" : $4) }
            $2 == "clique"     { v = $3; gsub(/[^0-9a-z]/, "", v); cl = v }
            $2 == "cap_linked" { v = $3; gsub(/[^a-z]/, "", v); lk = v }
            END { flush() }' /tmp/agent.json > /tmp/agent.gpus
        sed 's/^/LEVELB: /' /tmp/agent.gpus
        for e in $(echo $expect | tr ',' ' '); do
            did=${e%%:*}; rest=${e#*:}; off=${rest%%:*}; cl=${rest#*:}
            line=$(grep -i " [^ ]*$did " /tmp/agent.gpus | head -n1)
            set -- $line
            if [ -n "$line" ] && [ "$4" = "$off" ] && [ "$5" = "$cl" ] && [ "$6" = true ]; then
                echo "LEVELB: OK: agent scan: $2 (device $3) clique $5 at $4, linked"
            else
                echo "LEVELB: FAIL: agent scan: device $did: got [${line:-nothing}], expected clique $cl at $off, linked"
                result=FAIL
            fi
        done
    fi
fi
echo "LEVELB-RESULT: $result devices=$n"
sync
poweroff -f
