/*
 * Minimal stand-ins for the QEMU types and helpers used by the offset-selection code that
 * qemu-patches/qemu-7.2 adds to hw/vfio/pci-quirks.c, so that code can be compiled and
 * exercised on its own (see offset-test.c, run-unit).  Not QEMU code.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

#define PCI_CAP_LIST_ID         0
#define PCI_CAP_LIST_NEXT       1
#define PCI_CAP_FLAGS           2
#define PCI_CAPABILITY_LIST     0x34
#define PCI_STD_HEADER_SIZEOF   64
#define PCI_CONFIG_SPACE_SIZE   0x100
#define PCI_CAP_ID_PM           0x01
#define PCI_CAP_ID_MSI          0x05
#define PCI_CAP_ID_VNDR         0x09
#define PCI_CAP_ID_EXP          0x10
#define PCI_CAP_ID_MSIX         0x11
#define PCI_MSI_FLAGS_64BIT     0x0080
#define PCI_MSI_FLAGS_MASKBIT   0x0100
#define PCI_CAP_MSIX_SIZEOF     12
#define PCI_PM_SIZEOF           8
#define PCI_EXP_FLAGS_VERS      0x000f
#define PCI_EXP_VER1_SIZEOF     0x14
#define PCI_EXP_VER2_SIZEOF     0x3c
#define ARRAY_SIZE(x) (sizeof(x) / sizeof((x)[0]))

typedef struct Error Error;
typedef struct { uint8_t config[PCI_CONFIG_SPACE_SIZE]; } PCIDevice;
typedef struct { int fd; const char *name; } VFIODevice;
typedef struct { PCIDevice pdev; VFIODevice vbasedev; off_t config_offset; } VFIOPCIDevice;

static inline uint16_t pci_get_word(const uint8_t *p) { return p[0] | (p[1] << 8); }

static char shim_err[512], shim_warn[512];
static uint8_t shim_phys_head;      /* the device's real capability pointer (0x34) */
static int shim_pread_fail;

#define error_setg(errp, ...)           snprintf(shim_err, sizeof(shim_err), __VA_ARGS__)
#define error_setg_errno(errp, e, ...)  snprintf(shim_err, sizeof(shim_err), __VA_ARGS__)
#define warn_report(...)                snprintf(shim_warn, sizeof(shim_warn), __VA_ARGS__)

static ssize_t shim_pread(int fd, void *buf, size_t n, off_t off)
{
    (void)fd;
    if (shim_pread_fail || n != 1 || off != PCI_CAPABILITY_LIST) {
        errno = EIO;
        return -1;
    }
    *(uint8_t *)buf = shim_phys_head;
    return 1;
}
#define pread shim_pread
