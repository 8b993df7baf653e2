//! A VMM's refusal of a VM definition, decided before anything is rendered: why, and the
//! vm.yaml line it is about.

use serde_saphyr::Location;

/// `why` and where in vm.yaml (`None`: not from a line of vm.yaml).
#[derive(Debug, PartialEq, Eq)]
pub struct Refusal<W> {
    pub at: Option<Location>,
    pub why: W,
}
