//! Logging to stderr, so stdout stays clean for data (JSON, XML, argv), as plain
//! `warning: …` lines like every other warning the tool prints.

pub fn init(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    vfio_p2p_style::init_logging("VFIO_P2P_LOG", default);
}

/// Says what planning said ([`vfio_p2p_decide::vm::Said`]): a warning as a `warning: …` line, a note as
/// `vfio-p2p: …`.
pub fn say(said: vfio_p2p_decide::vm::Said) {
    use vfio_p2p_decide::vm::Said;
    match said {
        Said::Warning(w) => tracing::warn!("{w}"),
        Said::Note(n) => eprintln!("vfio-p2p: {n}"),
    }
}
