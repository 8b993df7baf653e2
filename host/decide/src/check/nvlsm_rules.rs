//! NVLink-5 boards (HGX B100/B200/B300): their fourth-generation NVSwitches are no PCI
//! devices of the host but sit behind the baseboard's ConnectX-7 bridge, and Fabric
//! Manager brings the NVLink fabric up only with the NVLink Subnet Manager (NVLSM)
//! beside it, on the same bridge port (NVIDIA's Fabric Manager user guide, "Systems
//! Using Fourth Generation NVSwitches"). Without it no GPU registers with the fabric and
//! the VMs get no NVLink.

use pci_config::Bdf;

use super::report::{result, CheckResult, Status};
use crate::fabric::nvlink5_board;
use vfio_p2p_model::fabric::FabricModel;
use vfio_p2p_model::fabric_state::{NvlsmFacts, NvlsmProbe};
use vfio_p2p_model::Topology;

const CHECK: &str = "nvlink-subnet-manager";

/// How to install both daemons together (the guide's meta packages).
const INSTALL: &str = "install `nvlink5-<driver branch>` (Debian/Ubuntu; `nvlink-<driver branch>` on RHEL), which brings Fabric Manager and NVLSM at the driver's version";
const RESTART: &str = "systemctl restart nvidia-fabricmanager (on NVLink-5 boards its unit starts NVLSM too; `journalctl -u nvidia-fabricmanager` says why it stopped)";

/// One row for a VM with GPUs of an NVLink-5 board; none for other GPUs, and none under
/// full passthrough (FM and NVLSM then run in the guest).
pub fn nvlsm_checks(
    topo: &Topology,
    gpus: &[Bdf],
    model: Option<FabricModel>,
    probe: &NvlsmProbe,
) -> Option<CheckResult> {
    let board = nvlink5_board(topo, gpus)?;
    if model == Some(FabricModel::FullPassthrough) {
        return None;
    }
    let row = |status, saw: String, fix: Option<String>| {
        result(CHECK, None, status, format!("{board}: {saw}"), fix)
    };
    let f = match probe {
        NvlsmProbe::NotProbed(why) => {
            return Some(row(
                Status::Skip,
                format!("NVLSM not probed ({why})"),
                Some("run check on the host itself to see NVLSM beside Fabric Manager".into()),
            ))
        }
        NvlsmProbe::Probed(f) => f,
    };
    Some(match judge(f) {
        Ok(saw) => row(Status::Pass, saw, None),
        Err((status, saw, fix)) => row(status, saw, Some(fix)),
    })
}

/// Pass with what was seen, or the status, what was seen and the fix.
fn judge(f: &NvlsmFacts) -> Result<String, (Status, String, String)> {
    let fail = |saw: String, fix: String| Err((Status::Fail, saw, fix));
    let Some(binary) = &f.nvlsm_binary else {
        return match &f.fm_binary {
            None => Err((
                Status::Warn,
                "neither Fabric Manager nor NVLSM is installed here".into(),
                format!("{INSTALL}; or run both in FM's service VM, with the ConnectX-7 bridge's limited PFs"),
            )),
            Some(fm) => fail(
                format!("Fabric Manager is installed ({fm}), NVLSM is not: FM cannot bring up the NVLink fabric"),
                INSTALL.into(),
            ),
        };
    };
    if !f.umad {
        return fail(
            "ib_umad is not loaded (no /sys/class/infiniband_mad): NVLSM cannot reach the NVSwitches".into(),
            format!("modprobe ib_umad (and list it in /etc/modules-load.d/), install libibumad3 and infiniband-diags, then {RESTART}"),
        );
    }
    let (Some(sm), Some(fm)) = (&f.nvlsm, &f.fm) else {
        let which = match (&f.nvlsm, &f.fm) {
            (None, None) => "neither NVLSM nor Fabric Manager is running".to_string(),
            (None, Some(fm)) => format!("Fabric Manager runs (pid {}) without NVLSM", fm.pid),
            (Some(sm), _) => format!("NVLSM runs (pid {}) without Fabric Manager", sm.pid),
        };
        return fail(
            format!("NVLSM is installed ({binary}), but {which}"),
            RESTART.into(),
        );
    };
    let guid = |d: &vfio_p2p_model::fabric_state::Daemon| {
        d.port_guid
            .map_or("no port GUID".to_string(), |g| format!("port {g:#018x}"))
    };
    if let (Some(a), Some(b)) = (sm.port_guid, fm.port_guid) {
        if a != b {
            return fail(
                format!("NVLSM is bound to port {a:#018x}, Fabric Manager to {b:#018x}"),
                format!("{RESTART}: its start script gives both the ConnectX-7 bridge port whose VPD says SMDL=SW_MNG"),
            );
        }
    }
    Ok(format!(
        "NVLSM (pid {}, {}) beside Fabric Manager (pid {}, {}); ib_umad loaded",
        sm.pid,
        guid(sm),
        fm.pid,
        guid(fm)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use vfio_p2p_model::fabric_state::Daemon;
    use vfio_p2p_read::synth::{Attach, EndpointSpec, HostBuilder, ACS_ISOLATING};

    fn host_with(device: u16) -> (Topology, Vec<Bdf>) {
        let mut b = HostBuilder::new("nvlsm host");
        let hb = b.host_bridge(0, 0x40);
        let rp = b.root_port(hb, Some(0), Some(ACS_ISOLATING));
        b.endpoint(
            Attach::Below(rp),
            0,
            &EndpointSpec::gpu(0x10de, device, 256),
            None,
        );
        let t = Topology::from_record(&b.build());
        let gpus = t.gpus().map(|g| g.bdf).collect();
        (t, gpus)
    }

    fn running(guid: u64) -> Option<Daemon> {
        Some(Daemon {
            pid: 7,
            port_guid: Some(guid),
        })
    }

    fn healthy() -> NvlsmFacts {
        NvlsmFacts {
            nvlsm_binary: Some("/opt/nvidia/nvlsm/sbin/nvlsm".into()),
            fm_binary: Some("/usr/bin/nv-fabricmanager".into()),
            umad: true,
            nvlsm: running(0x74),
            fm: running(0x74),
        }
    }

    fn status(device: u16, model: Option<FabricModel>, f: NvlsmFacts) -> Option<Status> {
        let (t, gpus) = host_with(device);
        nvlsm_checks(&t, &gpus, model, &NvlsmProbe::Probed(f)).map(|r| r.status)
    }

    #[test]
    fn an_hgx_b200_passes_only_with_nvlsm_installed_loaded_running_on_fms_port() {
        let shared = Some(FabricModel::SharedNvswitch);
        assert_eq!(status(0x2901, shared, healthy()), Some(Status::Pass));
        assert_eq!(status(0x3182, None, healthy()), Some(Status::Pass));
        let no_sm = NvlsmFacts {
            nvlsm_binary: None,
            ..healthy()
        };
        assert_eq!(status(0x2901, shared, no_sm.clone()), Some(Status::Fail));
        let nothing = NvlsmFacts {
            fm_binary: None,
            ..no_sm
        };
        assert_eq!(status(0x2901, shared, nothing), Some(Status::Warn));
        let no_umad = NvlsmFacts {
            umad: false,
            ..healthy()
        };
        assert_eq!(status(0x2901, shared, no_umad), Some(Status::Fail));
        let stopped = NvlsmFacts {
            nvlsm: None,
            ..healthy()
        };
        assert_eq!(status(0x2901, shared, stopped), Some(Status::Fail));
        let fm_stopped = NvlsmFacts {
            fm: None,
            ..healthy()
        };
        assert_eq!(status(0x2901, shared, fm_stopped), Some(Status::Fail));
        let other_port = NvlsmFacts {
            fm: running(0x75),
            ..healthy()
        };
        assert_eq!(status(0x2901, shared, other_port), Some(Status::Fail));
    }

    #[test]
    fn not_shown_for_hopper_grace_trays_or_full_passthrough() {
        let broken = NvlsmFacts::default();
        assert_eq!(status(0x2335, None, broken.clone()), None); // H200
        assert_eq!(status(0x2941, None, broken.clone()), None); // GB200 tray
        let full = Some(FabricModel::FullPassthrough);
        assert_eq!(status(0x2901, full, broken), None);
    }

    #[test]
    fn not_probed_is_skipped_and_says_where_to_run() {
        let (t, gpus) = host_with(0x2909);
        let r = nvlsm_checks(&t, &gpus, None, &NvlsmProbe::NotProbed("an example".into())).unwrap();
        assert_eq!(r.status, Status::Skip);
        assert!(r
            .fix
            .as_deref()
            .is_some_and(|f| f.contains("on the host itself")));
        assert!(r.saw.starts_with("HGX B200: "), "{}", r.saw);
    }
}
