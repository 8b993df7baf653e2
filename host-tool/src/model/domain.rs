//! A libvirt domain's facts as `read::domain_xml` reads them; decide and emit use them
//! from here (the read stage defines them, as it does the host bridge ids).

pub use crate::read::domain_facts::*;
