//! A QEMU command line as `qemu-wrap` receives it (from libvirt, Nova's libvirt, a script):
//! its `vfio-pci` devices, in either `-device` syntax, and the cliques already set on them
//! (`x-nv-gpudirect-clique` in the device, a `-set device.ID.x-nv-gpudirect-clique=K`, or a
//! `-global vfio-pci.x-nv-gpudirect-clique=K` that every such device without its own takes).
//! Positions are kept so the argv can be edited in place and passed on otherwise unchanged.

use std::collections::BTreeMap;

use pci_config::Bdf;
use vfio_p2p_contract::CLIQUE_PROPERTY;

use vfio_p2p_model::qemu_argv::{
    CliqueSource, DeviceSyntax, QemuArgvFacts, VfioDevice, VFIO_PCI_DRIVERS,
};

/// Reads `args` (QEMU's arguments without the program name).
pub fn read_qemu_argv(args: &[String]) -> QemuArgvFacts {
    let mut facts = QemuArgvFacts::default();
    let mut set_cliques: BTreeMap<String, String> = BTreeMap::new();
    let mut global_cliques: BTreeMap<String, String> = BTreeMap::new();
    let mut i = 0;
    while i < args.len() {
        let (opt, value, index) = match args[i].split_once('=') {
            // `--device=…` / `-device=…` are accepted by QEMU's option parser too
            Some((o, v)) if OPTIONS_WITH_VALUE.contains(&o) => (o, Some(v), i),
            _ => (args[i].as_str(), args.get(i + 1).map(String::as_str), i + 1),
        };
        let consumed = if index == i { 1 } else { 2 };
        match (opt, value) {
            ("-device" | "--device", Some(v)) => match device(v, index) {
                Ok(Some(d)) => facts.vfio.push(d),
                Ok(None) => {}
                Err(e) => facts.unreadable.push(format!("-device {v}: {e}")),
            },
            ("-set" | "--set", Some(v)) => {
                if let Some((id, k)) = set_clique(v) {
                    set_cliques.insert(id, k);
                }
            }
            ("-global" | "--global", Some(v)) => {
                if let Some((driver, k)) = global_clique(v) {
                    global_cliques.insert(driver, k);
                }
            }
            _ => {
                i += 1;
                continue;
            }
        }
        i += consumed;
    }
    for d in &mut facts.vfio {
        if d.clique.is_some() {
            continue;
        }
        if let Some(k) = d.id.as_ref().and_then(|id| set_cliques.get(id)) {
            d.clique = Some(k.clone());
            d.clique_source = Some(CliqueSource::Set);
        } else if let Some(k) = global_cliques
            .get(&d.driver)
            .or_else(|| global_cliques.get(VFIO_PCI_DRIVERS[0]))
        {
            // a global of vfio-pci applies to its subclass too, after the subclass's own
            d.clique = Some(k.clone());
            d.clique_source = Some(CliqueSource::Global);
        }
    }
    facts
}

/// Options whose value may also follow an `=` in the same argument.
const OPTIONS_WITH_VALUE: [&str; 6] = [
    "-device", "--device", "-set", "--set", "-global", "--global",
];

/// `vfio-pci.x-nv-gpudirect-clique=K` or `driver=vfio-pci,property=…,value=K` (a
/// `-global` value) → (driver, K), for the vfio-pci drivers only.
fn global_clique(v: &str) -> Option<(String, String)> {
    let (driver, property, value) = if v.contains("property=") {
        let kv = key_values(&format!("global,{v}"));
        (
            kv.get("driver")?.clone(),
            kv.get("property")?.clone(),
            kv.get("value")?.clone(),
        )
    } else {
        let (path, value) = v.split_once('=')?;
        let (driver, property) = path.rsplit_once('.')?;
        (driver.to_string(), property.to_string(), value.to_string())
    };
    (property == CLIQUE_PROPERTY && VFIO_PCI_DRIVERS.contains(&driver.as_str()))
        .then_some((driver, value))
}

/// `device.ID.x-nv-gpudirect-clique=K` (a `-set` value) → (ID, K).
pub(crate) fn set_clique(v: &str) -> Option<(String, String)> {
    let (path, value) = v.split_once('=')?;
    let id = path
        .strip_prefix("device.")?
        .strip_suffix(CLIQUE_PROPERTY)?
        .strip_suffix('.')?;
    Some((id.to_string(), value.to_string()))
}

/// The device's properties as (key, value) text; `None` when it is not `vfio-pci`.
fn device(v: &str, arg_index: usize) -> Result<Option<VfioDevice>, String> {
    let (syntax, props) = if v.trim_start().starts_with('{') {
        let map: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(v).map_err(|e| format!("not a JSON object: {e}"))?;
        let props: BTreeMap<String, String> = map
            .into_iter()
            .map(|(k, val)| {
                let text = match val {
                    serde_json::Value::String(s) => s,
                    other => other.to_string(),
                };
                (k, text)
            })
            .collect();
        (DeviceSyntax::Json, props)
    } else {
        (DeviceSyntax::KeyValue, key_values(v))
    };
    let Some(driver) = props
        .get("driver")
        .filter(|d| VFIO_PCI_DRIVERS.contains(&d.as_str()))
    else {
        return Ok(None);
    };
    // `sysfsdev=` is a path: QEMU takes a trailing slash, so does this
    let host = props
        .get("host")
        .or_else(|| props.get("sysfsdev"))
        .and_then(|h| {
            h.trim_end_matches('/')
                .rsplit('/')
                .next()?
                .parse::<Bdf>()
                .ok()
        });
    let clique = props.get(CLIQUE_PROPERTY).cloned();
    Ok(Some(VfioDevice {
        arg_index,
        syntax,
        driver: driver.clone(),
        id: props.get("id").cloned(),
        host,
        clique_source: clique.as_ref().map(|_| CliqueSource::Device),
        clique,
    }))
}

/// QemuOpts `driver,key=value,…`: the first bare word is the driver, `,,` is a comma.
fn key_values(v: &str) -> BTreeMap<String, String> {
    let mut parts = Vec::new();
    let mut cur = String::new();
    let mut chars = v.chars().peekable();
    while let Some(c) = chars.next() {
        if c == ',' {
            if chars.peek() == Some(&',') {
                chars.next();
                cur.push(',');
            } else {
                parts.push(std::mem::take(&mut cur));
            }
        } else {
            cur.push(c);
        }
    }
    parts.push(cur);
    let mut out = BTreeMap::new();
    for (i, p) in parts.into_iter().enumerate() {
        match p.split_once('=') {
            Some((k, val)) => {
                out.insert(k.to_string(), val.to_string());
            }
            None if i == 0 => {
                out.insert("driver".to_string(), p);
            }
            None => {
                out.insert(p, "on".to_string());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn both_device_syntaxes_and_set() {
        let a = argv(&[
            "-machine",
            "q35",
            "-device",
            r#"{"driver":"vfio-pci","host":"0000:05:00.0","id":"hostdev0","bus":"pci.1","addr":"0x0"}"#,
            "-device",
            "vfio-pci,host=06:00.0,id=hostdev1,romfile=/a,,b",
            "--device=vfio-pci,sysfsdev=/sys/bus/pci/devices/0000:09:00.0,x-nv-gpudirect-clique=3",
            "-device",
            r#"{"driver":"virtio-net-pci","id":"net0"}"#,
            "-set",
            "device.hostdev1.x-nv-gpudirect-clique=1",
            "-device",
            "{broken",
        ]);
        let f = read_qemu_argv(&a);
        let seen: Vec<String> = f
            .vfio
            .iter()
            .map(|d| {
                format!(
                    "{} {:?} {:?} {} {:?}",
                    d.arg_index,
                    d.syntax,
                    d.id,
                    d.host.unwrap(),
                    d.clique
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                r#"3 Json Some("hostdev0") 0000:05:00.0 None"#,
                r#"5 KeyValue Some("hostdev1") 0000:06:00.0 Some("1")"#,
                r#"6 KeyValue None 0000:09:00.0 Some("3")"#,
            ]
        );
        assert_eq!(f.unreadable.len(), 1);
        assert!(f.unreadable[0].starts_with("-device {broken: not a JSON object"));
    }

    /// Issue 28: a trailing slash on `sysfsdev=`, the `vfio-pci-nohotplug` subclass and a
    /// `-global` clique (both spellings) are read as QEMU reads them.
    #[test]
    fn sysfsdev_slash_nohotplug_and_global() {
        let f = read_qemu_argv(&argv(&[
            "-global",
            "vfio-pci.x-nv-gpudirect-clique=5",
            "-device",
            "vfio-pci,sysfsdev=/sys/bus/pci/devices/0000:05:00.0/,id=a",
            "-device",
            "vfio-pci-nohotplug,host=0000:06:00.0,id=b,x-nv-gpudirect-clique=1",
            "--global=driver=vfio-pci-nohotplug,property=x-nv-gpudirect-clique,value=7",
            "-device",
            "vfio-pci-nohotplug,host=0000:07:00.0,id=c",
            "-global",
            "e1000.x-nv-gpudirect-clique=9",
        ]));
        let seen: Vec<String> = f
            .vfio
            .iter()
            .map(|d| {
                format!(
                    "{} {:?} {:?} {:?}",
                    d.driver, d.host, d.clique, d.clique_source
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                "vfio-pci Some(0000:05:00.0) Some(\"5\") Some(Global)",
                "vfio-pci-nohotplug Some(0000:06:00.0) Some(\"1\") Some(Device)",
                "vfio-pci-nohotplug Some(0000:07:00.0) Some(\"7\") Some(Global)",
            ]
        );
    }

    #[test]
    fn no_vfio_devices() {
        let f = read_qemu_argv(&argv(&["-machine", "none", "-qmp", "stdio", "-device"]));
        assert_eq!(f, QemuArgvFacts::default());
        assert_eq!(key_values("e1000,mac=1,,2,x")["mac"], "1,2");
    }
}
