//! Import of the flat JSON sysfs dump (`{"BDF": {"path": "/sys/devices/...",
//! "vendor": "0x10de", "config": "<hex>", ...}}`), the form in which real hosts'
//! sysfs is shared (e.g. `h200x2-vm-sysfs.json`). Values are the attribute files'
//! text, so they go through the same parsers as the live reader.

use std::collections::BTreeMap;
use std::path::Path;

use pci_config::Bdf;

use super::attr;
use super::sysfs::{split_device_path, ReadError};
use vfio_p2p_model::record::{DeviceRecord, HostRecord, ReadWarning};

/// The most a flat dump may hold: a few KiB per device, so hosts of thousands of devices fit.
pub const MAX_FLAT_JSON_BYTES: u64 = 64 << 20;

pub fn read_file(path: &Path) -> Result<HostRecord, ReadError> {
    let snapshot = |message: String| ReadError::Snapshot {
        path: path.into(),
        message,
    };
    let bytes = vfio_p2p_files::read_input_file(path, MAX_FLAT_JSON_BYTES, "flat sysfs JSON dump")
        .map_err(|e| snapshot(e.to_string()))?;
    let text = String::from_utf8(bytes).map_err(|e| snapshot(format!("not UTF-8: {e}")))?;
    parse(&text, &path.display().to_string()).map_err(snapshot)
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
        check_types(&bdf, &attrs)?;
        let get = |k: &str| attrs.get(k).and_then(|v| v.as_str()).map(str::to_string);
        let warn = |host: &mut HostRecord, k: &str, m: &str| {
            host.warnings.push(ReadWarning {
                device: Some(bdf),
                file: Some(format!("{bdf} {k}")),
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
        let iommu_group = iommu_group(&bdf, attrs.get("iommu_group"))?;
        if let Some(o) = get("driver_override").filter(|o| o.trim().contains(['\n', '\r', '\0'])) {
            return Err(format!(
                "{bdf}: \"driver_override\" {o:?} holds a line break; sysfs shows one driver name"
            ));
        }
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
            // a name, or the link's target as sysfs has it (then the same rule as sysfs)
            driver: get("driver").and_then(|d| match d.contains('/') {
                true => attr::driver_link(Path::new(&d)).ok(),
                false => Some(d),
            }),
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

/// The attributes read here as sysfs text; other keys (a dumper's extras) are left alone.
const TEXT_ATTRIBUTES: &[&str] = &[
    "path",
    "vendor",
    "device",
    "class",
    "subsystem_vendor",
    "subsystem_device",
    "config",
    "numa_node",
    "local_cpulist",
    "driver",
    "driver_override",
    "resource",
    "current_link_speed",
    "current_link_width",
    "max_link_speed",
    "max_link_width",
    "reset_method",
];

/// Every attribute read is a string, as sysfs shows it: a number or list there is a broken
/// dump, not a missing attribute.
fn check_types(bdf: &Bdf, attrs: &BTreeMap<String, serde_json::Value>) -> Result<(), String> {
    for (k, v) in attrs
        .iter()
        .filter(|(k, _)| TEXT_ATTRIBUTES.contains(&k.as_str()))
    {
        if !(v.is_string() || v.is_null()) {
            return Err(format!(
                "{bdf}: \"{k}\" is {v}, not a string as sysfs shows it (e.g. \"0x10de\")"
            ));
        }
    }
    Ok(())
}

/// `iommu_group`: a number, or the link's text (`../../../kernel/iommu_groups/5`); a value
/// out of u32's range, negative or not a number is an error, never wrapped or dropped.
fn iommu_group(bdf: &Bdf, v: Option<&serde_json::Value>) -> Result<Option<u32>, String> {
    let bad = |v: &serde_json::Value| {
        format!("{bdf}: \"iommu_group\" {v} is not an IOMMU group number (0..=4294967295)")
    };
    match v {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(n @ serde_json::Value::Number(_)) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| bad(n)),
        Some(s @ serde_json::Value::String(text)) => text
            .rsplit('/')
            .next()
            .and_then(|t| t.parse::<u32>().ok())
            .map(Some)
            .ok_or_else(|| bad(s)),
        Some(other) => Err(bad(other)),
    }
}

#[cfg(test)]
mod range_tests {
    use super::*;

    fn dump(extra: &str) -> String {
        format!(
            r#"{{"0000:00:06.0": {{"path": "/sys/devices/pci0000:00/0000:00:06.0", "vendor": "0x10de", "device": "0x2335", "class": "0x030200"{extra}}}}}"#
        )
    }

    /// Issue 15 item 8: values were wrapped (`as u32`) or dropped to null without a word.
    #[test]
    fn out_of_range_and_mistyped_values_are_errors_naming_the_field() {
        for (extra, want) in [
            (r#", "iommu_group": 4294967301"#, "iommu_group"),
            (r#", "iommu_group": -1"#, "iommu_group"),
            (r#", "iommu_group": "five""#, "iommu_group"),
            (
                r#", "driver_override": "vfio-pci\nnvidia""#,
                "driver_override",
            ),
        ] {
            let e = parse(&dump(extra), "t.json").unwrap_err();
            assert!(
                e.contains("0000:00:06.0") && e.contains(want),
                "{extra}: {e}"
            );
        }
        let e = parse(&dump("").replace(r#""0x10de""#, "12"), "t.json").unwrap_err();
        assert!(e.contains("\"vendor\" is 12, not a string"), "{e}");
        let ok = parse(
            &dump(r#", "iommu_group": "../../../kernel/iommu_groups/5""#),
            "t",
        )
        .unwrap();
        assert_eq!(ok.devices[0].iommu_group, Some(5));
        let far = parse(&dump(r#", "numa_node": "4294967295""#), "t").unwrap();
        assert_eq!(far.devices[0].numa_node, None);
        assert!(far
            .warnings
            .iter()
            .any(|w| w.message.contains("below 1024")));
    }
}
