/*
 * Table-driven test of the GPUDirect clique offset selection added by qemu-patches/qemu-7.2
 * (0xC8 if free, else 0xD4, else an error).  run-unit extracts the code from a patched
 * hw/vfio/pci-quirks.c into extracted.inc and compiles it against shim.h.
 */
#include "shim.h"
#include "extracted.inc"

struct cap { uint8_t pos, id; uint16_t flags; };   /* flags: bytes +2/+3 (vendor caps: +2 = length) */

struct tcase {
    const char *name;
    struct cap caps[12];            /* physical list, in chain order, terminated by pos 0 */
    int expect;                     /* chosen offset, or -1 for an error */
    const char *err_has, *warn_has; /* substrings expected in the error / warning ("" = none) */
    uint8_t raw_next_bits;          /* OR'ed into every next pointer (reserved low bits) */
    int loop;                       /* make the last capability point back to the first */
};

static const struct tcase cases[] = {
    { "virtio-gpu-pci stand-in (20-byte vendor cap at 0xc8)",
      { {0xdc, 0x11, 0}, {0xc8, 0x09, 0x14}, {0xb4, 0x09, 0x14}, {0xa4, 0x09, 0x10}, {0x94, 0x09, 0x10},
        {0x84, 0x09, 0x10}, {0x7c, 0x01, 0x03}, {0x40, 0x10, 0x02} },
      0xd4, "", "hides the end of the vendor-specific capability at 0xc8 (length 20)" },
    { "bochs-display stand-in (PCIe at 0x80 only)", { {0x80, 0x10, 0x02} }, 0xc8, "", "" },
    { "Turing/Ampere-like: PM 0x60, MSI64 0x68, PCIe v2 0x78, MSI-X 0xc8",
      { {0x60, 0x01, 0x03}, {0x68, 0x05, 0x0080}, {0x78, 0x10, 0x02}, {0xc8, 0x11, 0} }, 0xd4, "", "" },
    { "Volta-like: MSI-X elsewhere, 0xc8 free",
      { {0x60, 0x01, 0x03}, {0x68, 0x05, 0x0080}, {0x78, 0x10, 0x02}, {0xb4, 0x11, 0} }, 0xc8, "", "" },
    { "both taken: MSI-X at 0xc8, vendor cap at 0xd4",
      { {0x78, 0x10, 0x02}, {0xc8, 0x11, 0}, {0xd4, 0x09, 0x08} }, -1,
      "0xc8 is taken by capability 0x11 at 0xc8, 0xd4 by capability 0x09 at 0xd4", "" },
    { "both taken: PCIe v2 at 0xa0 runs to 0xdc",
      { {0x40, 0x01, 0x03}, {0xa0, 0x10, 0x02} }, -1,
      "0xc8 is taken by capability 0x10 at 0xa0, 0xd4 by capability 0x10 at 0xa0", "" },
    { "both taken: 64-bit MSI with masking at 0xc0 (24 bytes)",
      { {0x40, 0x10, 0x02}, {0xc0, 0x05, 0x0180} }, -1,
      "0xc8 is taken by capability 0x05 at 0xc0, 0xd4 by capability 0x05 at 0xc0", "" },
    { "32-bit MSI at 0xc0 (10 bytes) blocks only 0xc8",
      { {0x40, 0x10, 0x02}, {0xc0, 0x05, 0x0000} }, 0xd4, "", "" },
    { "capability starting inside the 0xc8 window (0xcc)",
      { {0x40, 0x10, 0x02}, {0xcc, 0x01, 0x03} }, 0xd4, "", "" },
    { "capability starting inside the 0xd4 window (0xd8), 0xc8 free",
      { {0x40, 0x10, 0x02}, {0xd8, 0x11, 0} }, 0xc8, "", "" },
    { "PCIe v1 (20 bytes) at 0xb8 ends at 0xcc: blocks 0xc8",
      { {0x40, 0x01, 0x03}, {0xb8, 0x10, 0x01} }, 0xd4, "", "" },
    { "vendor cap 0xc0 len 12 runs into 0xc8: warn, keep 0xc8",
      { {0x40, 0x10, 0x02}, {0xc0, 0x09, 0x0c} }, 0xc8, "", "vendor-specific capability at 0xc0 (length 12)" },
    { "reserved low bits in next pointers are ignored",
      { {0x40, 0x10, 0x02}, {0xc8, 0x11, 0} }, 0xd4, "", "", 0x03 },
    { "looping capability list terminates",
      { {0x40, 0x10, 0x02}, {0x80, 0x01, 0x03} }, 0xc8, "", "", 0, 1 },
    { "no capabilities at all", { {0} }, 0xc8, "", "" },
};

int main(void)
{
    int fails = 0;

    for (size_t t = 0; t < ARRAY_SIZE(cases); t++) {
        const struct tcase *c = &cases[t];
        VFIOPCIDevice vdev;
        int n = 0, got;

        memset(&vdev, 0, sizeof(vdev));
        vdev.vbasedev.name = "0000:01:00.0";
        shim_err[0] = shim_warn[0] = 0;
        while (n < 12 && c->caps[n].pos) {
            n++;
        }
        for (int i = 0; i < n; i++) {
            uint8_t *p = vdev.pdev.config + c->caps[i].pos;
            uint8_t next = i + 1 < n ? c->caps[i + 1].pos : (c->loop ? c->caps[0].pos : 0);
            p[0] = c->caps[i].id;
            p[1] = next ? (next | c->raw_next_bits) : 0;
            p[2] = c->caps[i].flags & 0xff;
            p[3] = c->caps[i].flags >> 8;
        }
        shim_phys_head = n ? (c->caps[0].pos | c->raw_next_bits) : 0;
        vdev.pdev.config[PCI_CAPABILITY_LIST] = 0;   /* vfio cleared the emulated head already */

        got = vfio_nv_gpudirect_pick_pos(&vdev, NULL);
        int ok = (c->expect < 0 ? got < 0 : got == c->expect) &&
                 (c->err_has[0] ? strstr(shim_err, c->err_has) != NULL : shim_err[0] == 0) &&
                 (c->warn_has[0] ? strstr(shim_warn, c->warn_has) != NULL : shim_warn[0] == 0);
        if (got >= 0) {
            printf("%s %-62s -> offset 0x%x\n", ok ? "ok  " : "FAIL", c->name, got);
        } else {
            printf("%s %-62s -> error\n", ok ? "ok  " : "FAIL", c->name);
        }
        if (shim_err[0]) {
            printf("       error: %s\n", shim_err);
        }
        if (shim_warn[0]) {
            printf("       warning: %s\n", shim_warn);
        }
        fails += !ok;
    }

    /* a failing read of the capability pointer is an error, not a silent 0xc8 */
    {
        VFIOPCIDevice vdev;
        memset(&vdev, 0, sizeof(vdev));
        shim_err[0] = 0;
        shim_pread_fail = 1;
        int got = vfio_nv_gpudirect_pick_pos(&vdev, NULL);
        shim_pread_fail = 0;
        int ok = got < 0 && strstr(shim_err, "cannot read the capability pointer");
        printf("%s %-62s -> %s\n", ok ? "ok  " : "FAIL", "capability pointer cannot be read", shim_err);
        fails += !ok;
    }

    printf("%s: %d failure(s)\n", fails ? "FAIL" : "PASS", fails);
    return fails ? 1 : 0;
}
