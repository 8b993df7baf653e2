//! The host↔guest contract end to end, without root or a VM: `vfio-p2p gen` writes the
//! expectation, the guest agent's own loader reads it and judges a guest that looks as
//! planned (and one that does not).

use std::path::Path;

use vfio_p2p_agent::expect::{self, GpuStatus};
use vfio_p2p_agent::sysfs::expectation;
use vfio_p2p_agent::sysfs::gpus::{GpuScan, Scan};
use vfio_p2p_agent::sysfs::numa::NumaScan;
use vfio_p2p_contract::{Expectation, FW_CFG_NAME, FW_CFG_SYSFS_PATH};

/// Runs the host tool as an operator would; returns its argv.
fn host_writes(example: &str, file: &Path) -> String {
    let mut cmd = crate::cli::vfio_p2p();
    cmd.args(["--example", example, "gen", "qemu", "--format", "argv"])
        .arg("--expect-out")
        .arg(file);
    crate::cli::succeeded(&mut cmd).0
}

/// The guest as the plan says it should look, as the agent's sysfs scan reports it.
fn guest_as_planned(e: &Expectation) -> Scan {
    Scan {
        sysfs_root: "/".into(),
        gpus: e
            .gpus
            .iter()
            .map(|g| GpuScan {
                bdf: g.guest_bdf,
                vendor: g.vendor.to_string(),
                device: g.device.to_string(),
                class: "0x030200".into(),
                driver: None,
                config_bytes: 4096,
                caps_readable: true,
                clique: g.clique,
                cap_offset: g.clique.map(|_| "0xd4".into()),
                cap_linked: g.clique.map(|_| true),
                problem: None,
                link_speed: None,
                link_width: None,
                max_link_speed: None,
                max_link_width: None,
                numa_node: None,
            })
            .collect(),
        note: None,
        warnings: Vec::new(),
    }
}

#[test]
fn what_the_host_writes_the_agent_reads_and_judges() {
    let dir = tempfile::tempdir().unwrap();
    for example in ["hgx-h100", "dual-socket-pcie", "flat-vm"] {
        let file = dir.path().join(format!("{example}.json"));
        let argv = host_writes(example, &file);
        assert!(
            argv.contains(&format!("name={FW_CFG_NAME},file=")),
            "{argv}"
        );
        assert!(FW_CFG_SYSFS_PATH.contains(FW_CFG_NAME));

        let (e, source) = expectation::load(Some(&file), dir.path()).unwrap();
        assert_eq!(source, file);
        assert!(!e.gpus.is_empty(), "{example}: no GPUs in the expectation");
        let n = e.gpus.len();
        assert_eq!(e.pairs.len(), n * (n - 1) / 2, "{example}");
        for p in &e.pairs {
            assert!(
                e.gpu_at(p.a).is_some() && e.gpu_at(p.b).is_some(),
                "{example}: {p:?}"
            );
        }

        let mut guest = guest_as_planned(&e);
        let report = expect::compare(&e, &source, &guest, &NumaScan::default());
        assert_eq!(report.mismatches(), 0, "{example}: {report:#?}");
        assert!(report.unexpected.is_empty());

        guest.gpus[0].clique = Some(guest.gpus[0].clique.map_or(7, |c| (c + 1) % 16));
        let report = expect::compare(&e, &source, &guest, &NumaScan::default());
        assert_eq!(report.gpus[0].status, GpuStatus::WrongClique, "{example}");
        assert_eq!(report.mismatches(), 1);
    }
}

#[test]
fn the_agent_finds_the_blob_where_fw_cfg_puts_it() {
    let dir = tempfile::tempdir().unwrap();
    let blob = dir.path().join(FW_CFG_SYSFS_PATH);
    std::fs::create_dir_all(blob.parent().unwrap()).unwrap();
    host_writes("dual-socket-pcie", &blob);
    // fw_cfg pads the blob with NULs.
    let mut bytes = std::fs::read(&blob).unwrap();
    bytes.extend([0; 7]);
    std::fs::write(&blob, bytes).unwrap();
    let (e, source) = expectation::load(None, dir.path()).unwrap();
    assert_eq!(source, blob);
    assert_eq!(e.gpus.len(), 8);
}
