//! Human-readable rendering of a [`CheckReport`].

use comfy_table::{presets::UTF8_BORDERS_ONLY, Table};

use crate::decide::check::CheckReport;

/// One row per check: status, check, subject, what it saw, the fix.
pub fn table(r: &CheckReport) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY)
        .set_header(vec!["status", "check", "device", "saw", "fix"]);
    for c in &r.checks {
        t.add_row(vec![
            c.status.to_string(),
            c.check.to_string(),
            c.subject.clone().unwrap_or_default(),
            c.saw.clone(),
            c.fix.clone().unwrap_or_default(),
        ]);
    }
    format!("{t}\noverall: {}\n", r.status)
}
