//! What `bind`, `unbind` and the hook's dry run print: one line per device, and the
//! sysfs writes of a dry run.

use crate::apply::binding_text;
use crate::{Reason, SessionReport};

fn reason_text(r: &Reason) -> String {
    match r {
        Reason::Named => "named".into(),
        Reason::OtherFunction(of) => format!("function of {of}"),
        Reason::GroupMember(of) => format!("IOMMU group of {of}"),
        Reason::BoundWith(of) => format!("bound with {of}"),
    }
}

/// One line per device (`BDF  before → after  (why)  /dev/vfio/N`); dry runs add the writes.
pub fn report_text(report: &SessionReport) -> String {
    let mut out = String::new();
    if report.devices.is_empty() {
        out.push_str("nothing to do\n");
    }
    for d in &report.devices {
        let after = match (&d.after, report.dry_run, d.writes.is_empty()) {
            (_, _, true) => "unchanged".to_string(),
            (Some(a), _, false) => binding_text(a),
            (None, _, false) => "(dry run)".to_string(),
        };
        out.push_str(&format!(
            "{}  {} → {}  ({})",
            d.bdf,
            binding_text(&d.before),
            after,
            reason_text(&d.reason)
        ));
        if let Some(g) = &d.vfio_group {
            out.push_str(&format!("  {g}"));
        }
        out.push('\n');
        if report.dry_run {
            for w in &d.writes {
                out.push_str(&format!("    {w}\n"));
            }
        }
    }
    out
}
