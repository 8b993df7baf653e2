//! A QEMU command line with the planned cliques added to the `vfio-pci` devices that have
//! none, and nothing else changed: the property goes into the device's own argument (last
//! key of its JSON object, or `,x-nv-gpudirect-clique=K` after its key=value list).

use std::collections::BTreeMap;

use pci_config::Bdf;

use crate::model::qemu_argv::{DeviceSyntax, QemuArgvFacts};
use vfio_p2p_contract::CLIQUE_PROPERTY;

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
    args: &[String],
    facts: &QemuArgvFacts,
    cliques: &BTreeMap<Bdf, u8>,
) -> (Vec<String>, Vec<CliqueAdded>) {
    let mut out = args.to_vec();
    let mut added = Vec::new();
    for d in &facts.vfio {
        let (None, Some(host)) = (&d.clique, d.host) else {
            continue;
        };
        let Some(&k) = cliques.get(&host) else {
            continue;
        };
        let arg = &mut out[d.arg_index];
        match d.syntax {
            DeviceSyntax::Json => {
                // the reader parsed it as an object, so it ends with `}`
                let end = arg.trim_end().len() - 1;
                arg.insert_str(end, &format!(",\"{CLIQUE_PROPERTY}\":{k}"));
            }
            DeviceSyntax::KeyValue => arg.push_str(&format!(",{CLIQUE_PROPERTY}={k}")),
        }
        added.push(CliqueAdded {
            arg_index: d.arg_index,
            host,
            id: d.id.clone(),
            clique: k,
        });
    }
    (out, added)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read::qemu_argv::read_qemu_argv;

    #[test]
    fn adds_only_where_missing() {
        let args: Vec<String> = [
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
        .map(String::from)
        .to_vec();
        let facts = read_qemu_argv(&args);
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
        serde_json::from_str::<serde_json::Value>(&out[1]).unwrap();
        assert_eq!(
            out[3],
            "vfio-pci,host=06:00.0,id=hostdev1,x-nv-gpudirect-clique=0"
        );
        assert_eq!(out[5], args[5], "set through -set: left alone");
        assert_eq!(out[9], args[9], "no planned clique: left alone");
        assert_eq!(added.len(), 2);
        assert_eq!(out.len(), args.len());
    }
}
