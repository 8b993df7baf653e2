//! A QEMU command line with the planned cliques added to the `vfio-pci` devices that have
//! none, and nothing else changed: the property goes into the device's own argument (last
//! key of its JSON object, or `,x-nv-gpudirect-clique=K` after its key=value list). The
//! arguments are edited as bytes: what is not UTF-8 reaches QEMU exactly as it was.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use pci_config::Bdf;

use vfio_p2p_contract::CLIQUE_PROPERTY;
use vfio_p2p_model::qemu_argv::{DeviceSyntax, QemuArgvFacts};

/// One clique added: which device, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CliqueAdded {
    pub arg_index: usize,
    pub host: Bdf,
    /// The device's `id`, if it has one.
    pub id: Option<String>,
    pub clique: u8,
}

/// `args` with `cliques` (GPU → planned clique) added where a device lacks one.
pub fn with_cliques(
    args: &[OsString],
    facts: &QemuArgvFacts,
    cliques: &BTreeMap<Bdf, u8>,
) -> (Vec<OsString>, Vec<CliqueAdded>) {
    let mut out = args.to_vec();
    let mut added = Vec::new();
    for d in &facts.vfio {
        let (None, Some(host)) = (&d.clique, d.host) else {
            continue;
        };
        let Some(&k) = cliques.get(&host) else {
            continue;
        };
        let Some(arg) = out.get_mut(d.arg_index) else {
            continue;
        };
        let mut bytes = std::mem::take(arg).into_vec();
        add_property(&mut bytes, d.syntax, k);
        *arg = OsString::from_vec(bytes);
        added.push(CliqueAdded {
            arg_index: d.arg_index,
            host,
            id: d.id.clone(),
            clique: k,
        });
    }
    (out, added)
}

/// Adds the clique property to one `-device` value (`arg` is what the reader parsed,
/// byte for byte; a `--device=` argument keeps its option in front).
fn add_property(arg: &mut Vec<u8>, syntax: DeviceSyntax, k: u8) {
    match syntax {
        DeviceSyntax::Json => {
            // the reader parsed it as an object, so its last non-blank byte is `}`
            let end = arg
                .iter()
                .rposition(|b| !b.is_ascii_whitespace())
                .unwrap_or(0);
            let property = format!(",\"{CLIQUE_PROPERTY}\":{k}");
            arg.splice(end..end, property.bytes());
        }
        DeviceSyntax::KeyValue => {
            // `,,` is QemuOpts' literal comma: after an odd run of trailing commas the
            // last one already separates, and another would make `,,`.
            let trailing = arg.iter().rev().take_while(|b| **b == b',').count();
            if trailing % 2 == 0 {
                arg.push(b',');
            }
            arg.extend_from_slice(format!("{CLIQUE_PROPERTY}={k}").as_bytes());
        }
    }
}

/// The arguments as text for the reader: bytes that are not UTF-8 become U+FFFD there, but
/// [`with_cliques`] edits the original bytes.
pub fn argv_text(args: &[OsString]) -> Vec<String> {
    args.iter()
        .map(|a| String::from_utf8_lossy(a.as_bytes()).into_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use vfio_p2p_read::qemu_argv::read_qemu_argv;

    #[test]
    fn adds_only_where_missing() {
        let args: Vec<OsString> = [
            "-device",
            r#"{"driver":"vfio-pci","host":"0000:05:00.0","id":"hostdev0"} "#,
            "-device",
            "vfio-pci,host=06:00.0,id=hostdev1",
            "-device",
            "vfio-pci,host=09:00.0,id=hostdev2",
            "-set",
            "device.hostdev2.x-nv-gpudirect-clique=7",
            "-device",
            "vfio-pci,host=85:00.0",
        ]
        .map(OsString::from)
        .to_vec();
        let facts = read_qemu_argv(&argv_text(&args));
        let bdf = |s: &str| s.parse::<Bdf>().unwrap();
        let cliques = BTreeMap::from([
            (bdf("05:00.0"), 0),
            (bdf("06:00.0"), 0),
            (bdf("09:00.0"), 0),
        ]);
        let (out, added) = with_cliques(&args, &facts, &cliques);
        assert_eq!(
            out[1],
            r#"{"driver":"vfio-pci","host":"0000:05:00.0","id":"hostdev0","x-nv-gpudirect-clique":0} "#
        );
        serde_json::from_str::<serde_json::Value>(out[1].to_str().unwrap()).unwrap();
        assert_eq!(
            out[3],
            "vfio-pci,host=06:00.0,id=hostdev1,x-nv-gpudirect-clique=0"
        );
        assert_eq!(out[5], args[5], "set through -set: left alone");
        assert_eq!(out[9], args[9], "no planned clique: left alone");
        assert_eq!(added.len(), 2);
        assert_eq!(out.len(), args.len());
    }

    /// Issue 28: a trailing separator comma is not doubled into QEMU's escaped `,,`, an
    /// escaped comma at the end stays one, and bytes that are not UTF-8 pass unchanged.
    #[test]
    fn trailing_commas_and_raw_bytes() {
        let raw = |b: &[u8]| OsString::from_vec(b.to_vec());
        let args = vec![
            raw(b"-device"),
            raw(b"vfio-pci,host=05:00.0,id=a,"),
            raw(b"-device"),
            raw(b"vfio-pci,host=06:00.0,romfile=/a,,"),
            raw(b"-device"),
            raw(b"vfio-pci,host=07:00.0,romfile=/r\xff\xfe.rom,,,"),
            raw(b"-device"),
            raw(b"{\"driver\":\"vfio-pci\",\"host\":\"08:00.0\",\"romfile\":\"/\xff\"}\n"),
        ];
        let facts = read_qemu_argv(&argv_text(&args));
        let bdf = |s: &str| s.parse::<Bdf>().unwrap();
        let cliques: BTreeMap<Bdf, u8> = ["05:00.0", "06:00.0", "07:00.0", "08:00.0"]
            .iter()
            .map(|b| (bdf(b), 2))
            .collect();
        let (out, added) = with_cliques(&args, &facts, &cliques);
        assert_eq!(added.len(), 4);
        assert_eq!(
            out[1],
            raw(b"vfio-pci,host=05:00.0,id=a,x-nv-gpudirect-clique=2")
        );
        assert_eq!(
            out[3],
            raw(b"vfio-pci,host=06:00.0,romfile=/a,,,x-nv-gpudirect-clique=2")
        );
        assert_eq!(
            out[5],
            raw(b"vfio-pci,host=07:00.0,romfile=/r\xff\xfe.rom,,,x-nv-gpudirect-clique=2")
        );
        assert_eq!(
            out[7],
            raw(b"{\"driver\":\"vfio-pci\",\"host\":\"08:00.0\",\"romfile\":\"/\xff\",\"x-nv-gpudirect-clique\":2}\n")
        );
    }
}
