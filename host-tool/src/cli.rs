//! The global command-line options: where the host facts come from, and how much to log.
//! The subcommands, one per job, are `commands::Command`.

use std::path::PathBuf;

use clap::Args;

/// Where the host facts come from; every data command takes these.
#[derive(Debug, Clone, Args)]
pub struct GlobalArgs {
    /// Read the host below this directory (`DIR/sys/...`): `/` for the live host,
    /// a `vfio-p2p snapshot` directory, or a flat sysfs JSON dump file.
    #[arg(long, global = true, value_name = "DIR", default_value = "/")]
    pub sysfs_root: PathBuf,
    /// Use a topology embedded in the binary instead of this host (`--example list`).
    #[arg(
        long,
        global = true,
        value_name = "NAME",
        conflicts_with = "sysfs_root"
    )]
    pub example: Option<String>,
    /// More log output (repeat for more).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

/// `--p2p-level` and `--max-path`: a path level by its label, offered to the shell
/// completions (`cargo xtask dist` renders them from these possible values) and in any case.
pub fn path_level() -> impl clap::builder::TypedValueParser<Value = pci_config::PathKind> {
    use clap::builder::TypedValueParser as _;
    let labels = ["pix", "pxb", "phb", "node", "sys"];
    clap::builder::PossibleValuesParser::new(labels).map(|s| {
        s.parse::<pci_config::PathKind>()
            .expect("every possible value is a label")
    })
}
