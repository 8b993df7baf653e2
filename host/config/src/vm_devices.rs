//! vm.yaml's `disks:`, `network:` and `console:`: what a generated VM boots from, how it
//! reaches the network and where its serial console goes.
//!
//! Read like the rest of vm.yaml ([`super::vm`]): serde takes the keys and types with their
//! positions, [`devices`] checks the meaning and points at the offending line.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_saphyr::{Location, Spanned};

use super::FieldError;

/// A disk image's format, handed to the VMM (never probed: a raw image could pose as qcow2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskFormat {
    Qcow2,
    Raw,
}

impl DiskFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            DiskFormat::Qcow2 => "qcow2",
            DiskFormat::Raw => "raw",
        }
    }
}

/// How the guest sees a disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskBus {
    /// virtio-blk on pcie.0 (every Linux guest has the driver).
    #[default]
    Virtio,
    /// The q35 chipset's AHCI controller, for guests without virtio drivers.
    Sata,
}

/// One `disks:` entry as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskFile {
    pub path: Spanned<PathBuf>,
    #[serde(default)]
    pub format: Option<DiskFormat>,
    #[serde(default)]
    pub bus: Option<DiskBus>,
    #[serde(default)]
    pub readonly: bool,
}

/// A validated disk; the first one in the list boots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disk {
    pub path: PathBuf,
    pub format: DiskFormat,
    pub bus: DiskBus,
    pub readonly: bool,
    /// Where vm.yaml names it (for the error when the file is missing).
    pub at: Option<Location>,
}

impl Disk {
    /// A block device (`/dev/…`) rather than an image file.
    pub fn is_block_device(&self) -> bool {
        is_device_path(&self.path)
    }
}

/// How the VM's one virtio-net NIC reaches the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetMode {
    /// The VMM's user-mode NAT (QEMU's slirp/passt): no root, no inbound connections.
    User,
    /// A tap device in a host bridge (`bridge:`).
    Bridge,
    /// No NIC (the default).
    None,
}

/// `network:` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkFile {
    #[serde(default)]
    pub mode: Option<Spanned<NetMode>>,
    #[serde(default)]
    pub bridge: Option<Spanned<String>>,
    #[serde(default)]
    pub mac: Option<Spanned<String>>,
}

/// The VM's NIC (vm.yaml's `network:`), absent for `mode: none`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Network {
    User { mac: Option<String> },
    Bridge { bridge: String, mac: Option<String> },
}

impl Network {
    pub fn mac(&self) -> Option<&str> {
        match self {
            Network::User { mac } | Network::Bridge { mac, .. } => mac.as_deref(),
        }
    }
}

/// `console:` as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConsoleKind {
    /// The guest's first serial port (ttyS0) where the VMM's operator looks: the terminal
    /// for QEMU and Cloud Hypervisor, a pty for `virsh console`, `qm terminal` on Proxmox.
    #[default]
    Serial,
    /// The serial port on a UNIX socket (`console_socket:`).
    Socket,
    /// No serial port.
    None,
}

/// Where the guest's serial console goes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Console {
    #[default]
    Serial,
    /// A UNIX socket: `console_socket:`, or [`CONSOLE_SOCKET_DIR`]/NAME.sock.
    Socket(Option<PathBuf>),
    None,
}

impl Console {
    /// The socket of `console: socket` for the VM named `vm`.
    pub fn socket_path(&self, vm: &str) -> Option<PathBuf> {
        match self {
            Console::Socket(Some(p)) => Some(p.clone()),
            Console::Socket(None) => Some(Path::new(CONSOLE_SOCKET_DIR).join(format!("{vm}.sock"))),
            _ => None,
        }
    }
}

/// Where `console: socket` listens without `console_socket:`.
pub const CONSOLE_SOCKET_DIR: &str = "/run/vfio-p2p/console";

/// The most virtio disks: pcie.0 slots 0x03 to 0x06 (0x02 is the NIC's, 0x07 vsock's, the
/// guest layout starts at 0x08).
pub const MAX_VIRTIO_DISKS: usize = 4;
/// The q35 AHCI controller's ports.
pub const MAX_SATA_DISKS: usize = 6;

/// What the three keys give, validated.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GuestDevices {
    pub disks: Vec<Disk>,
    pub network: Option<Network>,
    pub console: Console,
    /// Where vm.yaml sets `network:` and `console_socket:` (for a VMM's refusal of them).
    pub network_at: Option<Location>,
    pub console_socket_at: Option<Location>,
}

/// `disks:`, `network:`, `console:` and `console_socket:` checked together.
pub fn devices(
    disks: Vec<DiskFile>,
    network: Option<Spanned<NetworkFile>>,
    console: Option<Spanned<ConsoleKind>>,
    console_socket: Option<Spanned<PathBuf>>,
) -> Result<GuestDevices, FieldError> {
    Ok(GuestDevices {
        network_at: network.as_ref().map(|n| n.referenced),
        console_socket_at: console_socket.as_ref().map(|p| p.referenced),
        disks: disk_list(disks)?,
        network: match network {
            Some(n) => network_of(n)?,
            None => None,
        },
        console: console_of(console, console_socket)?,
    })
}

fn disk_list(files: Vec<DiskFile>) -> Result<Vec<Disk>, FieldError> {
    let mut disks: Vec<Disk> = Vec::with_capacity(files.len());
    for f in files {
        let at = f.path.referenced;
        let path = f.path.value;
        if let Some(e) = super::config_path_error("disks: path", &path) {
            return Err(FieldError::new(&at, e));
        }
        if let Some(d) = disks.iter().find(|d| lexical(&d.path) == lexical(&path)) {
            let also = if d.path == path {
                String::new()
            } else {
                format!(" (as {})", d.path.display())
            };
            return Err(FieldError::new(
                &at,
                format!(
                    "disks: {} is listed twice{also}; a VMM refuses one image as two drives",
                    path.display()
                ),
            ));
        }
        let format = match f.format {
            Some(format) => format,
            None => format_from_name(&path).ok_or_else(|| {
                FieldError::new(
                    &at,
                    format!(
                        "disks: cannot tell the format of {} from its name: add `format: qcow2` or `format: raw` to this entry",
                        path.display()
                    ),
                )
            })?,
        };
        let bus = f.bus.unwrap_or_default();
        if f.readonly && bus == DiskBus::Sata {
            return Err(FieldError::new(
                &at,
                "disks: a SATA disk cannot be read-only (QEMU's ide-hd and libvirt refuse it): use `bus: virtio` for this one".into(),
            ));
        }
        disks.push(Disk {
            path,
            format,
            bus,
            readonly: f.readonly,
            at: Some(at),
        });
        let on = |bus| disks.iter().filter(|d| d.bus == bus).count();
        if on(DiskBus::Virtio) > MAX_VIRTIO_DISKS || on(DiskBus::Sata) > MAX_SATA_DISKS {
            return Err(FieldError::new(
                &at,
                format!("disks: at most {MAX_VIRTIO_DISKS} on bus virtio and {MAX_SATA_DISKS} on bus sata (the guest's pcie.0 slots and AHCI ports)"),
            ));
        }
    }
    Ok(disks)
}

/// The file systems under `/dev` that hold files, not devices (tmpfs and hugetlbfs mounts
/// of a standard Linux host: systemd's `dev-shm.mount`, `dev-hugepages.mount`,
/// `dev-mqueue.mount`; devpts).
const FILES_UNDER_DEV: [&str; 4] = ["/dev/shm", "/dev/hugepages", "/dev/mqueue", "/dev/pts"];

/// A path under `/dev` that names a device, not a file on one of its file systems.
fn is_device_path(path: &Path) -> bool {
    path.starts_with("/dev") && !FILES_UNDER_DEV.iter().any(|d| path.starts_with(d))
}

/// `path` with `.` and `..` resolved as written (no file system look-up): two names of one
/// image (`/img/a.qcow2`, `/img/../img/a.qcow2`) compare equal.
fn lexical(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out
}

/// `.qcow2` is qcow2; `.raw`, `.img` and block devices (`/dev/…`) are raw.
fn format_from_name(path: &Path) -> Option<DiskFormat> {
    if is_device_path(path) {
        return Some(DiskFormat::Raw);
    }
    match path.extension()?.to_str()? {
        "qcow2" => Some(DiskFormat::Qcow2),
        "raw" | "img" => Some(DiskFormat::Raw),
        _ => None,
    }
}

fn network_of(n: Spanned<NetworkFile>) -> Result<Option<Network>, FieldError> {
    let at = n.referenced;
    let n = n.value;
    let mac = match &n.mac {
        Some(m) => Some(mac_of(m)?),
        None => None,
    };
    let mode = match (&n.mode, &n.bridge) {
        (Some(m), _) => m.value,
        (None, Some(_)) => NetMode::Bridge,
        (None, None) => {
            return Err(FieldError::new(
                &at,
                "network: give `mode: user` (NAT, no root) or `bridge: NAME` (a host bridge such as br0), or `mode: none`".into(),
            ))
        }
    };
    match (mode, n.bridge) {
        (NetMode::Bridge, Some(b)) => {
            if let Some(e) = bridge_name_error(&b.value) {
                return Err(FieldError::new(&b.referenced, e));
            }
            Ok(Some(Network::Bridge {
                bridge: b.value,
                mac,
            }))
        }
        (NetMode::Bridge, None) => Err(FieldError::new(
            &at,
            "network: mode bridge needs `bridge: NAME`, the host bridge the VM's tap joins (br0; vmbr0 on Proxmox)".into(),
        )),
        (NetMode::User, Some(b)) | (NetMode::None, Some(b)) => Err(FieldError::new(
            &b.referenced,
            "network: bridge is only used with `mode: bridge`; remove it or set the mode".into(),
        )),
        (NetMode::User, None) => Ok(Some(Network::User { mac })),
        (NetMode::None, None) if mac.is_some() => Err(FieldError::new(
            &at,
            "network: mac is not used with `mode: none`; remove it".into(),
        )),
        (NetMode::None, None) => Ok(None),
    }
}

/// A Linux interface name: 1-15 bytes, no `/`, space or control character.
fn bridge_name_error(name: &str) -> Option<String> {
    let ok = !name.is_empty()
        && name.len() <= 15
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace() || c.is_control() || c == '\'');
    // ',' separates options in QEMU's -netdev and Proxmox's net0: (a name with it would
    // add options such as `link_down=1`), '=' and '"' likewise in their key=value lists.
    let separator = name.chars().find(|c| matches!(c, ',' | '=' | '"' | ';'));
    if let Some(c) = separator.filter(|_| ok) {
        return Some(format!("network: bridge {name:?} has {c:?}, which separates options in QEMU's -netdev and Proxmox's net0: and would change them; rename the bridge (1-15 letters, digits, '-', '_', '.')"));
    }
    (!ok).then(|| {
        format!("network: bridge {name:?} is not an interface name: use 1-15 characters, no '/', ':', quote or space (`ip link show type bridge` lists them)")
    })
}

/// A unicast MAC address, `52:54:00:12:34:56`, written back in lower case.
fn mac_of(m: &Spanned<String>) -> Result<String, FieldError> {
    let octets: Vec<Option<u8>> = m
        .value
        .split(':')
        .map(|o| {
            // from_str_radix takes a sign ("+5"): only two hex digits are an octet
            (o.len() == 2 && o.chars().all(|c| c.is_ascii_hexdigit()))
                .then(|| u8::from_str_radix(o, 16).ok())
                .flatten()
        })
        .collect();
    let bad = |why: &str| {
        FieldError::new(
            &m.referenced,
            format!(
                "network: mac {:?} {why}; give six hex octets such as 52:54:00:12:34:56 (52:54:00 is QEMU's prefix)",
                m.value
            ),
        )
    };
    if octets.len() != 6 || octets.iter().any(Option::is_none) {
        return Err(bad("is not a MAC address"));
    }
    let first = octets[0].unwrap_or(0);
    if first & 1 == 1 {
        return Err(bad("is a multicast address"));
    }
    if octets.iter().all(|o| *o == Some(0)) {
        return Err(bad("is all zeros"));
    }
    Ok(m.value.to_ascii_lowercase())
}

/// The longest path a UNIX socket can be bound to: `sun_path` is 108 bytes, NUL included
/// (unix(7)).
const MAX_SOCKET_PATH: usize = 107;

fn console_of(
    kind: Option<Spanned<ConsoleKind>>,
    socket: Option<Spanned<PathBuf>>,
) -> Result<Console, FieldError> {
    let kind = kind.map(|k| k.value).unwrap_or_default();
    match (kind, socket) {
        (ConsoleKind::Socket, Some(p)) => {
            let long = p.value.as_os_str().len() > MAX_SOCKET_PATH;
            let e = super::config_path_error("console_socket", &p.value).or_else(|| long.then(|| format!(
                "console_socket: {} is {} bytes, more than the {MAX_SOCKET_PATH} a UNIX socket's path holds (sun_path is 108 bytes with its NUL, unix(7)); give a shorter path",
                p.value.display(),
                p.value.as_os_str().len()
            )));
            match e {
                Some(e) => Err(FieldError::new(&p.referenced, e)),
                None => Ok(Console::Socket(Some(p.value))),
            }
        }
        (ConsoleKind::Socket, None) => Ok(Console::Socket(None)),
        (_, Some(p)) => Err(FieldError::new(
            &p.referenced,
            "console_socket is only used with 'console: socket'; remove it or set console".into(),
        )),
        (ConsoleKind::Serial, None) => Ok(Console::Serial),
        (ConsoleKind::None, None) => Ok(Console::None),
    }
}

#[cfg(test)]
mod tests {
    use super::super::vm::VmConfig;
    use super::*;

    fn parse(text: &str) -> Result<GuestDevices, String> {
        VmConfig::parse(text, Path::new("vm.yaml"))
            .map(|c| c.devices)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_are_a_serial_console_and_nothing_else() {
        let d = parse("name: a\n").unwrap();
        assert_eq!(d, GuestDevices::default());
        assert_eq!(d.console, Console::Serial);
    }

    #[test]
    fn disks_take_their_format_from_the_name_or_the_key() {
        let d = parse(
            "name: a\ndisks:\n  - path: /i/a.qcow2\n  - path: /i/b.img\n    bus: sata\n  - path: /dev/vdb\n    readonly: true\n  - path: /i/c.vhd\n    format: raw\n",
        )
        .unwrap();
        let got: Vec<(DiskFormat, DiskBus, bool)> = d
            .disks
            .iter()
            .map(|d| (d.format, d.bus, d.readonly))
            .collect();
        assert_eq!(
            got,
            [
                (DiskFormat::Qcow2, DiskBus::Virtio, false),
                (DiskFormat::Raw, DiskBus::Sata, false),
                (DiskFormat::Raw, DiskBus::Virtio, true),
                (DiskFormat::Raw, DiskBus::Virtio, false),
            ]
        );
        assert!(d.disks[2].is_block_device() && !d.disks[0].is_block_device());
    }

    #[test]
    fn network_modes() {
        let d = parse("name: a\nnetwork:\n  bridge: br0\n  mac: 52:54:00:AB:cd:01\n").unwrap();
        assert_eq!(
            d.network,
            Some(Network::Bridge {
                bridge: "br0".into(),
                mac: Some("52:54:00:ab:cd:01".into())
            })
        );
        let d = parse("name: a\nnetwork: {mode: user}\n").unwrap();
        assert_eq!(d.network, Some(Network::User { mac: None }));
        assert_eq!(
            parse("name: a\nnetwork: {mode: none}\n").unwrap().network,
            None
        );
    }

    #[test]
    fn console_socket_defaults_to_the_vm_name() {
        let d = parse("name: a\nconsole: socket\n").unwrap();
        assert_eq!(
            d.console.socket_path("a"),
            Some(PathBuf::from("/run/vfio-p2p/console/a.sock"))
        );
        let d = parse("name: a\nconsole: socket\nconsole_socket: /run/x.sock\n").unwrap();
        assert_eq!(d.console, Console::Socket(Some("/run/x.sock".into())));
        assert_eq!(
            parse("name: a\nconsole: none\n").unwrap().console,
            Console::None
        );
        let long = format!("/run/{}.sock", "x".repeat(102));
        assert_eq!(long.len(), 112);
        let e = parse(&format!(
            "name: a\nconsole: socket\nconsole_socket: {long}\n"
        ))
        .unwrap_err();
        assert!(
            e.contains("is 112 bytes, more than the 107 a UNIX socket's path holds"),
            "{e}"
        );
        let fits = format!("/run/{}.sock", "x".repeat(97));
        assert!(parse(&format!(
            "name: a\nconsole: socket\nconsole_socket: {fits}\n"
        ))
        .is_ok());
    }

    #[test]
    fn files_on_dev_shm_are_images_not_block_devices() {
        let d = parse("name: a\ndisks:\n  - path: /dev/shm/x.qcow2\n  - path: /dev/vdb\n").unwrap();
        assert_eq!(d.disks[0].format, DiskFormat::Qcow2);
        assert!(!d.disks[0].is_block_device());
        assert!(d.disks[1].is_block_device());
        assert_eq!(d.disks[1].format, DiskFormat::Raw);
    }

    /// Each rule, with the line and column it points at.
    #[test]
    fn errors_name_the_line_and_the_fix() {
        let five_virtio: String = (0..5).map(|i| format!("  - path: /i/{i}.raw\n")).collect();
        let seven_sata: String = (0..7)
            .map(|i| format!("  - path: /i/{i}.raw\n    bus: sata\n"))
            .collect();
        let cases = [
            ("name: a\ndisks:\n  - path: i.qcow2\n", "vm.yaml:3:11: disks: path: \"i.qcow2\" must be an absolute path"),
            ("name: a\ndisks:\n  - path: /i/a.vhd\n", "vm.yaml:3:11: disks: cannot tell the format of /i/a.vhd from its name: add `format: qcow2`"),
            ("name: a\ndisks:\n  - path: /i/a.raw\n  - path: /i/a.raw\n", "vm.yaml:4:11: disks: /i/a.raw is listed twice"),
            ("name: a\ndisks:\n  - path: /i/a.raw\n    bus: sata\n    readonly: true\n", "vm.yaml:3:11: disks: a SATA disk cannot be read-only"),
            ("name: a\ndisks:\n  - path: /i/a.raw\n    size: 4G\n", "vm.yaml:4:5: unknown field `size`"),
            ("name: a\ndisks:\n  - path: /i/a.raw\n    bus: ide\n", "vm.yaml:4:10: unknown variant `ide`"),
            ("name: a\nnetwork: {}\n", "vm.yaml:2:10: network: give `mode: user`"),
            ("name: a\nnetwork:\n  mode: bridge\n", "vm.yaml:3:3: network: mode bridge needs `bridge: NAME`"),
            ("name: a\nnetwork:\n  mode: user\n  bridge: br0\n", "vm.yaml:4:11: network: bridge is only used with `mode: bridge`"),
            ("name: a\nnetwork:\n  bridge: br0/x\n", "vm.yaml:3:11: network: bridge \"br0/x\" is not an interface name"),
            ("name: a\nnetwork:\n  bridge: a-bridge-too-long\n", "vm.yaml:3:11: network: bridge \"a-bridge-too-long\" is not an interface name"),
            ("name: a\nnetwork:\n  bridge: br0\n  mac: 52:54:00:12:34\n", "vm.yaml:4:8: network: mac \"52:54:00:12:34\" is not a MAC address"),
            ("name: a\nnetwork:\n  bridge: br0\n  mac: 52:54:00:12:34:+5\n", "vm.yaml:4:8: network: mac \"52:54:00:12:34:+5\" is not a MAC address"),
            ("name: a\nnetwork:\n  bridge: v,link_down=1\n", "vm.yaml:3:11: network: bridge \"v,link_down=1\" has ',', which separates options"),
            ("name: a\ndisks:\n  - path: /img/a.qcow2\n  - path: /img/../img/a.qcow2\n", "vm.yaml:4:11: disks: /img/../img/a.qcow2 is listed twice (as /img/a.qcow2)"),
            ("name: a\nnetwork:\n  bridge: br0\n  mac: 01:00:5e:00:00:01\n", "vm.yaml:4:8: network: mac \"01:00:5e:00:00:01\" is a multicast address"),
            ("name: a\nnetwork:\n  bridge: br0\n  mac: 00:00:00:00:00:00\n", "vm.yaml:4:8: network: mac \"00:00:00:00:00:00\" is all zeros"),
            ("name: a\nnetwork:\n  mode: none\n  mac: 52:54:00:12:34:56\n", "vm.yaml:3:3: network: mac is not used with `mode: none`"),
            ("name: a\nconsole_socket: /run/c.sock\n", "vm.yaml:2:17: console_socket is only used with 'console: socket'"),
            ("name: a\nconsole: socket\nconsole_socket: c.sock\n", "vm.yaml:3:17: console_socket: \"c.sock\" must be an absolute path"),
            ("name: a\nconsole: tty\n", "vm.yaml:2:10: unknown variant `tty`"),
        ];
        for (text, want) in cases {
            let e = parse(text).unwrap_err();
            // serde's own errors repeat the position after it
            let (at, message) = want.split_at(want.find(": ").unwrap() + 2);
            assert!(
                e.starts_with(at) && e.contains(message),
                "{text:?}: got {e}"
            );
        }
        let e = parse(&format!("name: a\ndisks:\n{five_virtio}")).unwrap_err();
        assert!(
            e.starts_with("vm.yaml:7:11: disks: at most 4 on bus virtio"),
            "{e}"
        );
        let e = parse(&format!("name: a\ndisks:\n{seven_sata}")).unwrap_err();
        assert!(
            e.starts_with("vm.yaml:15:11: disks: at most 4 on bus virtio and 6 on bus sata"),
            "{e}"
        );
    }
}
