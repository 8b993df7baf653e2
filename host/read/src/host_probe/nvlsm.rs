//! The NVLink Subnet Manager (NVLSM) beside Fabric Manager on an NVLink-5 board (HGX
//! B100/B200/B300), under a root: the binaries the `nvlink5-<branch>` packages install,
//! `ib_umad` loaded (`/sys/class/infiniband_mad`), and the running `nvlsm` and
//! `nv-fabricmanager` with the management port GUID each was started with.
//!
//! Paths as NVIDIA ships them: FM's service unit starts both daemons through its start
//! script, `nvlsm -F /usr/share/nvidia/nvlsm/nvlsm.conf … -g GUID` and
//! `nv-fabricmanager -c … -g GUID` (the Fabric Manager user guide, "Fabric Manager
//! Service File" and `--fm-sm-mgmt-port-guid`; the process list of a public HGX B300
//! host's `systemctl status nvidia-fabricmanager`).

use std::fs;
use std::path::Path;

use vfio_p2p_files::{read_attribute_text, read_input_file};
use vfio_p2p_model::fabric_state::{Daemon, NvlsmFacts};

/// Where the `nvlsm` package puts the daemon.
pub const NVLSM_BINARY: &str = "opt/nvidia/nvlsm/sbin/nvlsm";
/// Where the Fabric Manager package puts its daemon.
pub const FM_BINARY: &str = "usr/bin/nv-fabricmanager";
/// Present while `ib_umad` is loaded (NVLSM fails to start without it).
pub const UMAD_CLASS: &str = "sys/class/infiniband_mad";

/// `comm` holds at most 15 bytes: `nv-fabricmanager` shows as this.
const FM_COMM: &str = "nv-fabricmanage";
const NVLSM_COMM: &str = "nvlsm";
/// A daemon's command line is a few hundred bytes.
const MAX_CMDLINE_BYTES: u64 = 64 << 10;

/// Probes `root` once; processes that vanish while being read are skipped.
pub fn probe(root: &Path) -> NvlsmFacts {
    let installed = |rel: &str| {
        let p = root.join(rel);
        p.is_file().then(|| p.display().to_string())
    };
    let mut facts = NvlsmFacts {
        nvlsm_binary: installed(NVLSM_BINARY),
        fm_binary: installed(FM_BINARY),
        umad: root.join(UMAD_CLASS).is_dir(),
        ..NvlsmFacts::default()
    };
    let Ok(procs) = fs::read_dir(root.join("proc")) else {
        return facts;
    };
    for entry in procs.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        let Ok(comm) = read_attribute_text(&entry.path().join("comm"), "process name") else {
            continue;
        };
        let slot = match comm.trim_end() {
            NVLSM_COMM => &mut facts.nvlsm,
            FM_COMM => &mut facts.fm,
            _ => continue,
        };
        let argv = read_input_file(
            &entry.path().join("cmdline"),
            MAX_CMDLINE_BYTES,
            "process command line",
        )
        .unwrap_or_default();
        // The lowest pid of each: the daemon, not a helper it forked.
        if slot.as_ref().is_none_or(|d| d.pid > pid) {
            *slot = Some(Daemon {
                pid,
                port_guid: port_guid(&argv),
            });
        }
    }
    facts
}

/// The GUID after `-g`, `--guid` or `--fm-sm-mgmt-port-guid` (also `--guid=X`) in a
/// NUL-separated command line: hexadecimal with `0x`, else decimal.
pub fn port_guid(cmdline: &[u8]) -> Option<u64> {
    let args: Vec<String> = cmdline
        .split(|&b| b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    const FLAGS: [&str; 3] = ["-g", "--guid", "--fm-sm-mgmt-port-guid"];
    args.iter().enumerate().find_map(|(i, a)| {
        let value = match a.split_once('=') {
            Some((flag, v)) if FLAGS.contains(&flag) => v,
            _ if FLAGS.contains(&a.as_str()) => args.get(i + 1)?,
            _ => return None,
        };
        match value
            .strip_prefix("0x")
            .or_else(|| value.strip_prefix("0X"))
        {
            Some(hex) => u64::from_str_radix(hex, 16).ok(),
            None => value.parse().ok(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, bytes: &[u8]) {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, bytes).unwrap();
    }

    /// A fake HGX B300 root as the public host's process list shows it.
    #[test]
    fn reads_binaries_umad_and_both_daemons_with_their_guid() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        assert_eq!(probe(root), NvlsmFacts::default());
        write(root, NVLSM_BINARY, b"");
        write(root, FM_BINARY, b"");
        fs::create_dir_all(root.join(UMAD_CLASS)).unwrap();
        write(root, "proc/31060/comm", b"nvlsm\n");
        write(
            root,
            "proc/31060/cmdline",
            b"/opt/nvidia/nvlsm/sbin/nvlsm\0-F\0/usr/share/nvidia/nvlsm/nvlsm.conf\0-B\0-g\x000x7425540300353de9\0",
        );
        write(root, "proc/31082/comm", b"nv-fabricmanage\n");
        write(
            root,
            "proc/31082/cmdline",
            b"/usr/bin/nv-fabricmanager\0-c\0/usr/share/nvidia/nvswitch/fabricmanager.cfg\0-g\x000x7425540300353de9\0",
        );
        // A later process of the same name (a helper it started): not the daemon.
        write(root, "proc/31099/comm", b"nvlsm\n");
        write(root, "proc/31099/cmdline", b"nvlsm\0");
        write(root, "proc/1/comm", b"systemd\n");
        write(root, "proc/self/comm", b"nvlsm\n");
        let f = probe(root);
        assert!(f.nvlsm_binary.unwrap().ends_with(NVLSM_BINARY));
        assert!(f.fm_binary.unwrap().ends_with(FM_BINARY));
        assert!(f.umad);
        let guid = Some(0x7425_5403_0035_3de9);
        assert_eq!(
            f.nvlsm,
            Some(Daemon {
                pid: 31060,
                port_guid: guid
            })
        );
        assert_eq!(
            f.fm,
            Some(Daemon {
                pid: 31082,
                port_guid: guid
            })
        );
    }

    #[test]
    fn guid_forms() {
        assert_eq!(port_guid(b"nvlsm\0--guid=0x10\0"), Some(16));
        assert_eq!(
            port_guid(b"nv-fabricmanager\0--fm-sm-mgmt-port-guid\x0042\0"),
            Some(42)
        );
        assert_eq!(port_guid(b"nvlsm\0-F\0x.conf\0"), None);
        assert_eq!(port_guid(b"nvlsm\0-g\0"), None);
        assert_eq!(port_guid(b"nvlsm\0-g\0zz\0"), None);
    }
}
