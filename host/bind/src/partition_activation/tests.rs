use std::cell::RefCell;
use std::rc::Rc;

use super::*;
use vfio_p2p_fm_ffi::abi;

const T: Duration = Duration::from_secs(1);

fn b(s: &str) -> Bdf {
    s.parse().unwrap()
}

/// A sysfs writer and an FM that log into one shared list, so the order across both shows.
#[derive(Clone, Default)]
struct Log(Rc<RefCell<Vec<String>>>);

struct Sysfs(Log);
impl SysfsWriter for Sysfs {
    fn write(&mut self, _: &Path, file: &Path, value: &str) -> std::io::Result<()> {
        self.0
             .0
            .borrow_mut()
            .push(format!("{} < {value}", file.display()));
        Ok(())
    }
}

struct Fm {
    log: Log,
    sim: SimFabric,
    /// Runs after a successful activate (to break things in between).
    after_activate: Option<Box<dyn FnMut()>>,
}
impl PartitionWriter for Fm {
    fn activate(&mut self, id: u32) -> Result<(), FmError> {
        self.log.0.borrow_mut().push(format!("activate {id}"));
        self.sim.activate(id)?;
        if let Some(f) = &mut self.after_activate {
            f();
        }
        Ok(())
    }
    fn deactivate(&mut self, id: u32) -> Result<(), FmError> {
        self.log.0.borrow_mut().push(format!("deactivate {id}"));
        self.sim.deactivate(id)
    }
    fn set_activated(&mut self, ids: &[u32]) -> Result<(), FmError> {
        self.sim.set_activated(ids)
    }
}

fn fm(log: &Log) -> Fm {
    Fm {
        log: log.clone(),
        sim: SimFabric::default(),
        after_activate: None,
    }
}

/// A root whose two GPUs have a `reset` attribute and one has none.
fn root() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for gpu in ["0000:13:00.0", "0000:14:00.0", "0000:15:00.0"] {
        std::fs::create_dir_all(dir.path().join(device_dir(b(gpu)))).unwrap();
    }
    for gpu in ["0000:13:00.0", "0000:14:00.0"] {
        std::fs::write(dir.path().join(device_dir(b(gpu))).join("reset"), "").unwrap();
    }
    dir
}

const GPUS: [&str; 2] = ["0000:13:00.0", "0000:14:00.0"];

fn gpus() -> Vec<Bdf> {
    GPUS.iter().map(|g| b(g)).collect()
}

#[test]
fn gpus_are_reset_before_fm_activates_and_the_partition_is_recorded() {
    let (r, log) = (root(), Log::default());
    let (mut s, mut f) = (Sysfs(log.clone()), fm(&log));
    let rep = activate(r.path(), &mut s, &mut f, 3, &gpus(), Some("vm1"), T).unwrap();
    assert_eq!(
        *log.0.borrow(),
        [
            "sys/bus/pci/devices/0000:13:00.0/reset < 1",
            "sys/bus/pci/devices/0000:14:00.0/reset < 1",
            "activate 3"
        ]
    );
    assert_eq!(rep.resets.len(), 2);
    let rec = ActivationRecord::load(r.path()).unwrap();
    assert_eq!(rec.of_guest("vm1"), vec![3]);
    assert_eq!(rec.partitions[&3].gpus, gpus());
    // A repeated prepare for the same guest does nothing; another holder is refused.
    let again = activate(r.path(), &mut s, &mut f, 3, &gpus(), Some("vm1"), T).unwrap();
    assert!(again.already_active);
    assert_eq!(log.0.borrow().len(), 3);
    let e = activate(r.path(), &mut s, &mut f, 3, &gpus(), Some("vm2"), T).unwrap_err();
    assert!(e.to_string().contains("active for guest vm1"), "{e}");
}

#[test]
fn a_gpu_without_reset_is_noted_not_written() {
    let (r, log) = (root(), Log::default());
    let (mut s, mut f) = (Sysfs(log.clone()), fm(&log));
    let gpus = [b("0000:13:00.0"), b("0000:15:00.0")];
    let rep = activate(r.path(), &mut s, &mut f, 1, &gpus, None, T).unwrap();
    assert_eq!(rep.not_resettable, vec![b("0000:15:00.0")]);
    assert_eq!(rep.resets, vec![reset_write(b("0000:13:00.0"))]);
}

#[test]
fn fm_refusing_leaves_no_record() {
    let (r, log) = (root(), Log::default());
    let (mut s, mut f) = (Sysfs(log.clone()), fm(&log));
    f.sim.fail = Some((FmCall::Activate(3), abi::NVLINK_ERROR));
    let e = activate(r.path(), &mut s, &mut f, 3, &gpus(), Some("vm1"), T).unwrap_err();
    assert_eq!(e.fm_failure(), Some(FmFailure::Refused));
    assert!(e.to_string().contains("NVLink training failed"), "{e}");
    assert!(ActivationRecord::load(r.path())
        .unwrap()
        .partitions
        .is_empty());
}

#[test]
fn a_record_that_cannot_be_written_deactivates_again() {
    let (r, log) = (root(), Log::default());
    let (mut s, mut f) = (Sysfs(log.clone()), fm(&log));
    // Between FM's activation and the record's write, the record's place becomes a
    // directory: the write fails, and the activation is undone.
    let path = state::record_path(r.path());
    f.after_activate = Some(Box::new(move || std::fs::create_dir_all(&path).unwrap()));
    let e = activate(r.path(), &mut s, &mut f, 3, &gpus(), Some("vm1"), T).unwrap_err();
    assert!(matches!(e, ActivationError::Record(_)), "{e}");
    assert_eq!(log.0.borrow().last().unwrap(), "deactivate 3");
    assert!(f.sim.active.is_empty());
}

#[test]
fn deactivation_counts_not_active_as_done_and_keeps_what_failed() {
    let (r, log) = (root(), Log::default());
    let (mut s, mut f) = (Sysfs(log.clone()), fm(&log));
    activate(r.path(), &mut s, &mut f, 1, &gpus(), Some("vm1"), T).unwrap();
    activate(
        r.path(),
        &mut s,
        &mut f,
        2,
        &[b("0000:15:00.0")],
        Some("vm1"),
        T,
    )
    .unwrap();
    f.sim.active.remove(&1); // FM restarted and lost it
    f.sim.fail = Some((FmCall::Deactivate(2), abi::CONNECTION_NOT_VALID));
    let e = deactivate(r.path(), &mut f, &[1, 2], T).unwrap_err();
    assert_eq!(e.fm_failure(), Some(FmFailure::Unreachable));
    let rec = ActivationRecord::load(r.path()).unwrap();
    assert_eq!(rec.of_guest("vm1"), vec![2]);
    f.sim.fail = None;
    let done = deactivate(r.path(), &mut f, &[2], T).unwrap();
    assert_eq!(
        done,
        vec![Deactivated {
            partition: 2,
            was_inactive: false
        }]
    );
    assert!(ActivationRecord::load(r.path())
        .unwrap()
        .partitions
        .is_empty());
}

#[test]
fn resync_sends_every_recorded_partition_even_none() {
    let (r, log) = (root(), Log::default());
    let (mut s, mut f) = (Sysfs(log.clone()), fm(&log));
    assert_eq!(resync(r.path(), &mut f, T).unwrap(), Vec::<u32>::new());
    assert_eq!(f.sim.log, ["fmSetActivatedFabricPartitions"]);
    activate(r.path(), &mut s, &mut f, 4, &gpus(), Some("vm1"), T).unwrap();
    activate(r.path(), &mut s, &mut f, 2, &[b("0000:15:00.0")], None, T).unwrap();
    f.sim.active.clear(); // FM restarted
    assert_eq!(resync(r.path(), &mut f, T).unwrap(), vec![2, 4]);
    assert_eq!(f.sim.active, BTreeSet::from([2, 4]));
}
