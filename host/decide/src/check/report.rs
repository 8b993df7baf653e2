//! The outcome of `check`: one result per check, and the exit code they imply.

use std::fmt;

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Not checked: the probe needs the live host (an embedded example, a snapshot file has
    /// none). Shown with what it would look at; it leaves the overall status and exit code alone.
    Skip,
    Pass,
    Warn,
    Fail,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Status::Skip => "skip",
            Status::Pass => "pass",
            Status::Warn => "warn",
            Status::Fail => "fail",
        })
    }
}

/// One check's outcome: what it looked at, what it saw, and the fix when not passing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckResult {
    pub check: &'static str,
    /// The GPU or group it concerns, if any.
    pub subject: Option<String>,
    pub status: Status,
    pub saw: String,
    pub fix: Option<String>,
}

/// All checks, with the process exit code they imply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckReport {
    pub checks: Vec<CheckResult>,
    pub status: Status,
}

impl CheckReport {
    pub(super) fn new(checks: Vec<CheckResult>) -> Self {
        let status = checks
            .iter()
            .map(|c| c.status)
            .filter(|s| *s != Status::Skip)
            .max()
            .unwrap_or(Status::Pass);
        CheckReport { checks, status }
    }

    /// Adds results checked elsewhere (a VM definition's cliques), updating the status.
    pub fn extend(&mut self, more: Vec<CheckResult>) {
        self.checks.extend(more);
        *self = CheckReport::new(std::mem::take(&mut self.checks));
    }

    /// 0 when everything checked passes (skipped rows do not count), 1 with warnings, 2
    /// with failures.
    pub fn exit_code(&self) -> u8 {
        match self.status {
            Status::Skip | Status::Pass => 0,
            Status::Warn => 1,
            Status::Fail => 2,
        }
    }
}

/// One check's outcome, for the rules.
pub(super) fn result(
    check: &'static str,
    subject: Option<String>,
    status: Status,
    saw: String,
    fix: Option<String>,
) -> CheckResult {
    CheckResult {
        check,
        subject,
        status,
        saw,
        fix,
    }
}
