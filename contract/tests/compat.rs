//! The wire format, pinned in both directions of the version rule.

use pci_config::Bdf;
use vfio_p2p_contract::{
    Expectation, ExpectedGpu, ExpectedPair, PciId, Verdict, EXPECTATION_VERSION,
};

fn bdf(s: &str) -> Bdf {
    s.parse().unwrap()
}

fn sample() -> Expectation {
    let mut e = Expectation::new("vm0");
    e.gpus = vec![
        ExpectedGpu {
            host_bdf: bdf("0000:41:00.0"),
            guest_bdf: bdf("0000:06:00.0"),
            clique: Some(0),
            vendor: PciId(0x10de),
            device: PciId(0x2330),
            module_id: None,
            numa_nodes: Vec::new(),
        },
        ExpectedGpu {
            host_bdf: bdf("0000:42:00.0"),
            guest_bdf: bdf("0000:07:00.0"),
            clique: None,
            vendor: PciId(0x10de),
            device: PciId(0x2330),
            module_id: None,
            numa_nodes: Vec::new(),
        },
    ];
    e.pairs = vec![ExpectedPair {
        a: bdf("0000:06:00.0"),
        b: bdf("0000:07:00.0"),
        verdict: Verdict::NoP2p,
        path: "PIX".into(),
        nvlink: None,
        guest_path: None,
    }];
    e
}

/// The exact bytes version 1 writes; the lab and the agent README show this form.
const V1: &str = r#"{"version":1,"vm":"vm0","gpus":[{"host_bdf":"0000:41:00.0","guest_bdf":"0000:06:00.0","clique":0,"vendor":"0x10de","device":"0x2330"},{"host_bdf":"0000:42:00.0","guest_bdf":"0000:07:00.0","clique":null,"vendor":"0x10de","device":"0x2330"}],"pairs":[{"a":"0000:06:00.0","b":"0000:07:00.0","verdict":"no-p2p","path":"PIX","nvlink":null}]}"#;

#[test]
fn version_1_is_written_byte_for_byte() {
    assert_eq!(EXPECTATION_VERSION, 1);
    assert_eq!(sample().to_json(), V1);
}

#[test]
fn written_documents_read_back_equal() {
    let e = sample();
    assert_eq!(Expectation::from_json(&e.to_json()).unwrap(), e);
    let padded = format!("{}\n\0\0\0", e.to_json());
    assert_eq!(Expectation::from_json(&padded).unwrap(), e);
}

#[test]
fn an_older_document_without_optional_fields_reads() {
    let e = Expectation::from_json(r#"{"version":1,"vm":"v","gpus":[]}"#).unwrap();
    assert!(e.pairs.is_empty());
}

#[test]
fn a_newer_document_with_added_fields_reads() {
    let newer = V1
        .replacen(r#""vm":"vm0","#, r#""vm":"vm0","report_port":5000,"#, 1)
        .replacen(
            r#""clique":0,"#,
            r#""clique":0,"host_path":{"to":"0000:42:00.0","label":"NV18"},"#,
            1,
        );
    assert_ne!(newer, V1);
    assert_eq!(Expectation::from_json(&newer).unwrap(), sample());
}

#[test]
fn ids_and_addresses_are_read_in_their_usual_spellings() {
    let e = Expectation::from_json(&V1.replace("0x10de", "10DE")).unwrap();
    assert_eq!(e.gpus[0].vendor, PciId(0x10de));
    assert_eq!(
        e.pair(bdf("0000:07:00.0"), bdf("0000:06:00.0"))
            .unwrap()
            .verdict,
        Verdict::NoP2p
    );
    assert_eq!(e.gpu_at(bdf("0000:07:00.0")).unwrap().clique, None);
}

#[test]
fn junk_is_refused() {
    for bad in [
        "",
        "null",
        "[]",
        r#"{"vm":"x","gpus":[]}"#,
        r#"{"version":"1","vm":"x","gpus":[]}"#,
        &V1.replace(r#""clique":0"#, r#""clique":256"#),
        &V1.replace(r#""nvlink":null"#, r#""nvlink":-1"#),
        &V1.replace(r#""verdict":"no-p2p""#, r#""verdict":"maybe""#),
        &V1.replace("0x2330", "0x12345"),
    ] {
        assert!(Expectation::from_json(bad).is_err(), "{bad}");
    }
}

/// `guest_path` (the label the host predicts in the guest) is additive within version 1:
/// written after `nvlink`, read back equal, absent in older documents.
#[test]
fn guest_path_round_trips_and_is_optional() {
    let mut e = sample();
    e.pairs[0].guest_path = Some("PIX".into());
    let json = e.to_json();
    assert_eq!(
        json,
        V1.replace(r#""nvlink":null}"#, r#""nvlink":null,"guest_path":"PIX"}"#)
    );
    assert_eq!(Expectation::from_json(&json).unwrap(), e);
    let older = Expectation::from_json(V1).unwrap();
    assert_eq!(older.pairs[0].guest_path, None);
    assert_eq!(older.version, EXPECTATION_VERSION);
}

fn grace(numa_nodes: [Vec<u32>; 2], nodes: u32, rows: usize) -> Expectation {
    let mut e = sample();
    for (g, n) in e.gpus.iter_mut().zip(numa_nodes) {
        g.numa_nodes = n;
    }
    e.numa = Some(vfio_p2p_contract::ExpectedNuma {
        nodes,
        distances: (0..rows)
            .map(|i| {
                (0..nodes)
                    .map(|j| if i as u32 == j { 10 } else { 80 })
                    .collect()
            })
            .collect(),
    });
    e
}

#[test]
fn a_grace_expectation_round_trips_and_x86_documents_stay_v1_bytes() {
    let e = grace([vec![1, 2], vec![3, 4]], 5, 5);
    let text = e.to_json();
    assert!(text.contains(r#""numa_nodes":[1,2]"#), "{text}");
    assert_eq!(Expectation::from_json(&text).unwrap(), e);
    // no NUMA block, no GPU nodes: the v1 bytes above (checked there) carry neither key
    assert!(!V1.contains("numa"));
}

#[test]
fn inconsistent_numa_blocks_are_refused() {
    let cases = [
        (grace([vec![1], vec![1]], 3, 3), "node 1 is given to both"),
        (
            grace([vec![1], vec![5]], 3, 3),
            "names node 5; the guest has nodes 0..3",
        ),
        (
            grace([vec![1], vec![2]], 3, 2),
            "distances is not 3 rows of 3",
        ),
    ];
    for (e, want) in cases {
        let err = Expectation::from_json(&e.to_json())
            .unwrap_err()
            .to_string();
        assert!(err.contains(want), "{err} lacks {want}");
    }
    let mut orphan = grace([vec![1], vec![2]], 3, 3);
    orphan.numa = None;
    let err = Expectation::from_json(&orphan.to_json())
        .unwrap_err()
        .to_string();
    assert!(err.contains("no node table"), "{err}");
    assert!(Expectation::from_json(&grace([vec![1], vec![2]], 3, 3).to_json()).is_ok());
}
