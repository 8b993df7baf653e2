//! The sections of each binary's top man page that its `--help` does not hold: EXAMPLES,
//! EXIT STATUS, ENVIRONMENT and FILES, with the paths the binaries really use.

use vfio_p2p::commands::hook::HOOK_DIR;
use vfio_p2p_bind::state::STATE_DIR;
use vfio_p2p_collector::store::DEFAULT_STATE_DIR;
use vfio_p2p_config::host::HOST_CONFIG_PATH;
use vfio_p2p_contract::FW_CFG_SYSFS_PATH;

/// One section: its title and (term, text) entries.
pub struct Section {
    pub title: &'static str,
    pub entries: Vec<(String, String)>,
}

fn section(title: &'static str, entries: &[(&str, &str)]) -> Section {
    Section {
        title,
        entries: entries
            .iter()
            .map(|(t, d)| (t.to_string(), d.to_string()))
            .collect(),
    }
}

/// The extra sections of `name`'s top page (none for another binary).
pub fn for_binary(name: &str) -> Vec<Section> {
    match name {
        "vfio-p2p" => host(),
        "vfio-p2p-agent" => agent(),
        _ => Vec::new(),
    }
}

fn host() -> Vec<Section> {
    let hook = format!("/{HOOK_DIR}/vfio-p2p");
    let host_yaml = format!("/{HOST_CONFIG_PATH}");
    let bind_state = format!("/{STATE_DIR}");
    vec![
        section(
            "EXIT STATUS",
            &[
                ("0", "Success; for check, every check that ran passed (a skip row, a probe that needs the live host, does not count)."),
                ("1", "check: a warning and no failure."),
                ("2", "An error (bad input, a host that cannot be read, a failed bind, which is rolled back); for check, a failure."),
            ],
        ),
        section(
            "ENVIRONMENT",
            &[
                ("VFIO_P2P_LOG", "A tracing filter for the log on stderr (default warn; -v is info, -vv debug)."),
                ("COLUMNS", "The width tables and help are fitted to when the output is not a terminal (default 120)."),
            ],
        ),
        Section {
            title: "FILES",
            entries: vec![
                (host_yaml, "Host policy: the P2P level, devices the host keeps (reserved), where NVLink is read from, hook_policy; the defaults apply when it is absent.".into()),
                (hook, "The libvirt qemu hook that hook install writes; libvirt runs it before a guest starts and after it stops.".into()),
                (bind_state, "What bind changed, for unbind and the hook's release, and the lock that serializes them.".into()),
                (DEFAULT_STATE_DIR.into(), "The state directory of collect and verdicts: registered VMs, their expectations, the agents' reports and the verdicts (--state-dir).".into()),
            ],
        },
        section(
            "EXAMPLES",
            &[
                ("vfio-p2p --example hgx-h100 topo", "The matrix, legend and PCIe tree of an embedded 8-GPU host (--example list names the others)."),
                ("vfio-p2p plan --gpus 0000:18:00.0,0000:2a:00.0", "The cliques of two GPUs of this host, and every pair's path."),
                ("vfio-p2p check --domain-xml vm.xml", "Preflight this host for the GPUs of a libvirt domain."),
                ("vfio-p2p gen libvirt --config vm.yaml -o vm.xml", "A libvirt domain with the planned cliques, the guest PCIe layout and the 64-bit MMIO window."),
                ("virsh dumpxml --inactive train-01 | vfio-p2p libvirt patch - -o train-01.xml", "The same settings added to an existing domain; then virsh define train-01.xml."),
                ("vfio-p2p hook install", "Install the libvirt hook; then restart libvirtd (or virtqemud)."),
            ],
        ),
    ]
}

fn agent() -> Vec<Section> {
    let expect = format!("/{FW_CFG_SYSFS_PATH}");
    vec![
        section(
            "EXIT STATUS",
            &[
                ("0", "All as expected."),
                ("1", "A mismatch: a clique, a peer access or a transfer is not what the host planned."),
                ("2", "The check cannot run (no GPU, no CUDA driver, unreadable input)."),
            ],
        ),
        section(
            "ENVIRONMENT",
            &[
                ("RUST_LOG", "A tracing filter for the log on stderr (default warn)."),
                ("NCCL_TOPO_FILE", "The NCCL topology file nccl-topo and report check when no file is given."),
                ("COLUMNS", "The width tables and help are fitted to when the output is not a terminal (default 120)."),
            ],
        ),
        Section {
            title: "FILES",
            entries: vec![(
                expect,
                "The host's expectation (QEMU fw_cfg opt/vfio-p2p/expect.json, written by vfio-p2p gen); load qemu_fw_cfg to read it, or pass --expect FILE.".into(),
            )],
        },
        section(
            "EXAMPLES",
            &[
                ("vfio-p2p-agent scan", "The NVIDIA GPUs in sysfs and their clique capability (no CUDA needed)."),
                ("vfio-p2p-agent report", "Everything, checked against the host's expectation: cliques, peer access, one-way writes, latency and bandwidth."),
                ("vfio-p2p-agent report --send", "The same, also sent to the host's collector over vsock."),
            ],
        ),
    ]
}

/// Roff text of `sections`, each entry a tagged paragraph.
pub fn roff(sections: &[Section]) -> String {
    let mut out = String::new();
    for s in sections {
        out.push_str(&format!(".SH \"{}\"\n", s.title));
        for (term, text) in &s.entries {
            out.push_str(&format!(
                ".TP\n\\fB{}\\fR\n{}\n",
                escape(term),
                escape(text)
            ));
        }
    }
    out
}

/// Text safe in roff: backslashes and hyphens escaped, no line starting with a control
/// character.
fn escape(text: &str) -> String {
    let t = text.replace('\\', "\\\\").replace('-', "\\-");
    if t.starts_with('.') || t.starts_with('\'') {
        format!("\\&{t}")
    } else {
        t
    }
}

/// `page` (clap_mangen's top page) with `sections` before its VERSION section, or at its end.
pub fn insert(page: &str, sections: &[Section]) -> String {
    let text = roff(sections);
    match page.find(".SH VERSION") {
        Some(at) => format!("{}{text}{}", &page[..at], &page[at..]),
        None => format!("{page}{text}"),
    }
}
