use super::*;

const XML: &str = r#"<domain type='kvm' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>
  <name>vm1</name>
  <features><kvm><hidden state='on'/></kvm></features>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <controller type='pci' index='0' model='pcie-root'><pcihole64 unit='GiB'>512</pcihole64></controller>
    <hostdev mode='subsystem' type='pci' managed='no'>
      <source><address domain='0x0000' bus='0x41' slot='0x00' function='0x0'/></source>
      <alias name='ua-gpu0'/>
    </hostdev>
    <hostdev mode='subsystem' type='pci' managed='yes'>
      <source><address domain='0x0000' bus='0x42' slot='0x00' function='0x0'/></source>
      <alias name='ua-gpu1'/>
    </hostdev>
    <hostdev mode='subsystem' type='usb'><source><vendor id='0x1234'/></source></hostdev>
  </devices>
  <qemu:commandline>
    <qemu:arg value='-set'/><qemu:arg value='device.ua-gpu1.x-nv-gpudirect-clique=3'/>
  </qemu:commandline>
  <qemu:override>
    <qemu:device alias='ua-gpu0'>
      <qemu:frontend><qemu:property name='x-nv-gpudirect-clique' type='unsigned' value='2'/></qemu:frontend>
    </qemu:device>
  </qemu:override>
</domain>"#;

fn read(xml: &str) -> Result<DomainFacts, String> {
    parse_domain_xml(xml, "test.xml").map_err(|e| e.to_string())
}

/// A domain with one hostdev whose source address is `attrs`.
fn with_address(attrs: &str) -> String {
    format!(
        "<domain><devices><hostdev mode='subsystem' type='pci'><source><address {attrs}/></source></hostdev></devices></domain>"
    )
}

#[test]
fn reads_hostdevs_cliques_hole_and_hidden_state() {
    let f = read(XML).unwrap();
    assert_eq!(f.name.as_deref(), Some("vm1"));
    assert_eq!(f.emulator.as_deref(), Some("/usr/bin/qemu-system-x86_64"));
    assert_eq!(f.hostdevs.len(), 2);
    assert_eq!(f.hostdevs[0].bdf.to_string(), "0000:41:00.0");
    assert!(!f.hostdevs[0].managed);
    assert!(f.hostdevs[1].managed);
    assert_eq!(f.hostdevs[0].alias_name(), Some("ua-gpu0"));
    assert_eq!(f.cliques["ua-gpu0"][0].value, "2");
    assert_eq!(f.cliques["ua-gpu0"][0].source, CliqueSource::Override);
    assert_eq!(f.cliques["ua-gpu1"][0].value, "3");
    assert_eq!(f.cliques["ua-gpu1"][0].source, CliqueSource::Commandline);
    assert_eq!(f.hidden_hypervisor, vec![HiddenHypervisor::KvmHidden]);
    assert_eq!(f.hole64.as_ref().map(|h| h.bytes), Some(512 << 30));
    assert!(f.has_qemu_ns);
    assert!(f.positions.override_devices.contains_key("ua-gpu0"));
    assert_eq!(&XML[f.positions.domain_end_tag..], "</domain>");
}

/// The three former parsers disagreed on the address base; libvirt (strtoul base 0) reads
/// `bus='10'` as decimal 10, `0x10` as hex, `010` as octal, and a missing field as 0.
#[test]
fn addresses_are_read_as_libvirt_reads_them() {
    let bdf = |attrs: &str| read(&with_address(attrs)).map(|f| f.hostdevs[0].bdf.to_string());
    assert_eq!(
        bdf("domain='0' bus='10' slot='0' function='0'").unwrap(),
        "0000:0a:00.0"
    );
    assert_eq!(
        bdf("domain='0x0000' bus='0x10' slot='0x1f' function='0x7'").unwrap(),
        "0000:10:1f.7"
    );
    assert_eq!(bdf("bus='010' slot='02'").unwrap(), "0000:08:02.0");
    assert_eq!(bdf("bus='0x41'").unwrap(), "0000:41:00.0");
    let e = bdf("bus='0x100' slot='0'").unwrap_err();
    assert!(e.contains("bus='0x100'") && e.contains("test.xml"), "{e}");
    assert!(bdf("bus='0x41' slot='0x20'").unwrap_err().contains("slot"));
    assert!(bdf("bus='zz'").unwrap_err().contains("not a number"));
}

/// check, the hook and patch each knew a different subset of the ways to hide the hypervisor.
#[test]
fn every_way_of_hiding_the_hypervisor_is_found() {
    let cpu = read("<domain><cpu mode='host-passthrough'><feature policy='disable' name='hypervisor'/></cpu></domain>").unwrap();
    assert_eq!(
        cpu.hidden_hypervisor,
        vec![HiddenHypervisor::CpuFeatureDisabled {
            policy: "disable".into()
        }]
    );
    let forbid =
        read("<domain><cpu><feature policy='forbid' name='hypervisor'/></cpu></domain>").unwrap();
    assert_eq!(forbid.hidden_hypervisor.len(), 1);
    let required =
        read("<domain><cpu><feature policy='require' name='hypervisor'/></cpu></domain>").unwrap();
    assert!(required.hidden_hypervisor.is_empty());
    let qemu = read(&format!(
        "<domain xmlns:qemu='{QEMU_NS}'><qemu:commandline><qemu:arg value='-cpu'/><qemu:arg value='host,kvm=off'/></qemu:commandline></domain>"
    ))
    .unwrap();
    assert_eq!(
        qemu.hidden_hypervisor,
        vec![HiddenHypervisor::QemuCpuKvmOff {
            cpu: "host,kvm=off".into()
        }]
    );
    // `kvm=off` anywhere else is not a CPU option (check used to count it).
    let name = read(&format!(
        "<domain xmlns:qemu='{QEMU_NS}'><qemu:commandline><qemu:arg value='-name'/><qemu:arg value='kvm=off'/></qemu:commandline></domain>"
    ))
    .unwrap();
    assert!(name.hidden_hypervisor.is_empty());
    let off =
        read("<domain><features><kvm><hidden state='off'/></kvm></features></domain>").unwrap();
    assert!(off.hidden_hypervisor.is_empty());
}

#[test]
fn hole64_from_a_qemu_arg_and_default_unit() {
    let f = read(&format!(
        "<domain xmlns:qemu='{QEMU_NS}'><qemu:commandline><qemu:arg value='-global'/><qemu:arg value='q35-pcihost.pci-hole64-size=1024G'/></qemu:commandline></domain>"
    ))
    .unwrap();
    assert_eq!(f.hole64.map(|h| h.bytes), Some(1 << 40));
    let kib = read("<domain><devices><controller model='pcie-root'><pcihole64>1048576</pcihole64></controller></devices></domain>").unwrap();
    assert_eq!(kib.hole64.map(|h| h.bytes), Some(1 << 30));
    assert!(read("<domain><devices><controller><pcihole64 unit='parsec'>1</pcihole64></controller></devices></domain>")
        .unwrap_err()
        .contains("unit"));
}

/// The machine and arch are read once: an aarch64 `virt` domain's window is its
/// `highmem-mmio-size`, a q35 domain's its 64-bit hole.
#[test]
fn arm_virt_and_its_window_are_read_from_the_os_type() {
    let commandline = "<qemu:commandline><qemu:arg value='-machine'/><qemu:arg value='highmem-mmio-size=1T'/></qemu:commandline>";
    let virt = read(&format!(
        "<domain xmlns:qemu='{QEMU_NS}'><os><type arch='aarch64' machine='virt'>hvm</type></os>{commandline}</domain>"
    ))
    .unwrap();
    assert_eq!(virt.arch.as_deref(), Some("aarch64"));
    assert!(virt.is_arm_virt());
    assert_eq!(virt.mmio_window().map(|h| h.bytes), Some(1 << 40));
    let q35 = read("<domain><os><type arch='x86_64' machine='pc-q35-7.2'>hvm</type></os><devices><controller type='pci' index='0' model='pcie-root'><pcihole64 unit='G'>64</pcihole64></controller></devices></domain>").unwrap();
    assert!(!q35.is_arm_virt());
    assert_eq!(q35.mmio_window().map(|h| h.bytes), Some(64 << 30));
    let riscv =
        read("<domain><os><type arch='riscv64' machine='virt'>hvm</type></os></domain>").unwrap();
    assert!(!riscv.is_arm_virt());
}

#[test]
fn refuses_what_libvirt_refuses() {
    let cases = [
        ("<network/>", "<network>"),
        ("<domain", "not well-formed"),
        ("<domain><devices>", "ends inside <devices>"),
        ("<domain/><domain/>", "second root element"),
        ("<domain><name>a\0b</name></domain>", "NUL"),
        ("<!DOCTYPE d [<!ENTITY x SYSTEM 'file:///etc/passwd'>]><domain><name>&x;</name></domain>", "DOCTYPE"),
        ("<domain><name>&x;</name></domain>", "entity"),
        ("", "no <domain>"),
        (
            "<domain xmlns:qemu='urn:other'></domain>",
            "xmlns:qemu is bound to 'urn:other'",
        ),
        (
            "<domain><devices><hostdev mode='subsystem' type='pci'><alias name='ua-x'/></hostdev></devices></domain>",
            "hostdev ua-x: no <source><address/>",
        ),
    ];
    for (xml, want) in cases {
        let e = read(xml).unwrap_err();
        assert!(
            e.starts_with("test.xml: ") && e.contains(want),
            "{xml:?}: {e}"
        );
    }
    let e = parse_domain_xml_bytes(b"<domain><name>\xff</name></domain>", "<stdin>").unwrap_err();
    assert!(e.to_string().contains("not UTF-8"), "{e}");
}

/// 100,000 nested elements used to overflow the stack of the recursive parsers (abort).
#[test]
fn deep_nesting_is_an_error_not_a_crash() {
    let depth = 100_000;
    let xml = format!(
        "<domain><devices>{}{}</devices></domain>",
        "<a>".repeat(depth),
        "</a>".repeat(depth)
    );
    let e = read(&xml).unwrap_err();
    assert!(e.contains("deeper than 256"), "{e}");
    let ok = format!(
        "<domain>{}{}</domain>",
        "<a>".repeat(200),
        "</a>".repeat(200)
    );
    assert!(read(&ok).is_ok());
}

#[test]
fn character_references_in_text() {
    let f = read("<domain><name>a&amp;b&#x41;</name></domain>").unwrap();
    assert_eq!(f.name.as_deref(), Some("a&bA"));
}
