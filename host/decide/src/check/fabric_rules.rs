//! Preflight of an NVSwitch board under Fabric Manager (FM): FM installed and in the
//! mode the host config's `fabric:` needs, the NVSwitches on the driver that model
//! needs, and the VM's GPUs a partition FM will activate for it (shared NVSwitch).

use std::collections::BTreeSet;

use pci_config::Bdf;

use super::report::{CheckResult, Status};
use crate::fabric::{describe, gpu_set_warning, takes_whole_baseboard};
use vfio_p2p_model::fabric::{Fabric, FabricModel};
use vfio_p2p_model::fabric_state::FmConfigFile;
use vfio_p2p_model::Topology;

/// FM's `FABRIC_MODE` for the shared NVSwitch model.
const FABRIC_MODE_SHARED: u8 = 1;

fn result(check: &'static str, status: Status, saw: String, fix: Option<String>) -> CheckResult {
    CheckResult {
        check,
        subject: None,
        status,
        saw,
        fix,
    }
}

/// Every fabric check for a VM of `gpus`; none when the board has no fabric model.
pub fn fabric_checks(
    topo: &Topology,
    gpus: &[Bdf],
    fabric: &Fabric,
    fm_config: &FmConfigFile,
    taken: &BTreeSet<Bdf>,
) -> Vec<CheckResult> {
    match fabric.model {
        Some(FabricModel::SharedNvswitch) => {
            let mut out = vec![check_fm_shared(fabric, fm_config)];
            out.extend(check_nvswitch_drivers(
                topo,
                FabricModel::SharedNvswitch,
                gpus,
            ));
            out.push(check_partition(fabric, gpus, taken));
            out
        }
        Some(FabricModel::FullPassthrough) => {
            check_nvswitch_drivers(topo, FabricModel::FullPassthrough, gpus)
        }
        None => Vec::new(),
    }
}

fn version(fabric: &Fabric) -> String {
    fabric
        .state
        .as_ref()
        .and_then(|s| s.fm_version.clone())
        .map_or("FM version unknown".into(), |v| format!("FM version {v}"))
}

/// Shared NVSwitch: FM installed here in FABRIC_MODE=1, or running in a service VM.
fn check_fm_shared(fabric: &Fabric, fm_config: &FmConfigFile) -> CheckResult {
    const CHECK: &str = "fabric-manager";
    let v = version(fabric);
    match fm_config {
        FmConfigFile::NotProbed(why) => result(
            CHECK,
            Status::Skip,
            format!("FM's config not probed ({why}); partitions from {}; {v}", fabric.source),
            Some("run check on the host itself to see FM's FABRIC_MODE".into()),
        ),
        FmConfigFile::Absent => result(
            CHECK,
            Status::Warn,
            format!("no fabricmanager.cfg on this host; partitions from {}; {v}", fabric.source),
            Some("FM must run here or in a service VM holding the NVSwitches, in FABRIC_MODE=1, at the guest driver's version (nvidia-fabricmanager-<version>)".into()),
        ),
        FmConfigFile::Invalid { path, message } => result(
            CHECK,
            Status::Fail,
            format!("{path}: {message}"),
            Some(format!("write FABRIC_MODE=1 as the last FABRIC_MODE line of {path} and restart nvidia-fabricmanager")),
        ),
        FmConfigFile::Present { path, fabric_mode } if *fabric_mode == Some(FABRIC_MODE_SHARED) => {
            result(CHECK, Status::Pass, format!("{path}: FABRIC_MODE=1 (shared NVSwitch); {v}"), None)
        }
        FmConfigFile::Present { path, fabric_mode } => result(
            CHECK,
            Status::Fail,
            format!(
                "{path}: FABRIC_MODE={} ({}): FM manages no partitions",
                fabric_mode.unwrap_or(0),
                if fabric_mode.unwrap_or(0) == 2 { "vGPU" } else { "bare metal" }
            ),
            Some(format!(
                "set FABRIC_MODE=1 in {path} and restart nvidia-fabricmanager (or use fabric: full-passthrough)"
            )),
        ),
    }
}

/// Shared: every NVSwitch stays with FM (host driver, or vfio-pci for FM's service VM).
/// Full passthrough of the whole baseboard: every NVSwitch on vfio-pci, none left on the
/// host driver, for FM in the guest.
fn check_nvswitch_drivers(topo: &Topology, model: FabricModel, gpus: &[Bdf]) -> Vec<CheckResult> {
    const CHECK: &str = "nvswitch-driver";
    let whole = takes_whole_baseboard(topo, gpus);
    topo.nvswitches()
        .filter(|_| model == FabricModel::SharedNvswitch || whole)
        .map(|d| {
            let driver = d.driver.as_deref().unwrap_or("no driver");
            let (status, fix) = match (model, driver) {
                (FabricModel::SharedNvswitch, "no driver") => (
                    Status::Fail,
                    Some("load the NVIDIA driver (the NVSwitch stays with Fabric Manager in shared mode), or pass it to FM's service VM on vfio-pci".to_string()),
                ),
                (FabricModel::SharedNvswitch, _) => (Status::Pass, None),
                (FabricModel::FullPassthrough, "vfio-pci") => (Status::Pass, None),
                (FabricModel::FullPassthrough, _) => (
                    Status::Fail,
                    Some(format!(
                        "a VM with the whole baseboard takes its NVSwitches too and runs FM inside: bind {} to vfio-pci (`echo vfio-pci > /sys/bus/pci/devices/{}/driver_override`, then unbind and drivers_probe)",
                        d.bdf, d.bdf
                    )),
                ),
            };
            CheckResult {
                check: CHECK,
                subject: Some(d.bdf.to_string()),
                status,
                saw: format!("NVSwitch on {driver} ({})", model.name()),
                fix,
            }
        })
        .collect()
}

/// Shared: the VM's GPUs are one of FM's partitions, not active for another VM.
fn check_partition(fabric: &Fabric, gpus: &[Bdf], taken: &BTreeSet<Bdf>) -> CheckResult {
    const CHECK: &str = "fm-partition";
    let Some(state) = &fabric.state else {
        return result(
            CHECK,
            Status::Warn,
            format!(
                "Fabric Manager's partitions are unknown ({})",
                fabric.source
            ),
            Some("start Fabric Manager where host.yaml's fabric_manager.address points (`systemctl start nvidia-fabricmanager`), or name a saved `fmpm -l` in fabric_manager.partitions".into()),
        );
    };
    // Another VM's active partition sharing a GPU with this one.
    let mine = state.partition_of(gpus).map(|p| p.id);
    if let Some(p) = state
        .partitions
        .iter()
        .filter(|p| p.active && Some(p.id) != mine)
        .find(|p| {
            p.gpus
                .iter()
                .any(|g| g.bdf.is_some_and(|b| gpus.contains(&b)))
        })
    {
        return result(
            CHECK,
            Status::Fail,
            format!(
                "partition {} is active and holds GPUs of this VM",
                describe(p)
            ),
            Some(
                "stop the VM that holds it (its partition is deactivated then) or choose free GPUs"
                    .into(),
            ),
        );
    }
    if let Some(w) = gpu_set_warning(state, gpus, taken) {
        return result(
            CHECK,
            Status::Warn,
            w,
            Some(
                "give the VM the GPUs of one usable partition (`vfio-p2p place` chooses them)"
                    .into(),
            ),
        );
    }
    let p = state
        .partition_of(gpus)
        .expect("a partition: gpu_set_warning said so");
    result(
        CHECK,
        Status::Pass,
        format!("GPUs are partition {}", describe(p)),
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use vfio_p2p_read::synth;

    fn hgx(model: FabricModel) -> (Topology, Fabric) {
        let topo = Topology::from_record(&synth::example("hgx-h100").unwrap());
        let gpus: Vec<Bdf> = topo.gpus().map(|g| g.bdf).collect();
        let fabric = Fabric {
            model: Some(model),
            state: synth::example_fabric("hgx-h100", &gpus),
            source: "test".into(),
            unreachable: None,
        };
        (topo, fabric)
    }

    fn status(out: &[CheckResult], check: &str) -> Vec<Status> {
        out.iter()
            .filter(|c| c.check == check)
            .map(|c| c.status)
            .collect()
    }

    #[test]
    fn shared_needs_fabric_mode_1_and_a_partition() {
        let (topo, mut fabric) = hgx(FabricModel::SharedNvswitch);
        let p1 = fabric.state.as_ref().unwrap().partitions[1].bdfs().unwrap();
        let cfg = |m| FmConfigFile::Present {
            path: "fm.cfg".into(),
            fabric_mode: m,
        };
        let none = BTreeSet::new();
        let out = fabric_checks(&topo, &p1, &fabric, &cfg(Some(1)), &none);
        assert_eq!(status(&out, "fabric-manager"), [Status::Pass]);
        assert_eq!(status(&out, "fm-partition"), [Status::Pass]);
        assert_eq!(status(&out, "nvswitch-driver"), [Status::Pass; 4]);
        let out = fabric_checks(&topo, &p1, &fabric, &cfg(Some(0)), &none);
        assert_eq!(status(&out, "fabric-manager"), [Status::Fail]);
        let invalid = FmConfigFile::Invalid {
            path: "fm.cfg".into(),
            message: "line 2: FABRIC_MODE=x is no mode".into(),
        };
        let out = fabric_checks(&topo, &p1, &fabric, &invalid, &none);
        assert_eq!(status(&out, "fabric-manager"), [Status::Fail]);
        let out = fabric_checks(&topo, &p1[..3], &fabric, &cfg(Some(1)), &none);
        assert_eq!(status(&out, "fm-partition"), [Status::Warn]);
        // Partition 3 (modules 1, 3) active for another VM: inside partition 1's GPUs.
        fabric.state.as_mut().unwrap().partitions[3].active = true;
        let out = fabric_checks(&topo, &p1, &fabric, &cfg(Some(1)), &none);
        assert_eq!(status(&out, "fm-partition"), [Status::Fail]);
    }

    #[test]
    fn full_passthrough_refuses_nvswitches_left_on_the_host_driver() {
        let (topo, fabric) = hgx(FabricModel::FullPassthrough);
        let all: Vec<Bdf> = topo.gpus().map(|g| g.bdf).collect();
        let cfg = FmConfigFile::Absent;
        let out = fabric_checks(&topo, &all, &fabric, &cfg, &BTreeSet::new());
        // The example's NVSwitches are on nvidia-nvswitch.
        assert_eq!(status(&out, "nvswitch-driver"), [Status::Fail; 4]);
        // Half the board takes no NVSwitch: nothing to check.
        let out = fabric_checks(&topo, &all[..4], &fabric, &cfg, &BTreeSet::new());
        assert!(out.is_empty());
    }
}
