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
