//! Parsers for the text of sysfs attribute files. Shared by the live reader and
//! the flat-JSON snapshot import, so both read the same way.

use std::path::Path;

use vfio_p2p_model::record::Resource;

/// `0x10de\n` → 0x10de.
pub fn hex_u32(text: &str) -> Option<u32> {
    let t = text.trim();
    let digits = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X"))?;
    u32::from_str_radix(digits, 16).ok()
}

pub fn hex_u16(text: &str) -> Option<u16> {
    hex_u32(text).and_then(|v| u16::try_from(v).ok())
}

/// Linux's most NUMA nodes (`MAX_NUMNODES` with the largest `NODES_SHIFT`, 10).
pub const MAX_NUMA_NODES: i64 = 1024;

/// `numa_node`: `-1` means "no NUMA information", which is not an error; a node number
/// the kernel cannot have (4294967295, say) is.
pub fn numa_node(text: &str) -> Result<Option<u32>, String> {
    match text.trim().parse::<i64>() {
        Ok(-1) => Ok(None),
        Ok(n) if (0..MAX_NUMA_NODES).contains(&n) => Ok(Some(n as u32)),
        _ => Err(format!(
            "unexpected content {:?} (a node number below {MAX_NUMA_NODES}, or -1)",
            text.trim()
        )),
    }
}

pub fn decimal_u8(text: &str) -> Option<u8> {
    text.trim().parse().ok()
}

/// `resource`: one `start end flags` line per BAR/window, all hex.
pub fn resources(text: &str) -> Option<Vec<Resource>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let mut it = l.split_whitespace().map(hex_u64);
            let r = Resource {
                start: it.next()??,
                end: it.next()??,
                flags: it.next()??,
            };
            it.next().is_none().then_some(r)
        })
        .collect()
}

fn hex_u64(f: &str) -> Option<u64> {
    u64::from_str_radix(f.strip_prefix("0x")?, 16).ok()
}

/// `reset_method`: space-separated names (`flr bus`), empty when none.
pub fn reset_method(text: &str) -> Vec<String> {
    text.split_whitespace().map(str::to_string).collect()
}

/// The driver a device's `driver` link names: the kernel links it to
/// `…/bus/pci/drivers/NAME`, so a target whose parent is not `drivers` (a link to itself,
/// to the device, anywhere else) names no driver; `Err` says what it points at.
pub fn driver_link(target: &Path) -> Result<String, String> {
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned());
    let parent = target.parent().and_then(Path::file_name);
    match name {
        Some(n) if parent.is_some_and(|p| p == "drivers") && !n.is_empty() => Ok(n),
        _ => Err(format!(
            "points at {}, not at a driver (…/bus/pci/drivers/NAME): no driver read",
            target.display()
        )),
    }
}

/// `driver_override`: `(null)` when unset.
pub fn driver_override(text: &str) -> Option<String> {
    let t = text.trim();
    (!t.is_empty() && t != "(null)").then(|| t.to_string())
}

/// A CPU list such as `0-15,32-47` is kept as text, but must look like one.
pub fn cpulist(text: &str) -> Option<String> {
    let t = text.trim();
    let ok = t.split(',').all(|r| {
        let mut it = r.splitn(2, '-');
        it.all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    });
    (ok || t.is_empty()).then(|| t.to_string())
}

/// `current_link_speed` (`16.0 GT/s PCIe`); `Unknown` (no link) is kept as absent.
pub fn link_speed(text: &str) -> Option<String> {
    let t = text.trim();
    pci_config::LinkSpeed::from_sysfs(t).map(|_| t.to_string())
}

/// The kernel's text for a link speed code (`pci_speed_string`): 4 → `16.0 GT/s PCIe`;
/// `None` where the kernel prints `Unknown`.
pub fn link_speed_text(code: u8) -> Option<String> {
    let gts =
        ["2.5", "5.0", "8.0", "16.0", "32.0", "64.0"].get(usize::from(code).checked_sub(1)?)?;
    Some(format!("{gts} GT/s PCIe"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sysfs_text() {
        assert_eq!(hex_u16("0x10de\n"), Some(0x10de));
        assert_eq!(hex_u16("10de"), None);
        assert_eq!(hex_u16("0x110de"), None);
        assert_eq!(hex_u32("0x030200\n"), Some(0x030200));
        assert_eq!(numa_node("-1\n"), Ok(None));
        assert_eq!(numa_node("1"), Ok(Some(1)));
        assert!(numa_node("x").is_err());
        assert_eq!(driver_override("(null)\n"), None);
        assert_eq!(cpulist("0-15,32-47\n").as_deref(), Some("0-15,32-47"));
        assert_eq!(cpulist("0-a"), None);
        assert_eq!(reset_method("flr bus\n"), ["flr", "bus"]);
        let r = resources(
            "0x00000000fd000000 0x00000000fdffffff 0x0000000000040200\n0x0000000000000000 0x0000000000000000 0x0000000000000000\n",
        )
        .unwrap();
        assert_eq!(r[0].size(), 16 << 20);
        assert!(r[0].is_memory());
        assert_eq!(r[1].size(), 0);
        assert_eq!(resources("0x0 0x1"), None);
        assert_eq!(link_speed("Unknown\n"), None);
        assert_eq!(link_speed_text(4).as_deref(), Some("16.0 GT/s PCIe"));
        assert_eq!(link_speed_text(0), None);
        assert_eq!(link_speed_text(7), None);
        assert_eq!(
            link_speed("32.0 GT/s PCIe\n").as_deref(),
            Some("32.0 GT/s PCIe")
        );
    }
}
