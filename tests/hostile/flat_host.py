#!/usr/bin/env python3
"""Writes a flat sysfs JSON dump of N H100s on root buses, 32 per bus (255 buses per domain),
no bridges above them (issue 15, reproducer 3): `flat_host.py N > host.json`.
Optional overrides for one GPU (the first): `flat_host.py 1 iommu_group=4294967301`."""
import json
import sys

n = int(sys.argv[1])
overrides = dict(a.split("=", 1) for a in sys.argv[2:])
config = bytearray(256)
config[0:4] = bytes([0xDE, 0x10, 0x30, 0x23])  # vendor 10de, device 2330
config[0x0A:0x0C] = bytes([0x02, 0x03])  # class 0302 (3D controller)
host = {}
for i in range(n):
    # 32 per bus, 255 buses per PCI domain (10,000 GPUs take two domains)
    domain, slot = divmod(i, 32 * 255)
    bdf = f"{domain:04x}:{1 + slot // 32:02x}:{slot % 32:02x}.0"
    dev = {
        "path": f"/sys/devices/pci{domain:04x}:00/{bdf}",
        "vendor": "0x10de",
        "device": "0x2330",
        "class": "0x030200",
        "numa_node": "0",
        "iommu_group": str(i),
        "resource": "0x0000000000000000 0x0000000000000000 0x0000000000000000\n",
        "config": config.hex(),
    }
    if i == 0:
        for k, v in overrides.items():
            try:
                dev[k] = json.loads(v)
            except ValueError:
                dev[k] = v
    host[bdf] = dev
json.dump(host, sys.stdout, indent=1)
