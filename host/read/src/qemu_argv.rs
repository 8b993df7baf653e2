//! The one reader of QEMU command lines: as `qemu-wrap` receives them (from libvirt, Nova's
//! libvirt, a script), `check --qemu-args`, a Proxmox `args:` line, Incus's `raw.qemu` and
//! a libvirt domain's `<qemu:commandline>`. It reads the `vfio-pci` devices, in either
//! `-device` syntax, and the cliques already set on them (`x-nv-gpudirect-clique` in the
//! device, a `-set device.ID.x-nv-gpudirect-clique=K`, or a
//! `-global vfio-pci.x-nv-gpudirect-clique=K` that every such device without its own takes),
//! a hypervisor hidden with `-cpu …,kvm=off`, and `pci-hole64-size=`. Positions are kept so
//! the argv can be edited in place and passed on otherwise unchanged.

use std::collections::BTreeMap;

use pci_config::Bdf;
use vfio_p2p_contract::CLIQUE_PROPERTY;

use vfio_p2p_model::qemu_argv::{
    CliqueSource, DeviceSyntax, QemuArgvFacts, VfioDevice, VFIO_PCI_DRIVERS,
};

/// Reads a command line written as one string (`check --qemu-args`): words split at blanks.
pub fn read_qemu_args_text(text: &str) -> QemuArgvFacts {
    let words: Vec<String> = text.split_whitespace().map(str::to_string).collect();
    read_qemu_argv(&words)
}

/// Reads `args` (QEMU's arguments without the program name).
pub fn read_qemu_argv(args: &[String]) -> QemuArgvFacts {
    let mut facts = QemuArgvFacts {
        hole64: first_size(args, "pci-hole64-size="),
        highmem_mmio: first_size(args, "highmem-mmio-size="),
        ..QemuArgvFacts::default()
    };
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
                    facts.set_cliques.push((id.clone(), k.clone()));
                    set_cliques.insert(id, k);
                }
            }
            ("-cpu" | "--cpu", Some(v)) => {
                if v.split(',').any(|o| o == "kvm=off") {
                    facts.hidden_cpu.push(v.to_string());
                }
            }
            ("-machine" | "--machine" | "-M", Some(v)) => {
                facts.machine = facts.machine.take().or_else(|| machine_type(v));
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
const OPTIONS_WITH_VALUE: [&str; 8] = [
    "-device",
    "--device",
    "-set",
    "--set",
    "-global",
    "--global",
    "-machine",
    "--machine",
];

/// The first `KEY=SIZE` (`KEY` ending in `=`) in any argument, in bytes, and its index.
fn first_size(args: &[String], key: &str) -> Option<(usize, u64)> {
    args.iter().enumerate().find_map(|(i, a)| {
        let bytes = a
            .split([' ', ','])
            .find_map(|t| parse_size(t.split_once(key)?.1))?;
        Some((i, bytes))
    })
}

/// `-machine`'s type: its first bare word (`virt,gic-version=3`) or its `type=` option;
/// none when the value only sets properties (libvirt's `-machine highmem-mmio-size=…`).
fn machine_type(value: &str) -> Option<String> {
    let mut opts = value.split(',');
    let first = opts.next()?;
    if !first.contains('=') && !first.is_empty() {
        return Some(first.to_string());
    }
    std::iter::once(first)
        .chain(opts)
        .find_map(|o| o.strip_prefix("type="))
        .map(str::to_string)
}

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

/// QEMU size syntax: a number with an optional K/M/G/T suffix (binary units).
fn parse_size(v: &str) -> Option<u64> {
    let v = v.trim();
    let (num, shift) = match v.chars().last()?.to_ascii_uppercase() {
        'K' => (&v[..v.len() - 1], 10),
        'M' => (&v[..v.len() - 1], 20),
        'G' => (&v[..v.len() - 1], 30),
        'T' => (&v[..v.len() - 1], 40),
        _ => (v, 0),
    };
    num.parse::<u64>().ok()?.checked_mul(1 << shift)
}

/// `device.ID.x-nv-gpudirect-clique=K` (a `-set` value) → (ID, K).
fn set_clique(v: &str) -> Option<(String, String)> {
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

    /// What `check --qemu-args`, Proxmox's `args:`, Incus's `raw.qemu` and a domain's
    /// `<qemu:commandline>` are read for: a hidden hypervisor, the 64-bit window, `-set`
    /// cliques of any device id.
    #[test]
    fn hidden_hypervisor_hole64_and_set_cliques() {
        let f = read_qemu_args_text(
            "-machine q35 -cpu host,kvm=off -m 4G -set device.hostpci0.x-nv-gpudirect-clique=2 \
             -global q35-pcihost.pci-hole64-size=2048G",
        );
        assert_eq!(
            f.hidden_hypervisor().collect::<Vec<_>>(),
            ["QEMU argument -cpu host,kvm=off"]
        );
        assert_eq!(f.hole64, Some((9, 2048 << 30)));
        assert_eq!(f.set_cliques, [("hostpci0".to_string(), "2".to_string())]);
        assert!(f.vfio.is_empty());
        let none = read_qemu_args_text("-name kvm=off -m 4G -cpu host");
        assert!(none.hidden_cpu.is_empty() && none.hole64.is_none());
        assert_eq!(
            read_qemu_argv(&argv(&["-machine", "q35,pci-hole64-size=64G"])).hole64,
            Some((1, 64 << 30))
        );
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
    fn machine_type_and_arm_virt_window() {
        let f = read_qemu_args_text("-M virt,gic-version=3 -machine highmem-mmio-size=1T");
        assert_eq!(f.machine.as_deref(), Some("virt"));
        assert_eq!(f.highmem_mmio, Some((3, 1 << 40)));
        assert_eq!(f.hole64, None);
        let f = read_qemu_args_text("-machine=type=q35,accel=kvm");
        assert_eq!(f.machine.as_deref(), Some("q35"));
        assert_eq!(read_qemu_args_text("-machine accel=kvm").machine, None);
    }

    #[test]
    fn no_vfio_devices() {
        let f = read_qemu_argv(&argv(&["-machine", "none", "-qmp", "stdio", "-device"]));
        let machine = Some("none".to_string());
        assert_eq!(
            f,
            QemuArgvFacts {
                machine,
                ..QemuArgvFacts::default()
            }
        );
        assert_eq!(key_values("e1000,mac=1,,2,x")["mac"], "1,2");
    }
}
