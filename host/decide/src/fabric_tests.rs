use super::*;
use crate::placement::request::PlacementOptions;
use crate::placement::shape;
use vfio_p2p_model::fabric_state::PartitionGpu;
use vfio_p2p_read::synth;

fn hgx() -> (Topology, FabricState) {
    let mut topo = Topology::from_record(&synth::example("hgx-h100").unwrap());
    crate::nvlink::apply_nvswitch_fabric(&mut topo);
    let gpus: Vec<Bdf> = topo.gpus().map(|g| g.bdf).collect();
    let state = synth::example_fabric("hgx-h100", &gpus).unwrap();
    (topo, state)
}

fn place(topo: &Topology, state: &FabricState, count: usize, gpus: usize) -> Placement {
    let host = PlacementHost::new(topo, &PlacementOptions::default()).unwrap();
    place_on_partitions(&host, state, &shape(count, gpus), &BTreeSet::new())
}

/// The partition ids each placed VM got, in request order.
fn ids(state: &FabricState, p: &Placement) -> Vec<u32> {
    p.vms
        .iter()
        .map(|vm| state.partition_of(&vm.gpus).expect("a partition").id)
        .collect()
}

#[test]
fn auto_means_shared_only_when_partitions_are_known() {
    assert_eq!(
        resolve_model(FabricMode::Auto, true),
        Some(FabricModel::SharedNvswitch)
    );
    assert_eq!(resolve_model(FabricMode::Auto, false), None);
    assert_eq!(resolve_model(FabricMode::None, true), None);
    assert_eq!(
        resolve_model(FabricMode::FullPassthrough, false),
        Some(FabricModel::FullPassthrough)
    );
}

#[test]
fn two_by_four_gets_fms_two_four_gpu_partitions() {
    let (topo, state) = hgx();
    let p = place(&topo, &state, 2, 4);
    assert!(p.unplaced.is_empty());
    let mut got = ids(&state, &p);
    got.sort_unstable();
    assert_eq!(got, [1, 2]);
    assert!(p.free.is_empty());
    // Four pairs: the four 2-GPU partitions, each the two GPUs of one PCIe switch.
    let p = place(&topo, &state, 4, 2);
    assert_eq!(ids(&state, &p), [5, 6, 3, 4]);
}

#[test]
fn an_active_unsupported_or_failed_partition_is_never_given() {
    let (topo, mut state) = hgx();
    state.partitions[1].active = true;
    let p = place(&topo, &state, 2, 4);
    assert_eq!(ids(&state, &p), [2]);
    assert!(
        p.unplaced[0].reason.contains("1: active for another VM"),
        "{:?}",
        p.unplaced
    );
    // Nor one that shares a GPU with an active partition; its GPUs are not free.
    let p = place(&topo, &state, 2, 2);
    assert!(p
        .vms
        .iter()
        .all(|vm| !state.partitions[1].bdfs().unwrap().contains(&vm.gpus[0])));
    assert_eq!(p.free.len(), 0, "{p:?}");
    assert_eq!(ids(&state, &p), [5, 6]);
    state.partitions[1].active = false;
    state.unsupported = vec![2];
    let p = place(&topo, &state, 2, 4);
    assert_eq!(ids(&state, &p), [1]);
    assert!(p.unplaced[0].reason.contains("unsupported"));
    state.unsupported.clear();
    let failed = state.partitions[2].gpus[0].bdf.unwrap();
    state.nvlink_failed_gpus = vec![failed];
    let p = place(&topo, &state, 1, 4);
    assert_eq!(ids(&state, &p), [1]);
}

#[test]
fn taken_gpus_and_sizes_fm_lacks_are_refused_with_the_reason() {
    let (topo, state) = hgx();
    let taken: BTreeSet<Bdf> = [state.partitions[2].gpus[0].bdf.unwrap()].into();
    let host = PlacementHost::new(
        &topo,
        &PlacementOptions {
            unavailable: taken.clone(),
            ..PlacementOptions::default()
        },
    )
    .unwrap();
    let p = place_on_partitions(&host, &state, &shape(2, 4), &taken);
    assert_eq!(ids(&state, &p), [1]);
    assert!(p.unplaced[0].reason.contains("taken or reserved"));
    assert_eq!(p.unplaced[0].largest_fit, 2);
    assert_eq!(
        largest_partition_shape(&host, &state, 2, 4, &taken),
        Some((2, 2))
    );
    let p = place(&topo, &state, 1, 3);
    assert!(p.unplaced[0].reason.contains("no partition of 3 GPUs"));
    assert_eq!(p.unplaced[0].largest_fit, 2);
}

#[test]
fn a_single_gpu_vm_keeps_whole_pairs_for_later() {
    let (topo, state) = hgx();
    // The first 1-GPU VM takes module 5 (0000:18:00.0, the lowest address); the second
    // module 7 (its pair with module 5 is already broken), not module 6 at the lower
    // address 0000:3a:00.0, which would break the still whole pair {6, 8}.
    let p = place(&topo, &state, 2, 1);
    assert_eq!(ids(&state, &p), [11, 13]);
    // With module 6 (0000:3a:00.0) taken, one GPU goes to module 8, whose pair {6, 8} is
    // broken already, not to module 5 at the lowest address, which would break {5, 7}.
    let taken: BTreeSet<Bdf> = [state.partitions[12].gpus[0].bdf.unwrap()].into();
    let options = PlacementOptions {
        unavailable: taken.clone(),
        ..PlacementOptions::default()
    };
    let host = PlacementHost::new(&topo, &options).unwrap();
    let p = place_on_partitions(&host, &state, &shape(1, 1), &taken);
    assert_eq!(ids(&state, &p), [14]);
}

#[test]
fn a_set_that_is_not_a_partition_is_warned_with_the_ones_that_fit() {
    let (_, mut state) = hgx();
    let p3 = state.partitions[3].bdfs().unwrap();
    let p5 = state.partitions[5].bdfs().unwrap();
    let none = BTreeSet::new();
    assert_eq!(gpu_set_warning(&state, &p3, &none), None);
    let mixed = [p3[0], p5[0]];
    let w = gpu_set_warning(&state, &mixed, &none).unwrap();
    assert!(w.contains("not one of Fabric Manager's partitions"), "{w}");
    assert!(
        w.contains("3 (modules 1, 3:") && w.contains("6 (modules 6, 8:"),
        "{w}"
    );
    // A partition taken by another VM is not offered.
    let taken: BTreeSet<Bdf> = [p5[1]].into();
    let w = gpu_set_warning(&state, &mixed, &taken).unwrap();
    assert!(!w.contains("5 (modules 5, 7:"), "{w}");
    state.partitions[3].active = true;
    let w = gpu_set_warning(&state, &p3, &none).unwrap();
    assert!(w.contains("active for another VM"), "{w}");
    // Partitions sharing a GPU with an active one are not offered either.
    state.partitions[3].active = false;
    state.partitions[1].active = true;
    let w = gpu_set_warning(&state, &mixed, &none).unwrap();
    assert!(
        !w.contains("3 (modules 1, 3:") && !w.contains("4 (modules 2, 4:"),
        "{w}"
    );
    assert!(w.contains("5 (modules 5, 7:"), "{w}");
}

#[test]
fn full_passthrough_takes_the_nvswitches_with_the_whole_board_only() {
    let (topo, state) = hgx();
    let all: Vec<Bdf> = topo.gpus().map(|g| g.bdf).collect();
    let full = Some(FabricModel::FullPassthrough);
    assert_eq!(passthrough_nvswitches(&topo, full, &all).len(), 4);
    let half = state.partitions[1].bdfs().unwrap();
    assert!(passthrough_nvswitches(&topo, full, &half).is_empty());
    assert!(passthrough_nvswitches(&topo, Some(FabricModel::SharedNvswitch), &all).is_empty());
}

// The hook's choice of a starting VM's partition (partition_for) on a 4-GPU board.

fn partition_for_vm<'a>(
    s: &'a FabricState,
    gpus: &[Bdf],
) -> Result<&'a FabricPartition, PartitionFinding> {
    partition_for(s, gpus, &BTreeSet::new())
}

fn b(s: &str) -> Bdf {
    s.parse().unwrap()
}

fn hook_partition(id: u32, gpus: &[&str]) -> FabricPartition {
    FabricPartition {
        id,
        active: false,
        gpus: gpus
            .iter()
            .enumerate()
            .map(|(i, g)| PartitionGpu {
                module_id: i as u32 + 1,
                bdf: Some(b(g)),
                nvlinks_available: 18,
                nvlinks_max: 18,
            })
            .collect(),
    }
}

fn hook_board() -> FabricState {
    FabricState {
        partitions: vec![
            hook_partition(
                0,
                &[
                    "0000:13:00.0",
                    "0000:14:00.0",
                    "0000:15:00.0",
                    "0000:21:00.0",
                ],
            ),
            hook_partition(1, &["0000:13:00.0", "0000:14:00.0"]),
            hook_partition(2, &["0000:15:00.0", "0000:21:00.0"]),
        ],
        ..FabricState::default()
    }
}

#[test]
fn the_exact_gpu_set_is_the_partition_in_any_order() {
    let s = hook_board();
    let p = partition_for_vm(&s, &[b("0000:14:00.0"), b("0000:13:00.0")]).unwrap();
    assert_eq!(p.id, 1);
    let all = [
        b("0000:21:00.0"),
        b("0000:13:00.0"),
        b("0000:15:00.0"),
        b("0000:14:00.0"),
    ];
    assert_eq!(partition_for_vm(&s, &all).unwrap().id, 0);
}

#[test]
fn a_subset_or_a_spread_set_is_no_partition_and_names_those_that_hold_it() {
    let s = hook_board();
    let e = partition_for_vm(&s, &[b("0000:13:00.0")]).unwrap_err();
    assert!(
        e.saw.contains("partitions holding them all: 0 (") && e.saw.contains("; 1 ("),
        "{e}"
    );
    let e = partition_for_vm(&s, &[b("0000:13:00.0"), b("0000:15:00.0")]).unwrap_err();
    assert!(e.saw.contains("partitions holding them all: 0 ("), "{e}");
    assert!(!e.saw.contains("; 1 ("), "{e}");
    let e = partition_for_vm(&s, &[b("0000:81:00.0")]).unwrap_err();
    assert!(e.saw.contains("no partition holds them all"), "{e}");
}

#[test]
fn unsupported_partitions_and_failed_links_are_findings() {
    let mut s = hook_board();
    s.unsupported = vec![1];
    let e = partition_for_vm(&s, &[b("0000:13:00.0"), b("0000:14:00.0")]).unwrap_err();
    assert!(
        e.saw.contains("partition 1, which FM lists as unsupported"),
        "{e}"
    );
    let mut s = hook_board();
    s.nvlink_failed_gpus = vec![b("0000:14:00.0")];
    let e = partition_for_vm(&s, &[b("0000:13:00.0"), b("0000:14:00.0")]).unwrap_err();
    assert!(e.saw.contains("failed NVLinks on 0000:14:00.0"), "{e}");
}

#[test]
fn partitions_without_addresses_cannot_be_matched() {
    let mut s = hook_board();
    for p in &mut s.partitions {
        for g in &mut p.gpus {
            g.bdf = None;
        }
    }
    let e = partition_for_vm(&s, &[b("0000:13:00.0"), b("0000:14:00.0")]).unwrap_err();
    assert!(e.saw.contains("without PCI addresses"), "{e}");
    assert!(e.fix.contains("fabric activate"), "{e}");
    assert!(e.fix.contains("fabric_manager: modules:"), "{e}");
}

#[test]
fn unplaced_reasons_name_gpus_not_on_the_host_and_an_empty_list() {
    let (topo, mut state) = hgx();
    // Partition 1's first GPU moved to an address this host does not have.
    let n = state.partitions[1].gpus.len();
    state.partitions[1].gpus[0].bdf = Some("0000:ee:00.0".parse().unwrap());
    let others: Vec<u32> = state
        .partitions
        .iter()
        .filter(|p| p.gpus.len() == n && p.id != 1)
        .map(|p| p.id)
        .collect();
    for p in &mut state.partitions {
        if others.contains(&p.id) {
            p.active = true;
        }
    }
    let p = place(&topo, &state, 1, n);
    let reason = &p.unplaced[0].reason;
    assert!(
        reason.contains("1: its GPU 0000:ee:00.0 is not a GPU of this host"),
        "{reason}"
    );
    state.partitions.clear();
    let p = place(&topo, &state, 1, 2);
    assert_eq!(
        p.unplaced[0].reason,
        "Fabric Manager lists no partitions (none is supported on this board as it is now)"
    );
}
