//! `vfio-p2p fabric list|activate|deactivate|resync`: Fabric Manager's partitions for
//! operators, through FM's API at host.yaml's `fabric_manager: address:` (or `--address`),
//! recorded in the same place the libvirt hook records the partitions it activates.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand, ValueEnum};

use crate::cli::GlobalArgs;
use crate::context::change::ChangeRoot;
use vfio_p2p_bind::partition_activation::{activate, deactivate, resync, ActivationRecord};
use vfio_p2p_bind::writer;
use vfio_p2p_config::host::{FabricManagerSource, HostConfig};
use vfio_p2p_emit::fabric_list::{self, FabricListing, Holder};
use vfio_p2p_model::fabric_state::{check_module_map, FabricState};
use vfio_p2p_read::fabric_manager::{fabric_state, read_fabric_manager};
use vfio_p2p_read::fm_api::FmSession;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum FabricFormat {
    #[default]
    Table,
    Json,
}

#[derive(Debug, Args)]
pub struct FabricArgs {
    /// Fabric Manager's address (HOST:PORT or unix:/PATH) instead of host.yaml's
    /// `fabric_manager: address:` (default 127.0.0.1:6666).
    #[arg(long, global = true, value_name = "ADDRESS")]
    pub address: Option<String>,
    /// Seconds to wait for another bind/unbind/hook to finish.
    #[arg(long, global = true, value_name = "SECONDS", default_value_t = 30)]
    pub lock_timeout: u64,
    #[command(subcommand)]
    pub action: FabricAction,
}

#[derive(Debug, Subcommand)]
pub enum FabricAction {
    /// FM's partitions: GPUs (module id, PCI address), NVLinks, and who holds the active ones.
    List {
        #[arg(long, value_enum, default_value_t)]
        format: FabricFormat,
    },
    /// Reset the partition's GPUs and activate it (for a VM started outside the libvirt hook).
    Activate { id: u32 },
    /// Deactivate a partition (its VM must be stopped).
    Deactivate {
        id: u32,
        /// Also a partition the libvirt hook activated for a guest.
        #[arg(long)]
        force: bool,
    },
    /// After Fabric Manager restarted: tell it which partitions are active
    /// (fmSetActivatedFabricPartitions, from vfio-p2p's record).
    Resync,
}

fn address(config: &HostConfig, given: Option<String>) -> anyhow::Result<String> {
    if let Some(a) = given {
        return Ok(a);
    }
    match &config.fabric_manager {
        FabricManagerSource::Live(a) => Ok(a.clone()),
        FabricManagerSource::Capture(p) => anyhow::bail!(
            "host.yaml's fabric_manager names a saved partition list ({}), so Fabric Manager runs elsewhere (a service VM): run this there, or give --address",
            p.display()
        ),
    }
}

fn holders(record: &ActivationRecord) -> BTreeMap<u32, Holder> {
    record
        .partitions
        .iter()
        .map(|(id, p)| {
            let h = match &p.guest {
                Some(g) => Holder::Guest(g.clone()),
                None => Holder::Operator,
            };
            (*id, h)
        })
        .collect()
}

pub fn run(global: &GlobalArgs, a: FabricArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        global.example.is_none(),
        "fabric talks to this host's Fabric Manager; --example does not apply"
    );
    let change = ChangeRoot::of(global, false)?;
    let root = change.path();
    let config = change.host_config()?;
    let address = address(&config, a.address)?;
    let timeout = Duration::from_secs(a.lock_timeout);
    let mut fm = change.fabric_manager(&address)?;
    // FM's partitions with host.yaml's module addresses, as the hook and planning see them.
    let read_state = |fm: &FmSession| -> anyhow::Result<FabricState> {
        let mut state = fabric_state(&read_fabric_manager(fm)?)
            .map_err(|e| anyhow::anyhow!("Fabric Manager at {address}: {e}"))?;
        state.apply_module_addresses(&config.fabric_modules);
        if !config.fabric_modules.is_empty() {
            let topo = change.devices()?;
            let gpus: Vec<_> = topo
                .gpus()
                .filter(|g| g.is_nvidia_gpu())
                .map(|g| g.bdf)
                .collect();
            check_module_map(&config.fabric_modules, &gpus)
                .and_then(|()| state.check())
                .map_err(|e| anyhow::anyhow!("host.yaml with Fabric Manager at {address}: {e}"))?;
        }
        Ok(state)
    };
    match a.action {
        FabricAction::List { format } => {
            let state = read_state(&fm)?;
            let listing =
                FabricListing::new(&address, &state, &holders(&ActivationRecord::load(root)?));
            match format {
                FabricFormat::Table => print!("{}", fabric_list::table(&listing)),
                FabricFormat::Json => println!("{}", serde_json::to_string_pretty(&listing)?),
            }
        }
        FabricAction::Activate { id } => {
            let state = read_state(&fm)?;
            let p = state
                .partitions
                .iter()
                .find(|p| p.id == id)
                .with_context(|| format!("Fabric Manager at {address} has no partition {id}: `vfio-p2p fabric list` shows its partitions"))?;
            let gpus: Vec<_> = p.gpus.iter().filter_map(|g| g.bdf).collect();
            let r = activate(root, &mut writer()?, &mut fm, id, &gpus, None, timeout)?;
            for w in &r.resets {
                println!("{w}");
            }
            if gpus.len() < p.gpus.len() || !r.not_resettable.is_empty() {
                println!("warning: FM lists not every GPU's PCI address, or a GPU has no reset method: reset the partition's GPUs yourself before its VM starts");
            }
            for (bdf, driver) in &r.reset_on_host_driver {
                println!("warning: {bdf} was reset while still on its host driver {driver}: FM's sequence resets a partition's GPUs on vfio-pci (`vfio-p2p bind {bdf}` first)");
            }
            println!("activated Fabric Manager partition {id}");
        }
        FabricAction::Deactivate { id, force } => {
            if let Some(held) = ActivationRecord::load(root)?.partitions.get(&id) {
                if let (Some(g), false) = (&held.guest, force) {
                    anyhow::bail!("partition {id} was activated for guest {g} by the libvirt hook, which deactivates it when the guest stops; stop the guest (`virsh shutdown {g}`), or give --force");
                }
            }
            let done = deactivate(root, &mut fm, &[id], timeout)?;
            match done.first() {
                Some(d) if d.was_inactive => {
                    println!("Fabric Manager partition {id} was not active; record cleared")
                }
                _ => println!("deactivated Fabric Manager partition {id}"),
            }
        }
        FabricAction::Resync => {
            let ids = resync(root, &mut fm, timeout)?;
            let list: Vec<String> = ids.iter().map(u32::to_string).collect();
            let active = match list.as_slice() {
                [] => "no partition is active".to_string(),
                [one] => format!("partition {one} is active"),
                many => format!("partitions {} are active", many.join(", ")),
            };
            println!("told Fabric Manager at {address}: {active}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
