//! `vfio-p2p kubevirt on-define-domain --vmi JSON --domain XML`: KubeVirt's hook-sidecar
//! `onDefineDomain` (run by the sidecar shim in the virt-launcher pod): prints the domain
//! with the planned cliques as `<qemu:override>` on the hostdev aliases KubeVirt gave the
//! VMI's GPUs (`ua-gpu-…`, `ua-hostdevice-…`). The host topology comes from the pod's
//! /sys/bus/pci, which shows the node's PCI devices.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Write as _;
use std::os::unix::ffi::OsStrExt;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use pci_config::Bdf;

use crate::cli::GlobalArgs;
use crate::context::source::{HostConfigFrom, HostSource};
use crate::context::{Context, Needs, PlanOptionArgs};
use vfio_p2p_config::host::{HookPolicy, HostConfig};
use vfio_p2p_decide::vm::libvirt::PatchWindow;
use vfio_p2p_emit::libvirt_patch;
use vfio_p2p_model::vmm::LibvirtVersion;
use vfio_p2p_read::domain_xml::{parse_domain_xml_bytes, MAX_DOMAIN_XML_BYTES};
use vfio_p2p_read::kubevirt_vmi::parse_kubevirt_vmi;

#[derive(Debug, Args)]
pub struct KubevirtArgs {
    #[command(subcommand)]
    pub command: KubevirtCommand,
}

#[derive(Debug, Subcommand)]
pub enum KubevirtCommand {
    /// The onDefineDomain hook: print the domain with the VMI's GPU cliques added.
    OnDefineDomain(OnDefineDomainArgs),
}

#[derive(Debug, Args)]
pub struct OnDefineDomainArgs {
    /// The VirtualMachineInstance as JSON (the sidecar shim passes it).
    // OsString: an argument that is not UTF-8 must reach the hook policy, not stop the
    // parser (which would fail the VMI's start without a word).
    #[arg(long, value_name = "JSON")]
    pub vmi: OsString,
    /// The domain XML virt-launcher is about to define (the sidecar shim passes it).
    #[arg(long, value_name = "XML")]
    pub domain: OsString,
    #[command(flatten)]
    pub plan: PlanOptionArgs,
    /// The libvirt in virt-launcher (KubeVirt ≥ 1.0 ships ≥ 9.0; below 8.2 cliques use `-set`).
    #[arg(long, value_name = "X.Y", default_value = "9.0")]
    pub libvirt_version: LibvirtVersion,
}

pub fn run(global: &GlobalArgs, args: KubevirtArgs) -> anyhow::Result<ExitCode> {
    let KubevirtCommand::OnDefineDomain(a) = args.command;
    let source = HostSource::of(global);
    let config = source.host_config(
        a.plan.host.host_config.as_deref(),
        HostConfigFrom::FlagOrDefaults,
    )?;
    let policy = config.hook_policy;
    match patched_domain(source, config, &a) {
        Ok(xml) => print!("{xml}"),
        Err(e) => {
            let why = vfio_p2p_style::error_chain(e.as_ref());
            match policy {
                HookPolicy::Deny => anyhow::bail!(
                    "kubevirt onDefineDomain: {why}; the VMI does not start (hook_policy: deny)"
                ),
                HookPolicy::Warn => {
                    tracing::warn!(
                        "kubevirt: onDefineDomain: {why}; the domain is left as it was, without cliques (hook_policy: warn)"
                    );
                    let mut out = std::io::stdout().lock();
                    out.write_all(a.domain.as_bytes())
                        .and_then(|()| out.flush())
                        .context("writing the domain to stdout")?;
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The domain with the cliques of the VMI's GPUs, or why it cannot be made.
fn patched_domain(
    source: HostSource,
    config: HostConfig,
    a: &OnDefineDomainArgs,
) -> anyhow::Result<String> {
    let vmi_text = a
        .vmi
        .to_str()
        .context("--vmi is not UTF-8, so it is no VirtualMachineInstance JSON")?;
    let vmi = parse_kubevirt_vmi(vmi_text).map_err(anyhow::Error::msg)?;
    anyhow::ensure!(
        a.domain.len() as u64 <= MAX_DOMAIN_XML_BYTES,
        "--domain is larger than {MAX_DOMAIN_XML_BYTES} bytes"
    );
    let domain = a
        .domain
        .to_str()
        .context("--domain is not UTF-8, which libvirt's domain XML always is")?;
    let facts = parse_domain_xml_bytes(domain.as_bytes(), "the domain from virt-launcher")?;
    let wanted: Vec<(Bdf, &str)> = facts
        .hostdevs
        .iter()
        .filter_map(|h| {
            let alias = h.alias_name()?;
            vmi.device_aliases
                .iter()
                .any(|(a, _)| a == alias)
                .then_some((h.bdf, alias))
        })
        .collect();
    if wanted.is_empty() {
        eprintln!(
            "vfio-p2p kubevirt: {}: no PCI hostdev of its gpus/hostDevices in the domain; left as it was",
            vmi.name
        );
        return Ok(domain.to_string());
    }
    let ctx = Context::build(source, config, &Needs::nvlink(&a.plan.nvlink))?;
    for w in ctx.warnings.iter().chain(&ctx.fabric_notes) {
        tracing::debug!("{w}");
    }
    let missing: Vec<String> = wanted
        .iter()
        .filter(|(b, _)| ctx.topo.device(b).is_none())
        .map(|(b, alias)| format!("{b} ({alias})"))
        .collect();
    anyhow::ensure!(
        missing.is_empty(),
        "cannot see the node's PCI devices {} in {} ({} PCI devices there): the sidecar needs the node's /sys (not a private sysfs) to plan cliques",
        missing.join(", "),
        ctx.topo.source,
        ctx.topo.devices.len()
    );
    let gpus: Vec<Bdf> = wanted
        .iter()
        .map(|(b, _)| *b)
        .filter(|b| ctx.topo.device(b).is_some_and(|d| d.is_gpu()))
        .collect();
    let cliques: BTreeMap<Bdf, Option<u8>> = if gpus.is_empty() {
        BTreeMap::new()
    } else {
        let who = format!("kubevirt: {}: ", vmi.name);
        ctx.plan_as(&who, &gpus, &ctx.plan_options(&a.plan, None))?
            .assignments
    };
    let patched = libvirt_patch::apply(
        domain,
        &facts,
        &cliques,
        PatchWindow::DefaultFits,
        a.libvirt_version,
    )?;
    for w in &patched.warnings {
        tracing::warn!("kubevirt: {}: {w}", vmi.name);
    }
    for (bdf, alias) in &patched.aliases {
        if let Some(Some(k)) = cliques.get(bdf) {
            eprintln!(
                "vfio-p2p kubevirt: {}: {alias} ({bdf}): clique {k}",
                vmi.name
            );
        }
    }
    Ok(patched.xml)
}
