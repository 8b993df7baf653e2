//! The host collector: takes guest reports off a [`Listener`], files each under the
//! domain that owns the sender's CID (never the name the guest claims), judges it against
//! that domain's plan and stores the record. A guest is not trusted: unknown CIDs are
//! dropped, each CID may send once per `min_interval`, each connection gets `max_bytes`
//! and `deadline`, and a fixed pool of workers with a bounded queue does the reading, so
//! the accept loop never waits on a guest: when all are busy a new connection is closed.

pub mod store;
pub mod transport;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use store::{valid_boot_id, Store};
use transport::Listener;
use vfio_p2p_decide::fleet_verdict::{judge, BandwidthFloors, DomainPlan, Record};
use vfio_p2p_read::guest_report::{read_report, ReportStream};

/// What one guest may cost the collector.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_bytes: usize,
    /// For the whole report, first byte to last.
    pub deadline: Duration,
    /// Connections read at once.
    pub workers: usize,
    /// Accepted connections waiting for a worker; beyond it they are closed.
    pub queue: usize,
    /// The shortest time between two connections from one CID.
    pub min_interval: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: vfio_p2p_contract::MAX_GUEST_REPORT_BYTES,
            deadline: Duration::from_secs(10),
            workers: 8,
            queue: 64,
            min_interval: Duration::from_secs(5),
        }
    }
}

/// What became of one connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Handled {
    Stored { domain: String, pass: bool },
    UnknownCid(u32),
    RateLimited(u32),
    Refused { cid: u32, reason: String },
    Busy(u32),
}

/// Counts since start, for logs, tests and benchmarks.
#[derive(Debug, Default)]
pub struct Counters {
    pub stored: AtomicU64,
    pub unknown_cid: AtomicU64,
    pub rate_limited: AtomicU64,
    pub refused: AtomicU64,
    pub busy: AtomicU64,
}

pub struct Collector {
    pub store: Store,
    pub limits: Limits,
    pub floors: BandwidthFloors,
    /// The Prometheus text of every domain's latest verdict, rewritten at most once per
    /// [`TEXTFILE_INTERVAL`] while records come in (from memory: no re-reading the store).
    pub textfile: Option<PathBuf>,
    pub counters: Counters,
    plans: Mutex<(Option<SystemTime>, HashMap<u32, DomainPlan>)>,
    last_seen: Mutex<HashMap<u32, Instant>>,
    /// Every domain's latest record, for the textfile (loaded from the store on first use).
    latest: Mutex<Option<BTreeMap<String, Record>>>,
    textfile_dirty: AtomicBool,
}

/// How often the textfile is rewritten at most.
pub const TEXTFILE_INTERVAL: Duration = Duration::from_secs(1);

impl Collector {
    pub fn new(store: Store, limits: Limits, floors: BandwidthFloors) -> Self {
        Collector {
            store,
            limits,
            floors,
            textfile: None,
            counters: Counters::default(),
            plans: Mutex::new((None, HashMap::new())),
            last_seen: Mutex::new(HashMap::new()),
            latest: Mutex::new(None),
            textfile_dirty: AtomicBool::new(false),
        }
    }

    /// The plan of the domain that owns `cid`, reloading the plans when they changed.
    fn plan_for(&self, cid: u32) -> anyhow::Result<Option<DomainPlan>> {
        let mut cache = self.plans.lock().expect("not poisoned");
        let stamp = self.store.plans_stamp();
        if cache.0.is_none() || cache.0 != stamp {
            let (plans, problems) = self.store.plans_by_cid()?;
            for p in problems {
                tracing::warn!("{p}");
            }
            *cache = (stamp, plans);
        }
        Ok(cache.1.get(&cid).cloned())
    }

    fn rate_limited(&self, cid: u32) -> bool {
        let mut seen = self.last_seen.lock().expect("not poisoned");
        let now = Instant::now();
        match seen.get(&cid) {
            Some(t) if now.duration_since(*t) < self.limits.min_interval => true,
            _ => {
                seen.insert(cid, now);
                false
            }
        }
    }

    /// Reads, judges and stores one connection's report.
    pub fn handle(&self, stream: &mut impl ReportStream, cid: u32) -> Handled {
        let plan = match self.plan_for(cid) {
            Ok(Some(p)) => p,
            Ok(None) => return Handled::UnknownCid(cid),
            Err(e) => return refused(cid, format!("plans unreadable: {e:#}")),
        };
        if self.rate_limited(cid) {
            return Handled::RateLimited(cid);
        }
        let report = match read_report(stream, self.limits.max_bytes, self.limits.deadline) {
            Ok(r) => r,
            Err(e) => return refused(cid, e.to_string()),
        };
        if !valid_boot_id(&report.boot_id) {
            return refused(
                cid,
                format!("boot_id {:?} is not a boot id", report.boot_id),
            );
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let record = judge(&plan, &report, self.floors, now);
        if let Err(e) = self.store.put_record(&record) {
            return refused(cid, format!("{e:#}"));
        }
        let stored = Handled::Stored {
            domain: record.domain.clone(),
            pass: record.problems.is_empty(),
        };
        self.remember(Some(record));
        stored
    }

    /// Notes `record` (or, with `None`, just the store's records) for the next textfile.
    fn remember(&self, record: Option<Record>) {
        if self.textfile.is_none() {
            return;
        }
        let mut latest = self.latest.lock().expect("not poisoned");
        let map = latest.get_or_insert_with(|| {
            let stored = self.store.latest_records().unwrap_or_else(|e| {
                tracing::warn!("{e:#}");
                Vec::new()
            });
            stored.into_iter().map(|r| (r.domain.clone(), r)).collect()
        });
        if let Some(r) = record {
            map.insert(r.domain.clone(), r);
        }
        self.textfile_dirty.store(true, Ordering::Release);
    }

    /// Rewrites the textfile (atomically) if a record came in since the last time.
    fn flush_textfile(&self) {
        let Some(path) = &self.textfile else { return };
        if !self.textfile_dirty.swap(false, Ordering::AcqRel) {
            return;
        }
        let records: Vec<Record> = {
            let latest = self.latest.lock().expect("not poisoned");
            latest.iter().flat_map(|m| m.values().cloned()).collect()
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            let _ = std::fs::create_dir_all(dir);
        }
        let text = vfio_p2p_emit::verdicts::prometheus(&records);
        if let Err(e) = vfio_p2p_files::write_atomic(path, text.as_bytes()) {
            tracing::warn!("writing {}: {e}", path.display());
        }
    }

    fn count(&self, h: &Handled) {
        let c = match h {
            Handled::Stored { .. } => &self.counters.stored,
            Handled::UnknownCid(_) => &self.counters.unknown_cid,
            Handled::RateLimited(_) => &self.counters.rate_limited,
            Handled::Refused { .. } => &self.counters.refused,
            Handled::Busy(_) => &self.counters.busy,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }
}

fn refused(cid: u32, reason: String) -> Handled {
    Handled::Refused { cid, reason }
}

fn log(h: &Handled) {
    match h {
        Handled::Stored { domain, pass } => tracing::debug!("stored {domain}: pass {pass}"),
        Handled::UnknownCid(c) => tracing::warn!("dropped a connection from unknown CID {c}"),
        Handled::RateLimited(c) => tracing::warn!("dropped CID {c}: sent again too soon"),
        Handled::Refused { cid, reason } => tracing::warn!("refused CID {cid}: {reason}"),
        Handled::Busy(c) => tracing::warn!("dropped CID {c}: every worker busy"),
    }
}

/// Serves `listener` until it closes (or fails), then waits for the workers.
/// `on_handled` sees every outcome (the `--wait`-free daemon logs them).
pub fn serve<L: Listener>(
    listener: &L,
    collector: Arc<Collector>,
    on_handled: impl Fn(&Handled) + Send + Sync + 'static,
) -> std::io::Result<()> {
    let (tx, rx) = sync_channel::<(L::Stream, u32)>(collector.limits.queue);
    let rx = Arc::new(Mutex::new(rx));
    let on_handled = Arc::new(on_handled);
    let workers: Vec<_> = (0..collector.limits.workers.max(1))
        .map(|_| {
            let (rx, c, f) = (rx.clone(), collector.clone(), on_handled.clone());
            std::thread::spawn(move || work(&rx, &c, &*f))
        })
        .collect();
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let flusher = {
        let c = collector.clone();
        c.remember(None);
        std::thread::spawn(move || {
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(TEXTFILE_INTERVAL) {
                c.flush_textfile();
            }
        })
    };
    let result = loop {
        match listener.accept() {
            Ok(Some((stream, cid))) => match tx.try_send((stream, cid)) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                    let h = Handled::Busy(cid);
                    collector.count(&h);
                    log(&h);
                    on_handled(&h);
                }
            },
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    drop(tx);
    for w in workers {
        let _ = w.join();
    }
    drop(stop);
    let _ = flusher.join();
    collector.flush_textfile();
    result
}

fn work<S: ReportStream>(
    rx: &Mutex<Receiver<(S, u32)>>,
    c: &Collector,
    on_handled: &(dyn Fn(&Handled) + Send + Sync),
) {
    loop {
        let next = rx.lock().expect("not poisoned").recv();
        let Ok((mut stream, cid)) = next else { return };
        let h = c.handle(&mut stream, cid);
        c.count(&h);
        log(&h);
        on_handled(&h);
    }
}
