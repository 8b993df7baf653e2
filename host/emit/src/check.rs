//! Human-readable rendering of a [`CheckReport`]: a table that fits the terminal, then
//! the fixes, one per line, whose commands are never broken so they run as printed.

use vfio_p2p_decide::check::{CheckReport, Status};

/// One row per check (status, check, subject, what it saw), then a numbered fix for each
/// check that did not pass (one number per distinct fix, however many rows it fixes), then
/// the overall status.
pub fn table(r: &CheckReport) -> String {
    let mut t = vfio_p2p_style::table(vec!["status", "check", "device", "saw", "fix"]);
    let mut fixes = Vec::new();
    for c in &r.checks {
        let fix_ref = match (&c.fix, c.status) {
            (Some(fix), Status::Skip | Status::Warn | Status::Fail) => {
                let n = match fixes.iter().position(|f| f == fix) {
                    Some(i) => i + 1,
                    None => {
                        fixes.push(fix.clone());
                        fixes.len()
                    }
                };
                format!("[{n}]")
            }
            _ => String::new(),
        };
        let tone = match c.status {
            Status::Skip | Status::Pass => vfio_p2p_style::Tone::Plain,
            Status::Warn => vfio_p2p_style::Tone::Warn,
            Status::Fail => vfio_p2p_style::Tone::Fail,
        };
        let row = vec![
            c.status.to_string(),
            c.check.to_string(),
            c.subject.clone().unwrap_or_default(),
            c.saw.clone(),
            fix_ref,
        ];
        t.add_row(vfio_p2p_style::toned_row(row, tone));
    }
    let width = vfio_p2p_style::output_width();
    let mut out = format!("{t}\n");
    for (i, fix) in fixes.iter().enumerate() {
        out += &vfio_p2p_style::wrap(&format!("fix [{}]: {fix}", i + 1), width);
    }
    out + &format!("overall: {}\n", r.status)
}
