//! The transactional writer: moves devices between drivers the kernel's way
//! (`driver_override`, `driver/unbind`, `drivers_probe` or `drivers/NAME/bind`), re-reads
//! each device afterwards, and on any failure moves every device it already touched
//! back to its original driver and `driver_override`, newest first.

use std::fmt;
use std::fs::OpenOptions;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use pci_config::Bdf;
use serde::Serialize;

use super::bind_plan::{is_vfio_driver, Target, VFIO_PCI};
use super::state::ResetChange;
use vfio_p2p_read::binding::{device_dir, driver_dir, read_binding, read_reset_method};
use vfio_p2p_read::Binding;

/// Writes sysfs attribute files. The real one writes files; tests use one that also
/// plays the kernel's part (moving the `driver` link) and can fail on purpose.
pub trait SysfsWriter {
    /// Writes `value` to `file` (relative to `root`).
    fn write(&mut self, root: &Path, file: &Path, value: &str) -> io::Result<()>;
}

/// Plain writes to existing files (sysfs attributes are never created).
#[derive(Debug, Default)]
pub struct FileWriter;

impl SysfsWriter for FileWriter {
    fn write(&mut self, root: &Path, file: &Path, value: &str) -> io::Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(root.join(file))?;
        f.write_all(value.as_bytes())
    }
}

/// Test hook (`VFIO_P2P_FAIL_AFTER=N`): the N-th write (counting from 1) fails, so
/// rollback can be tested on a real kernel.
#[derive(Debug)]
pub struct FailAt<W> {
    pub inner: W,
    pub fail_at: usize,
    written: usize,
}

impl<W> FailAt<W> {
    pub fn new(inner: W, fail_at: usize) -> Self {
        FailAt {
            inner,
            fail_at,
            written: 0,
        }
    }
}

impl<W: SysfsWriter> SysfsWriter for FailAt<W> {
    fn write(&mut self, root: &Path, file: &Path, value: &str) -> io::Result<()> {
        self.written += 1;
        if self.written == self.fail_at {
            return Err(io::Error::other(format!(
                "injected failure of sysfs write {} (VFIO_P2P_FAIL_AFTER={})",
                self.written, self.fail_at
            )));
        }
        self.inner.write(root, file, value)
    }
}

/// One sysfs write: `value` into `file` (relative to the sysfs root).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SysfsWrite {
    pub file: PathBuf,
    pub value: String,
}

impl fmt::Display for SysfsWrite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = if self.value == "\n" {
            "''".to_string()
        } else {
            self.value.clone()
        };
        write!(f, "echo {shown} > /{}", self.file.display())
    }
}

/// The writes that take a device from `before` to `target`, in order, given the
/// kernel's rules: a driver only binds when `driver_override` (if set) names it;
/// unbinding is by writing the address to `driver/unbind`.
pub fn writes_for(bdf: Bdf, before: &Binding, target: &Target) -> Vec<SysfsWrite> {
    let dev = device_dir(bdf);
    let (want_override, want_driver): (Option<&str>, Option<Option<&str>>) = match target {
        Target::Vfio | Target::VfioVariant { .. } => {
            let d = target.vfio_driver();
            (d, Some(d))
        }
        Target::Exactly(b) => (b.driver_override.as_deref(), Some(b.driver.as_deref())),
        Target::HostDefault => (None, None),
    };
    let mut out = Vec::new();
    if before.driver_override.as_deref() != want_override {
        out.push(SysfsWrite {
            file: dev.join("driver_override"),
            value: want_override.map_or("\n".to_string(), str::to_string),
        });
    }
    let current = before.driver.as_deref();
    let unbind = match want_driver {
        Some(want) => current.is_some() && current != want,
        None => is_vfio_driver(current),
    };
    if unbind {
        out.push(SysfsWrite {
            file: dev.join("driver/unbind"),
            value: bdf.to_string(),
        });
    }
    let unbound = unbind || current.is_none();
    if unbound {
        match want_driver {
            Some(Some(d)) if want_override.is_none() => out.push(SysfsWrite {
                file: driver_dir(d).join("bind"),
                value: bdf.to_string(),
            }),
            Some(None) => {}
            _ => out.push(SysfsWrite {
                file: PathBuf::from("sys/bus/pci/drivers_probe"),
                value: bdf.to_string(),
            }),
        }
    }
    out
}

/// The write that sets a device's `reset_method` to `methods` (space-separated; a bare
/// newline for none, as a write of nothing would not reach the kernel).
pub fn reset_write(bdf: Bdf, methods: &str) -> SysfsWrite {
    SysfsWrite {
        file: device_dir(bdf).join("reset_method"),
        value: match methods.trim() {
            "" => "\n".to_string(),
            m => m.to_string(),
        },
    }
}

/// Whether `now` is where `target` wanted the device.
fn reached(now: &Binding, target: &Target) -> bool {
    match target {
        Target::Vfio | Target::VfioVariant { .. } => now.driver.as_deref() == target.vfio_driver(),
        Target::Exactly(b) => now == b,
        Target::HostDefault => {
            now.driver_override.is_none() && !is_vfio_driver(now.driver.as_deref())
        }
    }
}

fn target_text(target: &Target) -> String {
    match target {
        Target::Vfio => format!("bound to {VFIO_PCI}"),
        Target::VfioVariant { driver } => format!("bound to {driver}"),
        Target::Exactly(b) => format!("back on {}", binding_text(b)),
        Target::HostDefault => format!("off {VFIO_PCI} with driver_override cleared"),
    }
}

pub fn binding_text(b: &Binding) -> String {
    let driver = b.driver.as_deref().unwrap_or("no driver");
    match &b.driver_override {
        Some(o) => format!("{driver} (driver_override {o})"),
        None => driver.to_string(),
    }
}

/// A device the transaction failed on.
#[derive(Debug, thiserror::Error)]
pub enum MoveError {
    #[error("{bdf}: writing {value:?} to /{file}: {source}")]
    Write {
        bdf: Bdf,
        file: PathBuf,
        value: String,
        source: io::Error,
    },
    #[error("{bdf}: after writing /{file} the device is on {found}, expected it {expected}")]
    NotReached {
        bdf: Bdf,
        file: PathBuf,
        found: String,
        expected: String,
    },
    #[error("{bdf}: reading its binding: {message}")]
    Read { bdf: Bdf, message: String },
}

impl MoveError {
    pub fn bdf(&self) -> Bdf {
        match self {
            MoveError::Write { bdf, .. }
            | MoveError::NotReached { bdf, .. }
            | MoveError::Read { bdf, .. } => *bdf,
        }
    }
}

/// A failed transaction: what failed, and how the rollback went.
#[derive(Debug, thiserror::Error)]
pub struct TransactionError {
    pub failed: MoveError,
    /// Devices that were moved back to their original state.
    pub restored: Vec<Bdf>,
    /// Devices the rollback could not restore (the host is NOT as it was for these).
    pub rollback_failures: Vec<MoveError>,
}

impl fmt::Display for TransactionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.failed)?;
        if self.rollback_failures.is_empty() {
            if !self.restored.is_empty() {
                let list: Vec<String> = self.restored.iter().map(Bdf::to_string).collect();
                write!(
                    f,
                    "; rolled back: {} restored to their original driver, driver_override and reset_method",
                    list.join(", ")
                )?;
            }
            Ok(())
        } else {
            let list: Vec<String> = self
                .rollback_failures
                .iter()
                .map(ToString::to_string)
                .collect();
            write!(
                f,
                "; ROLLBACK INCOMPLETE, restore these by hand (driver_override, driver/unbind, drivers_probe): {}",
                list.join("; ")
            )
        }
    }
}

/// What a transaction did to one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Moved {
    pub bdf: Bdf,
    pub before: Binding,
    pub after: Binding,
    pub writes: Vec<SysfsWrite>,
}

/// Moves devices one after another; remembers each one's state before its first write.
pub struct Transaction<'a, W: SysfsWriter> {
    root: &'a Path,
    writer: &'a mut W,
    touched: Vec<(Bdf, Binding)>,
    /// `reset_method`s changed, with what they were.
    touched_resets: Vec<(Bdf, Vec<String>)>,
}

impl<'a, W: SysfsWriter> Transaction<'a, W> {
    pub fn new(root: &'a Path, writer: &'a mut W) -> Self {
        Transaction {
            root,
            writer,
            touched: Vec::new(),
            touched_resets: Vec::new(),
        }
    }

    fn read(&self, bdf: Bdf) -> Result<Binding, MoveError> {
        read_binding(self.root, bdf).map_err(|e| MoveError::Read {
            bdf,
            message: e.to_string(),
        })
    }

    /// One write through the writer; a failure names the device, the file and the value.
    fn write(&mut self, bdf: Bdf, w: &SysfsWrite) -> Result<(), MoveError> {
        self.writer
            .write(self.root, &w.file, &w.value)
            .map_err(|source| MoveError::Write {
                bdf,
                file: w.file.clone(),
                value: w.value.clone(),
                source,
            })
    }

    /// Moves one device to `target` and checks that it got there.
    fn move_device(&mut self, bdf: Bdf, target: &Target, log: bool) -> Result<Moved, MoveError> {
        let before = self.read(bdf)?;
        let writes = writes_for(bdf, &before, target);
        if log && !writes.is_empty() {
            self.touched.push((bdf, before.clone()));
        }
        for w in &writes {
            self.write(bdf, w)?;
        }
        let after = self.read(bdf)?;
        if !reached(&after, target) {
            return Err(MoveError::NotReached {
                bdf,
                file: writes
                    .last()
                    .map(|w| w.file.clone())
                    .unwrap_or_else(|| device_dir(bdf)),
                found: binding_text(&after),
                expected: target_text(target),
            });
        }
        Ok(Moved {
            bdf,
            before,
            after,
            writes,
        })
    }

    /// Sets one device's `reset_method` to `methods` and checks that the kernel took it.
    fn set_reset(&mut self, bdf: Bdf, methods: &str, log: bool) -> Result<Moved, MoveError> {
        let read = |t: &Self| {
            read_reset_method(t.root, bdf).map_err(|e| MoveError::Read {
                bdf,
                message: e.to_string(),
            })
        };
        let was = read(self)?;
        let binding = self.read(bdf)?;
        let w = reset_write(bdf, methods);
        if log {
            self.touched_resets.push((bdf, was));
        }
        self.write(bdf, &w)?;
        let now = read(self)?;
        if now.join(" ") != methods.trim() {
            return Err(MoveError::NotReached {
                bdf,
                file: w.file,
                found: format!("reset_method {:?}", now.join(" ")),
                expected: format!("reset_method {methods:?}"),
            });
        }
        Ok(Moved {
            bdf,
            before: binding.clone(),
            after: binding,
            writes: vec![w],
        })
    }

    /// Moves every device to its target, or none: on failure, every device already
    /// touched goes back to its original binding, the last one first.
    pub fn run(self, moves: &[(Bdf, Target)]) -> Result<Vec<Moved>, Box<TransactionError>> {
        self.run_with_resets(moves, &[])
    }

    /// [`Self::run`], then each `reset_method` change; a failure anywhere also puts the
    /// reset methods already changed back.
    pub fn run_with_resets(
        mut self,
        moves: &[(Bdf, Target)],
        resets: &[(Bdf, ResetChange)],
    ) -> Result<Vec<Moved>, Box<TransactionError>> {
        let mut done = Vec::new();
        for (bdf, target) in moves {
            match self.move_device(*bdf, target, true) {
                Ok(m) => done.push(m),
                Err(failed) => return Err(Box::new(self.roll_back(failed))),
            }
        }
        for (bdf, change) in resets {
            match self.set_reset(*bdf, &change.set, true) {
                Ok(m) => done.push(m),
                Err(failed) => return Err(Box::new(self.roll_back(failed))),
            }
        }
        Ok(done)
    }

    fn roll_back(mut self, failed: MoveError) -> TransactionError {
        let mut restored = Vec::new();
        let mut rollback_failures = Vec::new();
        for (bdf, was) in std::mem::take(&mut self.touched_resets).into_iter().rev() {
            match self.set_reset(bdf, &was.join(" "), false) {
                Ok(_) if !restored.contains(&bdf) => restored.push(bdf),
                Ok(_) => {}
                Err(e) => rollback_failures.push(e),
            }
        }
        let touched = std::mem::take(&mut self.touched);
        for (bdf, original) in touched.into_iter().rev() {
            match self.move_device(bdf, &Target::Exactly(original), false) {
                Ok(_) if !restored.contains(&bdf) => restored.push(bdf),
                Ok(_) => {}
                Err(e) => rollback_failures.push(e),
            }
        }
        TransactionError {
            failed,
            restored,
            rollback_failures,
        }
    }
}
