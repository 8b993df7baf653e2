//! `gen cloud-hypervisor` against a Cloud Hypervisor built from its source
//! (tests/fixtures/cloud-hypervisor, recorded by its `record` script): CH parsed and
//! validated today's arguments, created the VM on KVM and stopped only at the VFIO device
//! (no GPU on the recording machine).

use crate::recording;

fn fixture(name: &str) -> String {
    recording::fixture("cloud-hypervisor", name)
}

fn block(cmd: &str) -> String {
    recording::block("cloud-hypervisor", cmd)
}

#[test]
fn todays_argv_is_the_one_cloud_hypervisor_took() {
    let out = crate::cli::vfio_p2p()
        .args(["--example", "dual-socket-pcie", "gen", "cloud-hypervisor"])
        .args(["--gpus", "05:00.0,06:00.0,09:00.0", "--format", "argv"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let argv = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        argv,
        fixture("argv.txt"),
        "gen cloud-hypervisor changed since CH took it: record again"
    );
    assert_eq!(argv.matches("x_nv_gpudirect_clique=0").count(), 3);
    assert!(fixture("transcript.txt").starts_with("# cloud-hypervisor v"));
    // past the parser and the validation, the VM created: it stops at the absent VFIO device
    let run = block("cloud-hypervisor <argv.txt> --kernel EMPTY --serial off --console off \n");
    assert!(
        run.contains("Cannot create a VFIO device") && !run.contains("Error parsing config"),
        "{run}"
    );
}

#[test]
fn cloud_hypervisor_knows_the_option_and_ties_it_to_p2p_dma() {
    // a misspelt option is refused by the parser: the real one was parsed as the clique
    let misspelt = block("cloud-hypervisor <argv.txt, x_nv_gpudirect_clique spelt");
    assert!(
        misspelt.contains("Unknown option: x_nv_gpudirect_cliqe"),
        "{misspelt}"
    );
    let off = block("cloud-hypervisor <argv.txt> --kernel EMPTY --serial off --console off --platform vfio_p2p_dma=off");
    assert!(
        off.contains("Device with x_nv_gpudirect_clique requires vfio_p2p_dma=on"),
        "{off}"
    );
    // CH does not range-check the clique (a u8 shifted into the capability): 16 gets as far
    // as 0, so the 0..=15 bound is ours to keep (pci_config::clique::MAX_CLIQUE)
    let sixteen = block("cloud-hypervisor <argv.txt, gpu0's clique 16>");
    assert!(sixteen.contains("Cannot create a VFIO device"), "{sixteen}");
    assert_eq!(pci_config::clique::MAX_CLIQUE, 15);
}
