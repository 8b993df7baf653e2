use std::path::Path;

use super::*;

fn config(yaml: &str) -> VmConfig {
    VmConfig::parse(yaml, Path::new("vm.yaml")).unwrap()
}

fn refused(yaml: &str, vmm: BootVmm) -> (Option<u64>, String) {
    let r = refusal(&config(yaml), vmm).unwrap_err();
    (r.at.map(|a| a.line()), r.why.to_string())
}

#[test]
fn cloud_hypervisor_boots_a_kernel_or_its_own_uefi_build() {
    let kernel = "name: a\nkernel: /boot/vmlinuz\ncmdline: console=ttyS0\n";
    assert_eq!(refusal(&config(kernel), BootVmm::CloudHypervisor), Ok(()));
    let ch_uefi = "name: a\nfirmware: uefi\novmf_code: /usr/share/cloud-hypervisor/CLOUDHV.fd\n";
    assert_eq!(refusal(&config(ch_uefi), BootVmm::CloudHypervisor), Ok(()));
    // firmware: uefi with gen's default ovmf_code, QEMU's OVMF: refused at firmware's line
    let (line, why) = refused("name: a\nfirmware: uefi\n", BootVmm::CloudHypervisor);
    assert_eq!(line, Some(2));
    assert!(why.contains("CLOUDHV.fd"), "{why}");
    // a vars store CH would ignore: refused at its line
    let vars = format!("{ch_uefi}ovmf_vars: /usr/share/OVMF/OVMF_VARS_4M.fd\n");
    let (line, why) = refused(&vars, BootVmm::CloudHypervisor);
    assert_eq!(line, Some(4));
    assert!(why.contains("no separate UEFI variable store"), "{why}");
    // neither: refused, naming the keys to add (no line: they are not there)
    let (line, why) = refused("name: a\n", BootVmm::CloudHypervisor);
    assert_eq!(line, None);
    assert!(
        why.starts_with("a: Cloud Hypervisor boots nothing"),
        "{why}"
    );
    assert!(
        why.contains("kernel:") && why.contains("CLOUDHV.fd"),
        "{why}"
    );
    // firmware: bios, which CH does not have: refused at that line
    let (line, _) = refused("name: a\nfirmware: bios\n", BootVmm::CloudHypervisor);
    assert_eq!(line, Some(2));
    // the other VMMs boot the disk through their own firmware
    assert_eq!(refusal(&config("name: a\n"), BootVmm::Qemu), Ok(()));
}

#[test]
fn qemu_writes_a_copy_of_the_vars_template_never_the_template() {
    let (line, why) = refused(
        "name: a\nfirmware: uefi\novmf_vars: /usr/share/OVMF/OVMF_VARS_4M.fd\n",
        BootVmm::Qemu,
    );
    assert_eq!(line, Some(3));
    assert!(why.contains("ovmf_vars_copy"), "{why}");
    let (line, why) = refused("name: a\nfirmware: uefi\n", BootVmm::Qemu);
    assert_eq!(line, Some(2));
    assert!(why.contains("ovmf_vars:"), "{why}");
    let copied = "name: a\nfirmware: uefi\novmf_vars: /usr/share/OVMF/OVMF_VARS_4M.fd\n\
                  ovmf_vars_copy: /var/lib/vfio-p2p/a_VARS.fd\n";
    assert_eq!(refusal(&config(copied), BootVmm::Qemu), Ok(()));
    // libvirt copies the template itself (<nvram template=…>)
    let template = "name: a\nfirmware: uefi\novmf_vars: /usr/share/OVMF/OVMF_VARS_4M.fd\n";
    assert_eq!(refusal(&config(template), BootVmm::Libvirt), Ok(()));
}

#[test]
fn keys_a_vmm_cannot_honour_are_refused_at_their_line() {
    let (line, why) = refused("name: a\nkernel: /boot/vmlinuz\n", BootVmm::Libvirt);
    assert_eq!(line, Some(2));
    assert!(why.contains("libvirt"), "{why}");
    let service = "name: a\nconsole: none\nqmp_socket: /run/a.qmp\ndaemonize: true\n";
    assert_eq!(refusal(&config(service), BootVmm::Qemu), Ok(()));
    let (line, why) = refused(service, BootVmm::Other("Proxmox VE"));
    assert_eq!(line, Some(3));
    assert!(why.contains("Proxmox VE starts QEMU itself"), "{why}");
}

#[test]
fn the_keys_meaning_is_checked_when_read() {
    let bad = |yaml: &str| {
        VmConfig::parse(yaml, Path::new("vm.yaml"))
            .unwrap_err()
            .to_string()
    };
    let e = bad("name: a\ncmdline: quiet\n");
    assert!(
        e.contains("vm.yaml:2:10") && e.contains("goes with kernel:"),
        "{e}"
    );
    let e = bad("name: a\nfirmware: uefi\nkernel: /boot/vmlinuz\n");
    assert!(e.contains("keep one of them"), "{e}");
    let e = bad("name: a\nfirmware: uefi\novmf_vars: /t.fd\novmf_vars_copy: /t.fd\n");
    assert!(e.contains("is the template itself"), "{e}");
    let e = bad("name: a\nqmp_socket: /run/a.qmp\ndaemonize: true\n");
    assert!(e.contains("cannot use stdio with -daemonize"), "{e}");
    let e = bad("name: a\nconsole: none\ndaemonize: true\n");
    assert!(e.contains("needs qmp_socket"), "{e}");
    let e = bad("name: a\nkernel: vmlinuz\n");
    assert!(e.contains("absolute"), "{e}");
}
