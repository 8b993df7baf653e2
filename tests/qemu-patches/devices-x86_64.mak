# The devices of tests/qemu-patches/run's patched build (configure --without-default-devices
# --with-devices-x86_64=vfio-p2p-lab; copied into the source tree's configs/devices/x86_64-softmmu/).
# Only what init-a.sh starts with it: a q35 machine (its serial port, fw_cfg for -kernel, the
# chipset all come with Q35) and, behind pcie-root-port, vfio-pci. Everything else QEMU builds by
# default (the other boards, virtio, NICs, display, audio, USB, storage controllers) is left out.
CONFIG_Q35=y
CONFIG_PCIE_PORT=y
CONFIG_VFIO_PCI=y
