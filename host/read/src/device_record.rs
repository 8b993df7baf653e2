//! The one device-record builder: the rules that turn one PCI function's attributes into
//! a [`DeviceRecord`], whatever holds them — sysfs files below a root
//! ([`super::sysfs`]) or a flat JSON dump's strings ([`super::flat_json`]). The IDs and
//! the link come from config space where it is readable and agrees with the kernel, the
//! files otherwise; the `class` file decides over config (quirks rewrite it).

use pci_config::{Bdf, ConfigSpace, HeaderType};

use super::attr;
use vfio_p2p_model::record::{DeviceRecord, HostBridgeId};

/// Where one function's attributes come from. A source says itself what went wrong
/// (warnings naming its file or key, or, for a dump, an error).
pub(super) trait AttrSource {
    /// Config space as readable (empty when it is not).
    fn config(&mut self) -> Vec<u8>;
    /// The driver bound (the `driver` link's last component).
    fn driver(&mut self) -> Option<String>;
    fn warn(&mut self, name: &str, message: String);
    /// Text attribute `name` parsed; `None` when absent (many attributes are optional,
    /// and not worth a warning); otherwise a warning says what went wrong.
    fn parsed<T>(
        &mut self,
        name: &str,
        parse: impl FnOnce(&str) -> Result<Option<T>, String>,
    ) -> Option<T>;

    /// An attribute whose unparseable content is warned about; `fallback` (if not
    /// empty) says what is used instead.
    fn optional<T>(
        &mut self,
        name: &str,
        parse: impl Fn(&str) -> Option<T>,
        fallback: &str,
    ) -> Option<T> {
        let lenient = matches!(name, "current_link_speed" | "max_link_speed");
        self.parsed(name, |t| match parse(t) {
            Some(v) => Ok(Some(v)),
            None if lenient || t.trim().is_empty() => Ok(None),
            None if fallback.is_empty() => Err(format!("unexpected content {:?}", t.trim())),
            None => Err(format!("unexpected content {:?}; {fallback}", t.trim())),
        })
    }

    /// A required attribute: without it the device is skipped (with a warning).
    fn required<T>(&mut self, name: &str, parse: impl Fn(&str) -> Option<T>) -> Option<T> {
        let mut seen = false;
        let v = self.parsed(name, |t| {
            seen = true;
            match parse(t) {
                Some(v) => Ok(Some(v)),
                None => Err(format!("unexpected content {:?}; device skipped", t.trim())),
            }
        });
        if !seen {
            self.warn(name, "missing; device skipped".into());
        }
        v
    }
}

/// Host bridge and ancestor bridges from the path components under `sys/devices`:
/// the last `pciDDDD:BB` component is the host bridge, every BDF after it a bridge.
pub(super) fn split_device_path(parts: &[String]) -> Result<(HostBridgeId, Vec<Bdf>), String> {
    let hb_pos = parts
        .iter()
        .rposition(|p| p.starts_with("pci"))
        .ok_or_else(|| format!("no host bridge (pciDDDD:BB) in {}", parts.join("/")))?;
    let hb: HostBridgeId = parts[hb_pos].parse()?;
    let chain = parts[hb_pos + 1..]
        .iter()
        .map(|p| p.parse::<Bdf>().map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    let (_, ancestors) = chain.split_last().ok_or("empty device path")?;
    Ok((hb, ancestors.to_vec()))
}

/// Where the function sits, as its source found it.
pub(super) struct Placement {
    pub bdf: Bdf,
    pub host_bridge: HostBridgeId,
    pub ancestors: Vec<Bdf>,
    pub iommu_group: Option<u32>,
}

/// The function's record from `src`, or `None` (the source said why) when a required
/// attribute is missing.
pub(super) fn build_record(place: Placement, r: &mut impl AttrSource) -> Option<DeviceRecord> {
    let config = r.config();
    let header = ConfigHeader::decode(&config);
    let (vendor, device, class) = match &header {
        Some(h) => {
            // The kernel's `class` can differ from config: quirks rewrite it
            // (drivers/pci/quirks.c, e.g. quirk_tw686x_class, quirk_amd_nl_class)
            // and the model classifies devices by it, so the file still decides.
            let class = r
                .optional("class", attr::hex_u32, "using the class code from config")
                .unwrap_or(h.class);
            (h.vendor, h.device, class)
        }
        None => (
            r.required("vendor", attr::hex_u16)?,
            r.required("device", attr::hex_u16)?,
            r.required("class", attr::hex_u32)?,
        ),
    };
    let (subsystem_vendor, subsystem_device) = match header.and_then(|h| h.subsystem) {
        Some((v, d)) => (Some(v), Some(d)),
        None => (
            r.optional("subsystem_vendor", attr::hex_u16, ""),
            r.optional("subsystem_device", attr::hex_u16, ""),
        ),
    };
    let numa_node = r.parsed("numa_node", attr::numa_node);
    let local_cpulist = r.optional("local_cpulist", attr::cpulist, "");
    let driver = r.driver();
    // `(null)` (no override) parses to None and is not worth a warning.
    let driver_override = r.parsed("driver_override", |t| Ok(attr::driver_override(t)));
    let resources = r
        .optional("resource", attr::resources, "")
        .unwrap_or_default();
    let link = match LinkSource::decode(&config) {
        LinkSource::Config(link) => link,
        LinkSource::NoPcieCapability => Link::default(),
        LinkSource::Files => Link {
            current_speed: r.optional("current_link_speed", attr::link_speed, ""),
            current_width: r
                .optional("current_link_width", attr::decimal_u8, "")
                .filter(|w| *w != 0),
            max_speed: r.optional("max_link_speed", attr::link_speed, ""),
            max_width: r
                .optional("max_link_width", attr::decimal_u8, "")
                .filter(|w| *w != 0),
        },
    };
    let reset_method = r.parsed("reset_method", |t| Ok(Some(attr::reset_method(t))));
    Some(DeviceRecord {
        bdf: place.bdf,
        host_bridge: place.host_bridge,
        ancestors: place.ancestors,
        vendor,
        device,
        class,
        subsystem_vendor,
        subsystem_device,
        config,
        numa_node,
        local_cpulist,
        iommu_group: place.iommu_group,
        driver,
        driver_override,
        resources,
        current_link_speed: link.current_speed,
        current_link_width: link.current_width,
        max_link_speed: link.max_speed,
        max_link_width: link.max_width,
        reset_method,
    })
}

/// The IDs in the first 64 bytes of config space, which anyone may read: the
/// same values as the `vendor`, `device` and `subsystem_*` files, without opening them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ConfigHeader {
    vendor: u16,
    device: u16,
    /// Only a fallback: the `class` file is read (quirks may rewrite the class).
    class: u32,
    /// Type-0 headers: offset 0x2c. Bridges: the SSVID capability when the full config
    /// is readable, else `None` (then the files are read).
    subsystem: Option<(u16, u16)>,
}

impl ConfigHeader {
    /// `None` where the files must be read instead: config shorter than 64 bytes,
    /// or IDs of 0xffff (an SR-IOV virtual function reads 0xffff there and the kernel
    /// takes its IDs from the physical function; a device gone reads all ones).
    fn decode(bytes: &[u8]) -> Option<ConfigHeader> {
        if bytes.len() < pci_config::CONFIG_SPACE_UNPRIVILEGED {
            return None;
        }
        let config = ConfigSpace::new(bytes);
        let vendor = config.vendor_id().ok()?;
        let device = config.device_id().ok()?;
        if vendor == 0xffff || device == 0xffff {
            return None;
        }
        let subsystem = match config.header_type().ok()? {
            HeaderType::Endpoint => Some((config.u16_at(0x2c)?, config.u16_at(0x2e)?)),
            HeaderType::Bridge => bridge_subsystem(&config),
            _ => None,
        };
        Some(ConfigHeader {
            vendor,
            device,
            class: config.class_code().ok()?,
            subsystem,
        })
    }
}

/// A type-1 header's subsystem IDs, as the kernel sets them (drivers/pci/probe.c
/// `pci_setup_device`): from the SSVID capability, 0 without one. Known only when
/// the whole capability list was readable and walked cleanly.
fn bridge_subsystem(config: &ConfigSpace) -> Option<(u16, u16)> {
    let (caps, error) = full_capability_list(config)?;
    match caps.iter().find(|c| c.id == CAP_ID_SSVID) {
        Some(c) => {
            let at = usize::from(c.offset);
            Some((config.u16_at(at + 4)?, config.u16_at(at + 6)?))
        }
        None if error.is_none() => Some((0, 0)),
        None => None,
    }
}

/// Bridge subsystem vendor ID capability (`PCI_CAP_ID_SSVID` in linux/pci_regs.h).
const CAP_ID_SSVID: u8 = 0x0d;

/// The standard capability list, when config space holds all of it (256 bytes or more).
fn full_capability_list(
    config: &ConfigSpace,
) -> Option<(Vec<pci_config::Capability>, Option<pci_config::WalkError>)> {
    (config.len() >= pci_config::CONFIG_SPACE_LEGACY)
        .then(|| config.capabilities().collect_checked())
}

/// The four link attributes of a PCIe function.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Link {
    current_speed: Option<String>,
    current_width: Option<u8>,
    max_speed: Option<String>,
    max_width: Option<u8>,
}

/// Where a device's link facts come from.
#[derive(Debug, PartialEq, Eq)]
enum LinkSource {
    /// Decoded from the PCIe capability, as the kernel's attributes compute them.
    Config(Link),
    /// The full capability list has no PCIe capability: the kernel shows no link
    /// files for such a device (`pcie_dev_attrs_are_visible`).
    NoPcieCapability,
    /// Config space too short or damaged, or kernels disagree: read the files.
    Files,
}

impl LinkSource {
    fn decode(bytes: &[u8]) -> LinkSource {
        let config = ConfigSpace::new(bytes);
        let Some((caps, error)) = full_capability_list(&config) else {
            return LinkSource::Files;
        };
        let Some(pcie) = caps.iter().find(|c| c.id == pci_config::CAP_ID_PCIE) else {
            return match error {
                None => LinkSource::NoPcieCapability,
                Some(_) => LinkSource::Files,
            };
        };
        match Self::registers(&config, usize::from(pcie.offset)) {
            Some(link) => LinkSource::Config(link),
            None => LinkSource::Files,
        }
    }

    /// drivers/pci/pci-sysfs.c: `current_link_*` from Link Status, `max_link_width`
    /// from Link Capabilities, `max_link_speed` from `pcie_get_speed_cap`, which takes
    /// the top Supported Link Speeds bit of Link Capabilities 2 when that register is
    /// set (newer kernels also cap it at the Link Capabilities speed). Where the two
    /// registers disagree the answer depends on the kernel, so `None`: read the file.
    fn registers(config: &ConfigSpace, base: usize) -> Option<Link> {
        let version = config.u16_at(base + 0x02)? & 0xf;
        let link_cap = config.u32_at(base + 0x0c)?;
        let link_status = config.u16_at(base + 0x12)?;
        let link_cap2 = if version >= 2 {
            config.u32_at(base + 0x2c)?
        } else {
            0
        };
        let max_code = (link_cap & 0xf) as u8;
        if link_cap2 != 0 {
            let vector = (link_cap2 >> 1) & 0x7f;
            if 32 - vector.leading_zeros() != u32::from(max_code) {
                return None;
            }
        }
        let width = |v: u32| Some(((v >> 4) & 0x3f) as u8).filter(|w| *w != 0);
        Some(Link {
            current_speed: attr::link_speed_text((link_status & 0xf) as u8),
            current_width: width(u32::from(link_status)),
            max_speed: attr::link_speed_text(max_code),
            max_width: width(link_cap),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 256 bytes with a capability list: PCIe (version `version`) at 0x40, then `next`.
    fn config_with_pcie(version: u8, next: u8) -> Vec<u8> {
        let mut c = vec![0u8; pci_config::CONFIG_SPACE_LEGACY];
        c[0..4].copy_from_slice(&[0xde, 0x10, 0x30, 0x23]);
        c[0x06] = 0x10;
        c[0x34] = 0x40;
        c[0x40] = pci_config::CAP_ID_PCIE;
        c[0x41] = next;
        c[0x42] = version;
        // Link Capabilities: 16 GT/s x16.
        c[0x4c..0x50].copy_from_slice(&(0x04u32 | (16 << 4)).to_le_bytes());
        c[0x52] = 0x03 | (8 << 4); // Link Status: 8 GT/s x8
        c[0x6c] = 0x1f << 1; // Link Capabilities 2: up to 32 GT/s
        c
    }

    #[test]
    fn link_from_config_follows_the_kernel() {
        // Version 1: the kernel ignores Link Capabilities 2.
        let LinkSource::Config(link) = LinkSource::decode(&config_with_pcie(1, 0)) else {
            panic!("expected link facts from config");
        };
        assert_eq!(link.current_speed.as_deref(), Some("8.0 GT/s PCIe"));
        assert_eq!(link.current_width, Some(8));
        assert_eq!(link.max_speed.as_deref(), Some("16.0 GT/s PCIe"));
        assert_eq!(link.max_width, Some(16));
        // Version 2 with a disagreeing Link Capabilities 2: the file decides.
        assert_eq!(
            LinkSource::decode(&config_with_pcie(2, 0)),
            LinkSource::Files
        );
        // The 64-byte view has no capability list to decode.
        let short = &config_with_pcie(1, 0)[..pci_config::CONFIG_SPACE_UNPRIVILEGED];
        assert_eq!(LinkSource::decode(short), LinkSource::Files);
    }

    #[test]
    fn damaged_capability_list_reads_the_files() {
        let mut c = config_with_pcie(1, 0);
        c[0x34] = 0x50;
        c[0x50] = pci_config::CAP_ID_MSI;
        c[0x51] = 0x50; // loops before reaching the PCIe capability
        assert_eq!(LinkSource::decode(&c), LinkSource::Files);
        c[0x51] = 0;
        assert_eq!(LinkSource::decode(&c), LinkSource::NoPcieCapability);
    }

    #[test]
    fn header_ids_and_bridge_subsystem() {
        let mut c = config_with_pcie(1, 0);
        c[0x2c..0x30].copy_from_slice(&[0xde, 0x10, 0xc1, 0x16]);
        let h = ConfigHeader::decode(&c).unwrap();
        assert_eq!(
            (h.vendor, h.device, h.subsystem),
            (0x10de, 0x2330, Some((0x10de, 0x16c1)))
        );
        c[0x0e] = 1; // a bridge: no SSVID capability means 0
        assert_eq!(ConfigHeader::decode(&c).unwrap().subsystem, Some((0, 0)));
        c[0x41] = 0x60;
        c[0x60] = CAP_ID_SSVID;
        c[0x64..0x68].copy_from_slice(&[0x86, 0x80, 0x34, 0x12]);
        assert_eq!(
            ConfigHeader::decode(&c).unwrap().subsystem,
            Some((0x8086, 0x1234))
        );
        let short = &c[..pci_config::CONFIG_SPACE_UNPRIVILEGED];
        assert_eq!(ConfigHeader::decode(short).unwrap().subsystem, None);
        c[0..2].fill(0xff);
        assert_eq!(ConfigHeader::decode(&c), None);
        assert_eq!(ConfigHeader::decode(&c[..63]), None);
    }

    /// The sysfs tree of a host and a flat JSON dump of that same tree's files give the
    /// same records: one builder, whatever holds the attributes. A class file that
    /// differs from config (a kernel quirk) decides in both.
    #[test]
    fn a_sysfs_tree_and_a_flat_dump_of_it_build_the_same_records() {
        use std::fs;
        let mut host = crate::synth::example("lab").unwrap();
        let gpu = host
            .devices
            .iter_mut()
            .find(|d| d.class >> 16 == 0x03)
            .unwrap();
        let quirk = gpu.class ^ 0x100;
        let quirked = gpu.bdf;
        gpu.class = quirk;
        let dir = tempfile::tempdir().unwrap();
        crate::snapshot::write_sysfs_tree(&host, dir.path()).unwrap();
        let from_tree = crate::sysfs::read_host(dir.path()).unwrap();
        let mut dump = serde_json::Map::new();
        for d in &from_tree.devices {
            let link = dir.path().join(format!("sys/bus/pci/devices/{}", d.bdf));
            let target = fs::read_link(&link).unwrap().display().to_string();
            let rel = &target[target.find("devices/").unwrap()..];
            let dev = dir.path().join("sys").join(rel);
            let mut attrs = serde_json::Map::new();
            attrs.insert("path".into(), format!("/sys/{rel}").into());
            for entry in fs::read_dir(&dev).unwrap().flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let value = match name.as_str() {
                    "config" => {
                        let bytes = fs::read(entry.path()).unwrap();
                        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
                    }
                    "driver" | "iommu_group" => {
                        fs::read_link(entry.path()).unwrap().display().to_string()
                    }
                    _ if entry.path().is_file() => fs::read_to_string(entry.path()).unwrap(),
                    _ => continue,
                };
                attrs.insert(name, value.into());
            }
            dump.insert(d.bdf.to_string(), attrs.into());
        }
        let text = serde_json::Value::Object(dump).to_string();
        let from_dump = crate::flat_json::parse(&text, "dump").unwrap();
        assert_eq!(from_dump.devices, from_tree.devices);
        let class = |h: &vfio_p2p_model::HostRecord| {
            h.devices.iter().find(|d| d.bdf == quirked).map(|d| d.class)
        };
        assert_eq!(class(&from_tree), Some(quirk));
        assert_eq!(class(&from_dump), Some(quirk));
    }
}
