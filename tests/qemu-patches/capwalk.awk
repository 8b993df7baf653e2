# capwalk.awk - walk the standard capability list of a PCI config dump (busybox awk, no strtonum).
# Input: `od -An -tx1 -v config`.  -v dev=<bdf>
# Output:
#   DEV <bdf> ven=<vvvv> dev=<dddd> class=<cccccc>
#   CAP <bdf> idx=<n> off=0x.. id=0x.. next=0x.. [len=.. for vendor caps]
#   P2P <bdf> idx=<n> off=0x.. next=0x.. last=<yes|no> clique=<n> ver=<n> raw=[8 bytes]
#   NCAPS <bdf> <n>
function hex(s,   i, v) {
    s = tolower(s); v = 0
    for (i = 1; i <= length(s); i++) v = v * 16 + index("0123456789abcdef", substr(s, i, 1)) - 1
    return v
}
function b(o) { return (o in B) ? B[o] : 0 }
BEGIN { n = 0 }
{ for (i = 1; i <= NF; i++) B[n++] = hex($i) }
END {
    printf "DEV %s ven=%02x%02x dev=%02x%02x class=%02x%02x%02x\n", dev, b(1), b(0), b(3), b(2), b(11), b(10), b(9)
    k = 0
    if (int(b(6) / 16) % 2) {
        off = b(52)
        while (off >= 64 && off < 256 && k < 48) {
            id = b(off); nx = b(off + 1)
            line = sprintf("CAP %s idx=%d off=0x%02x id=0x%02x next=0x%02x", dev, k, off, id, nx)
            if (id == 9) line = line sprintf(" len=%d", b(off + 2))
            print line
            if (id == 9 && b(off + 2) == 8 && b(off + 3) == 80 && b(off + 4) == 50 && b(off + 5) == 80) {
                raw = ""
                for (j = 0; j < 8; j++) raw = raw sprintf("%02x", b(off + j)) (j < 7 ? " " : "")
                printf "P2P %s idx=%d off=0x%02x next=0x%02x last=%s clique=%d ver=%d raw=[%s]\n", dev, k, off, nx,
                    (nx == 0 ? "yes" : "no"), int(b(off + 6) / 8) % 16, b(off + 6) % 8, raw
            }
            k++
            off = nx - nx % 4
        }
    }
    printf "NCAPS %s %d\n", dev, k
}
