//! Import of the flat JSON sysfs dump (`{"BDF": {"path": "/sys/devices/...",
//! "vendor": "0x10de", "config": "<hex>", ...}}`), the form in which real hosts'
//! sysfs is shared (e.g. `h200x2-vm-sysfs.json`). Values are the attribute files'
//! text, so they go through the same parsers as the live reader.

use std::collections::BTreeMap;
use std::path::Path;

use pci_config::Bdf;

use super::attr;
use super::record::{DeviceRecord, HostRecord, ReadWarning};
use super::sysfs::{split_device_path, ReadError};

pub fn read_file(path: &Path) -> Result<HostRecord, ReadError> {
    let text = std::fs::read_to_string(path).map_err(|e| ReadError::Io {
        path: path.into(),
        source: e,
    })?;
    parse(&text, &path.display().to_string()).map_err(|message| ReadError::Snapshot {
        path: path.into(),
        message,
    })
}

pub fn parse(text: &str, source: &str) -> Result<HostRecord, String> {
    let map: BTreeMap<String, BTreeMap<String, serde_json::Value>> =
        serde_json::from_str(text).map_err(|e| format!("not a flat sysfs JSON dump: {e}"))?;
    let mut host = HostRecord {
        source: source.to_string(),
        ..Default::default()
    };
    for (name, attrs) in map {
        let bdf: Bdf = name.parse().map_err(|e| format!("key {name:?}: {e}"))?;
        let get = |k: &str| attrs.get(k).and_then(|v| v.as_str()).map(str::to_string);
        let warn = |host: &mut HostRecord, k: &str, m: &str| {
            host.warnings.push(ReadWarning {
                device: Some(bdf),
                file: Some(k.to_string()),
                message: m.to_string(),
            })
        };
        let path = get("path").ok_or_else(|| format!("{bdf}: no \"path\""))?;
        let parts: Vec<String> = path
            .split('/')
            .skip_while(|p| *p != "devices")
            .skip(1)
            .map(str::to_string)
            .collect();
        let (host_bridge, ancestors) =
            split_device_path(&parts).map_err(|e| format!("{bdf}: {e}"))?;
        let required = |k: &str| get(k).ok_or_else(|| format!("{bdf}: no {k:?}"));
        let vendor =
            attr::hex_u16(&required("vendor")?).ok_or_else(|| format!("{bdf}: bad vendor"))?;
        let device =
            attr::hex_u16(&required("device")?).ok_or_else(|| format!("{bdf}: bad device"))?;
        let class =
            attr::hex_u32(&required("class")?).ok_or_else(|| format!("{bdf}: bad class"))?;
        let config = match get("config") {
            Some(h) => pci_config::parse_hex_dump(&h).map_err(|e| format!("{bdf}: config: {e}"))?,
            None => Vec::new(),
        };
        let numa_node = match get("numa_node").map(|t| attr::numa_node(&t)) {
            Some(Ok(n)) => n,
            Some(Err(m)) => {
                warn(&mut host, "numa_node", &m);
                None
            }
            None => None,
        };
        let iommu_group = attrs.get("iommu_group").and_then(|v| {
            v.as_u64()
                .map(|n| n as u32)
                .or_else(|| v.as_str().and_then(|s| s.rsplit('/').next()?.parse().ok()))
        });
        host.devices.push(DeviceRecord {
            bdf,
            host_bridge,
            ancestors,
            vendor,
            device,
            class,
            subsystem_vendor: get("subsystem_vendor").as_deref().and_then(attr::hex_u16),
            subsystem_device: get("subsystem_device").as_deref().and_then(attr::hex_u16),
            config,
            numa_node,
            local_cpulist: get("local_cpulist").as_deref().and_then(attr::cpulist),
            iommu_group,
            driver: get("driver").map(|d| d.rsplit('/').next().unwrap_or(&d).to_string()),
            driver_override: get("driver_override")
                .as_deref()
                .and_then(attr::driver_override),
            resources: get("resource")
                .as_deref()
                .and_then(attr::resources)
                .unwrap_or_default(),
            current_link_speed: get("current_link_speed")
                .as_deref()
                .and_then(attr::link_speed),
            current_link_width: get("current_link_width")
                .as_deref()
                .and_then(attr::decimal_u8)
                .filter(|w| *w != 0),
            max_link_speed: get("max_link_speed").as_deref().and_then(attr::link_speed),
            max_link_width: get("max_link_width")
                .as_deref()
                .and_then(attr::decimal_u8)
                .filter(|w| *w != 0),
            reset_method: get("reset_method").map(|t| attr::reset_method(&t)),
        });
    }
    Ok(host)
}
