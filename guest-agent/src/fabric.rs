//! The NVSwitch fabric as the guest sees it (NVML's fabric registration and each GPU's
//! module id), judged against the Fabric Manager partition the host planned
//! (`Expectation.fabric`, `ExpectedGpu.module_id`).
//!
//! Read once ([`read`]), judged without the outside world ([`judge`]), so a recorded
//! view can be judged again against another expectation.

use pci_config::Bdf;
use serde::{Deserialize, Serialize};

use vfio_p2p_contract::Expectation;
use vfio_p2p_contract::ExpectedFabric;
use vfio_p2p_nvml::Nvml;

/// `NVML_GPU_FABRIC_STATE_COMPLETED`.
pub const STATE_COMPLETED: u8 = 3;

/// One GPU's fabric as NVML reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuFabric {
    pub bdf: Bdf,
    /// `nvmlDeviceGetModuleId`; `None` with `module_error`.
    pub module_id: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module_error: Option<String>,
    /// `nvmlDeviceGetGpuFabricInfo`: state 0 not supported, 1 not started, 2 in
    /// progress, 3 completed; `None` with `fabric_error`.
    pub state: Option<u8>,
    /// The registration's `nvmlReturn_t` (0: success), meaningful once completed.
    pub status: Option<i32>,
    pub clique_id: Option<u32>,
    pub cluster_uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric_error: Option<String>,
}

/// The fabric of every GPU, and the driver's version (which FM's must equal).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricView {
    pub driver_version: Option<String>,
    pub gpus: Vec<GpuFabric>,
}

/// Reads the fabric of each GPU at `bdfs` through NVML.
pub fn read(nvml: &Nvml, bdfs: &[Bdf]) -> FabricView {
    let gpus = bdfs
        .iter()
        .map(|&bdf| {
            let module = nvml.module_id(bdf);
            let info = nvml.fabric_info(bdf);
            GpuFabric {
                bdf,
                module_id: module.as_ref().ok().copied(),
                module_error: module.err(),
                state: info.as_ref().ok().map(|i| i.state),
                status: info.as_ref().ok().map(|i| i.status),
                clique_id: info.as_ref().ok().map(|i| i.clique_id),
                cluster_uuid: info.as_ref().ok().map(|i| i.cluster_uuid.clone()),
                fabric_error: info.err(),
            }
        })
        .collect();
    FabricView {
        driver_version: nvml.driver_version(),
        gpus,
    }
}

/// The words for an `NVML_GPU_FABRIC_STATE_*`.
pub fn state_name(state: u8) -> String {
    match state {
        0 => "not supported".into(),
        1 => "not started".into(),
        2 => "in progress".into(),
        STATE_COMPLETED => "completed".into(),
        other => format!("unknown state {other}"),
    }
}

/// One GPU's fabric against the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuFabricCheck {
    #[serde(flatten)]
    pub found: GpuFabric,
    pub expected_module_id: Option<u32>,
    /// Nothing wrong with this GPU's fabric, as far as the plan says anything.
    pub ok: bool,
}

/// The guest's fabric against the host's plan (or, without one, as seen).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricReport {
    /// The plan: FM partition, model, FM version (absent: none was given).
    pub planned: Option<ExpectedFabric>,
    pub driver_version: Option<String>,
    pub gpus: Vec<GpuFabricCheck>,
    /// What differs from the plan, one sentence each (empty: as planned).
    pub problems: Vec<String>,
}

impl FabricReport {
    pub fn mismatches(&self) -> usize {
        self.problems.len()
    }

    /// The view this report was judged on (to judge it again).
    pub fn view(&self) -> FabricView {
        FabricView {
            driver_version: self.driver_version.clone(),
            gpus: self.gpus.iter().map(|g| g.found.clone()).collect(),
        }
    }
}

/// Whether the expectation says anything the fabric check judges.
pub fn planned(e: &Expectation) -> bool {
    e.fabric.is_some() || e.gpus.iter().any(|g| g.module_id.is_some())
}

/// Judges `view` against the expectation: with a planned fabric every GPU's registration
/// must be completed with success and the driver must be FM's version; every planned
/// module id must be the GPU's. Without an expectation, the view as seen.
pub fn judge(view: &FabricView, e: Option<&Expectation>) -> FabricReport {
    let mut problems = Vec::new();
    let planned_fabric = e.and_then(|e| e.fabric.clone());
    let expected_module = |bdf: Bdf| {
        e.and_then(|e| e.gpus.iter().find(|g| g.guest_bdf == bdf))
            .and_then(|g| g.module_id)
    };
    if let Some(fm) = planned_fabric
        .as_ref()
        .and_then(|f| f.fm_version.as_deref())
    {
        match &view.driver_version {
            Some(d) if d == fm => {}
            Some(d) => problems.push(format!(
                "the guest driver is {d} but Fabric Manager on the host is {fm}: FM and the \
                 guest driver must be the same version (install driver {fm} in the guest, or \
                 FM {d} on the host)"
            )),
            None => problems.push(format!(
                "NVML does not give the driver's version: cannot compare it with Fabric \
                 Manager's {fm}"
            )),
        }
    }
    let mut gpus = Vec::with_capacity(view.gpus.len());
    for g in &view.gpus {
        let before = problems.len();
        let want = expected_module(g.bdf);
        if let Some(want) = want {
            match (g.module_id, &g.module_error) {
                (Some(found), _) if found == want => {}
                (Some(found), _) => problems.push(format!(
                    "{}: module id {found}, the host planned module {want}: this GPU is not the \
                     one of the partition (another GPU was passed through at this address)",
                    g.bdf
                )),
                (None, err) => problems.push(format!(
                    "{}: module id unreadable ({}); the host planned module {want}",
                    g.bdf,
                    err.as_deref().unwrap_or("no answer")
                )),
            }
        }
        if let Some(f) = &planned_fabric {
            if let Some(p) = registration_problem(g, f) {
                problems.push(p);
            }
        }
        gpus.push(GpuFabricCheck {
            found: g.clone(),
            expected_module_id: want,
            ok: problems.len() == before,
        });
    }
    if let Some(e) = e {
        for x in e.gpus.iter().filter(|x| x.module_id.is_some()) {
            if !view.gpus.iter().any(|g| g.bdf == x.guest_bdf) {
                problems.push(format!(
                    "{}: the host planned module {} there, but NVML sees no GPU at that address",
                    x.guest_bdf,
                    x.module_id.unwrap_or_default()
                ));
            }
        }
    }
    FabricReport {
        planned: planned_fabric,
        driver_version: view.driver_version.clone(),
        gpus,
        problems,
    }
}

/// What is wrong with `g`'s registration on the planned fabric `f`, if anything.
fn registration_problem(g: &GpuFabric, f: &ExpectedFabric) -> Option<String> {
    let partition = f
        .partition_id
        .map_or_else(String::new, |p| format!(" (FM partition {p})"));
    match (g.state, g.status) {
        (Some(STATE_COMPLETED), Some(0)) => None,
        (Some(STATE_COMPLETED), Some(status)) => Some(format!(
            "{}: fabric registration completed with NVML error {status}{partition}: NVLink \
             P2P will not work; see the host's Fabric Manager log",
            g.bdf
        )),
        (Some(state), _) => Some(format!(
            "{}: fabric state {} (must be completed){partition}: the partition is not \
             activated for this VM, or FM has not finished; activate it before the VM starts",
            g.bdf,
            state_name(state)
        )),
        (None, _) => Some(format!(
            "{}: fabric state unreadable ({}){partition}",
            g.bdf,
            g.fabric_error.as_deref().unwrap_or("no answer")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vfio_p2p_contract::{ExpectedGpu, PciId};

    fn gpu(bdf: &str, module: u32, state: u8, status: i32) -> GpuFabric {
        GpuFabric {
            bdf: bdf.parse().unwrap(),
            module_id: Some(module),
            module_error: None,
            state: Some(state),
            status: Some(status),
            clique_id: Some(0),
            cluster_uuid: Some("0".repeat(32)),
            fabric_error: None,
        }
    }

    fn expectation(modules: &[(&str, u32)], fm: Option<&str>) -> Expectation {
        let mut e = Expectation::from_json(r#"{"version":1,"vm":"v","gpus":[]}"#).unwrap();
        e.gpus = modules
            .iter()
            .map(|&(b, m)| ExpectedGpu {
                host_bdf: b.parse().unwrap(),
                guest_bdf: b.parse().unwrap(),
                clique: None,
                vendor: PciId(0x10de),
                device: PciId(0x2330),
                module_id: Some(m),
                numa_nodes: Vec::new(),
            })
            .collect();
        e.fabric = Some(ExpectedFabric {
            model: "shared-nvswitch".into(),
            partition_id: Some(3),
            fm_version: fm.map(str::to_string),
        });
        e
    }

    #[test]
    fn every_rule_turns_the_check_red() {
        let view = FabricView {
            driver_version: Some("580.159.04".into()),
            gpus: vec![gpu("0000:00:06.0", 1, 3, 0), gpu("0000:00:07.0", 3, 3, 0)],
        };
        let good = expectation(
            &[("0000:00:06.0", 1), ("0000:00:07.0", 3)],
            Some("580.159.04"),
        );
        assert_eq!(judge(&view, Some(&good)).problems, Vec::<String>::new());
        // a wrong module id
        let swapped = expectation(&[("0000:00:06.0", 3), ("0000:00:07.0", 1)], None);
        let r = judge(&view, Some(&swapped));
        assert_eq!(r.mismatches(), 2, "{:?}", r.problems);
        assert!(r.problems[0].contains("module id 1, the host planned module 3"));
        assert!(!r.gpus[0].ok && !r.gpus[1].ok);
        // FM's version against the driver's
        let fm = expectation(&[("0000:00:06.0", 1), ("0000:00:07.0", 3)], Some("570.1"));
        let r = judge(&view, Some(&fm));
        assert_eq!(r.mismatches(), 1);
        assert!(r.problems[0].contains("580.159.04 but Fabric Manager on the host is 570.1"));
        // not completed, completed with an error
        for (state, status, says) in [
            (2, 0, "in progress"),
            (1, 0, "not started"),
            (3, 19, "error 19"),
        ] {
            let mut v = view.clone();
            v.gpus[1] = gpu("0000:00:07.0", 3, state, status);
            let r = judge(&v, Some(&good));
            assert_eq!(r.mismatches(), 1, "{:?}", r.problems);
            assert!(r.problems[0].contains(says) && r.problems[0].contains("partition 3"));
            assert!(r.gpus[0].ok && !r.gpus[1].ok);
        }
        // a planned GPU NVML does not see
        let more = expectation(&[("0000:00:06.0", 1), ("0000:00:08.0", 2)], None);
        let r = judge(&view, Some(&more));
        assert!(r
            .problems
            .iter()
            .any(|p| p.contains("0000:00:08.0") && p.contains("no GPU")));
        // no plan: a view, nothing judged
        assert!(judge(&view, None).problems.is_empty());
    }
}
