//! Command-line interface of `vfio-p2p-agent`: one subcommand per check. The binary
//! parses it; `cargo xtask dist` renders its man pages and shell completions from it.

use std::path::PathBuf;

use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};

/// The agent's clap definition, for man pages and completions.
pub fn command() -> clap::Command {
    Cli::command()
}

#[derive(Parser)]
#[command(
    name = "vfio-p2p-agent",
    version,
    about = "Checks GPU peer-to-peer inside a VM: clique capability, peer access, one-way writes, latency and bandwidth"
)]
pub struct Cli {
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table, global = true)]
    pub format: Format,
    /// `report`, `bench --simulate`: also print the time of each phase on stderr as it ends
    /// (also taken after those commands, not by the others).
    #[arg(short, long)]
    pub verbose: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Json,
    // text exposition format, `expect` and `report` only (node_exporter's textfile collector)
    Prometheus,
}

#[derive(Args)]
pub struct SysfsArgs {
    /// Root under which `sys/` is read (a copy of a VM's sysfs), or a flat sysfs JSON dump
    /// file as `vfio-p2p --sysfs-root` reads it.
    #[arg(long, default_value = "/")]
    pub sysfs_root: PathBuf,
}

#[derive(Args)]
pub struct ExpectArgs {
    /// The host's expectation; default: QEMU fw_cfg `opt/vfio-p2p/expect.json` when present.
    #[arg(long)]
    pub expect: Option<PathBuf>,
}

#[derive(Args)]
pub struct SendArgs {
    /// Also send the findings to the host over vsock (port from the host's expectation).
    #[arg(long)]
    pub send: bool,
}

#[derive(Subcommand)]
pub enum Command {
    /// List NVIDIA GPUs from sysfs with their P2P clique capability (no CUDA needed).
    Scan(SysfsArgs),
    /// Compare the GPUs and cliques with the host's expectation.
    Expect {
        #[command(flatten)]
        sysfs: SysfsArgs,
        #[command(flatten)]
        expect: ExpectArgs,
        #[command(flatten)]
        send: SendArgs,
    },
    /// Each GPU pair's PCIe path label in the guest (PIX/PXB/PHB/NODE/SYS, as
    /// `nvidia-smi topo -m` gives it) against the host's label in the expectation.
    Topo {
        #[command(flatten)]
        sysfs: SysfsArgs,
        #[command(flatten)]
        expect: ExpectArgs,
    },
    /// Peer access between every ordered GPU pair, as the driver reports it.
    Peers {
        #[command(flatten)]
        sysfs: SysfsArgs,
        #[command(flatten)]
        expect: ExpectArgs,
    },
    /// Write across every pair and check every word on the destination GPU.
    Verify {
        #[command(flatten)]
        sysfs: SysfsArgs,
        #[command(flatten)]
        expect: ExpectArgs,
        /// Size of the checked buffer, in MiB.
        #[arg(long, default_value_t = 64)]
        mib: usize,
        /// A test aid (self-test): after the writes land, corrupt word WORD on the
        /// destination (`dst:WORD`) or in the source's copy of the data (`src:WORD`), every
        /// pair; the check must report exactly the destination's words. Comma-separated or
        /// repeated.
        #[arg(long, value_name = "dst:WORD|src:WORD")]
        inject: Vec<String>,
    },
    /// Latency and bandwidth of every pair, with P2P and with it disabled.
    Bench(BenchArgs),
    /// Check the NCCL topology file (default: $NCCL_TOPO_FILE) against the GPUs this
    /// guest sees: every GPU and NVLink in it, and what NCCL would get wrong (no CUDA needed).
    NcclTopo {
        /// The file NCCL is given.
        file: Option<PathBuf>,
        #[command(flatten)]
        sysfs: SysfsArgs,
    },
    /// An NCCL all-reduce across every GPU, one process per GPU: each rank checks the sum
    /// element by element; bus bandwidth as nccl-tests computes it. Runs with NCCL's own
    /// topology detection, then with the topology file (--topo-file or NCCL_TOPO_FILE)
    /// when there is one; a file run much slower than NCCL's own fails, naming why.
    /// Without the NCCL library the stage says so and exits 0.
    Nccl {
        /// The NCCL library (default: $VFIO_P2P_NCCL_LIB, else libnccl.so.2 from the
        /// dynamic linker's path).
        #[arg(long)]
        nccl_lib: Option<PathBuf>,
        /// The NCCL topology file to run with (default: $NCCL_TOPO_FILE).
        #[arg(long)]
        topo_file: Option<PathBuf>,
        /// Size of each rank's buffer, in MiB.
        #[arg(long, default_value_t = 256)]
        mib: usize,
        #[command(flatten)]
        sysfs: SysfsArgs,
    },
    /// One rank of `nccl` (started by it, not by hand).
    #[command(hide = true)]
    NcclRank {
        #[arg(long)]
        rank: usize,
        #[arg(long)]
        nranks: usize,
        /// The bootstrap id, hex.
        #[arg(long)]
        id: String,
        #[arg(long)]
        gpu: pci_config::Bdf,
        #[arg(long)]
        bytes: usize,
        #[arg(long)]
        nccl_lib: PathBuf,
    },
    /// Peer access between processes, as NCCL uses it: per ordered pair and handle kind,
    /// a child process owns memory on the destination GPU, another writes into it from the
    /// source GPU through CUDA IPC, and the owner checks every word.
    CrossProcess {
        /// Handle kinds: posix-fd (cuMemExportToShareableHandle, NCCL's P2P/CUMEM), legacy
        /// (cuIpcGetMemHandle, cudaIpc*MemHandle), or both.
        #[arg(long, default_value = "both", value_parser = ["posix-fd", "legacy", "both"])]
        handle: String,
        /// Size of the checked buffer, in MiB.
        #[arg(long, default_value_t = 64)]
        mib: usize,
        /// Owner and writer on the same GPU, for each GPU: checks CUDA IPC between two
        /// processes (works with one GPU), not P2P.
        #[arg(long)]
        same_gpu: bool,
    },
    /// One side of `cross-process` (started by it, not by hand).
    #[command(hide = true)]
    CrossProcessChild {
        #[arg(value_parser = ["owner", "writer"])]
        role: String,
        #[arg(long)]
        gpu: pci_config::Bdf,
        #[arg(long, value_parser = ["posix-fd", "legacy"])]
        kind: String,
        #[arg(long)]
        mib: usize,
        #[arg(long)]
        socket: PathBuf,
    },
    /// One GPU's child of `cross-process` (started by it, not by hand): owner of a buffer
    /// per handle kind with a slot per other GPU, writer into every other GPU's.
    #[command(hide = true)]
    CrossProcessGpu {
        /// This child's GPU, an index into --gpus.
        #[arg(long)]
        index: usize,
        /// Every GPU of the check, comma-separated PCI addresses.
        #[arg(long, value_delimiter = ',')]
        gpus: Vec<pci_config::Bdf>,
        /// Handle kinds, comma-separated.
        #[arg(long, value_delimiter = ',', value_parser = ["posix-fd", "legacy"])]
        kinds: Vec<String>,
        #[arg(long)]
        mib: usize,
        /// Seconds the whole check may take.
        #[arg(long)]
        limit_s: u64,
        /// Where the children's sockets are.
        #[arg(long)]
        dir: PathBuf,
    },
    /// Times CUDA's setup step by step (cuInit, each context, NVML, each GPU's kernels)
    /// and prints the timeline as JSON; for the bench scripts.
    #[command(hide = true)]
    SetupProbe {
        /// One GPU after the other instead of a thread per GPU.
        #[arg(long)]
        serial: bool,
        /// This GPU only.
        #[arg(long)]
        only: Option<pci_config::Bdf>,
        /// Keep the contexts this many seconds after (keeps the driver warm for others).
        #[arg(long, default_value_t = 0)]
        hold_s: u64,
        /// First create and destroy a plain context (`cuCtxCreate`) on each GPU, one after
        /// the other, timed: against the primary contexts that follow.
        #[arg(long)]
        ctx_create: bool,
    },
    /// Everything: scan, expectation, peers, verify and bench, with a verdict per pair
    /// (and the NCCL topology file when NCCL_TOPO_FILE is set).
    Report(ReportArgs),
}

/// `bench`'s arguments.
#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub sysfs: SysfsArgs,
    /// A short run (seconds), smaller buffers and fewer samples.
    #[arg(long)]
    pub quick: bool,
    /// Run the schedule of N GPUs on the GPUs at hand (simulated GPU i is GPU i mod
    /// count; with one GPU every pair is that GPU with itself, not P2P): rounds of
    /// disjoint pairs at once, as on an NVSwitch fabric.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(2..=64))]
    pub simulate: Option<u16>,
    /// With --simulate: one pair at a time, to compare.
    #[arg(long, requires = "simulate")]
    pub serial: bool,
    /// With --simulate: also print the time of each phase on stderr as it ends.
    #[arg(short, long)]
    pub verbose: bool,
}

/// `report`'s arguments.
#[derive(Args)]
pub struct ReportArgs {
    #[command(flatten)]
    pub sysfs: SysfsArgs,
    #[command(flatten)]
    pub expect: ExpectArgs,
    /// A short bench part (seconds): smaller buffers and fewer samples, as `bench --quick`.
    #[arg(long)]
    pub quick: bool,
    /// A previous report (JSON) of the same GPUs on bare metal: adds VM/bare-metal ratios.
    #[arg(long)]
    pub baseline: Option<PathBuf>,
    /// Also check peer access across processes (`cross-process`, both handle kinds).
    #[arg(long)]
    pub cross_process: bool,
    /// Judge and print a saved report (JSON) instead of measuring (no GPU needed).
    #[arg(long, conflicts_with_all = ["quick", "expect", "send", "inject"])]
    pub from: Option<PathBuf>,
    /// A test aid (self-test): after the writes land, corrupt word WORD on the
    /// destination (`dst:WORD`) or in the source's copy of the data (`src:WORD`), every
    /// pair; the check must report exactly the destination's words. Comma-separated or
    /// repeated.
    #[arg(long, value_name = "dst:WORD|src:WORD")]
    pub inject: Vec<String>,
    #[command(flatten)]
    pub send: SendArgs,
    /// Also print the time of each phase on stderr as it ends.
    #[arg(short, long)]
    pub verbose: bool,
    /// A bench aid (`bench/compare-with-reference.sh`): KEY=VALUE overrides of the bench plan
    /// (`BenchPlan::tuned`), and `exit=reset` (each GPU's context reset, a thread per
    /// GPU, before the process ends) to compare ideas in one build.
    #[arg(long, hide = true, value_delimiter = ',')]
    pub tune: Vec<String>,
}
