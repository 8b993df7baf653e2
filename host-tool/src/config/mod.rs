//! Files the operator writes: parsed (syntax, unknown keys, types) then validated (meaning).

pub mod host;
pub mod vm;

use pci_config::Bdf;
use serde_saphyr::{Location, Spanned};

use crate::model::PathKind;

/// A value that failed validation: where it is and what to write instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub at: Location,
    pub message: String,
}

impl FieldError {
    fn new(at: &Location, message: String) -> Self {
        FieldError { at: *at, message }
    }
}

/// A list of BDFs under `key`, each parsed and listed once.
pub fn bdf_list(key: &str, items: &[Spanned<String>]) -> Result<Vec<Bdf>, FieldError> {
    let mut list = Vec::with_capacity(items.len());
    for item in items {
        let bdf: Bdf = item
            .value
            .parse()
            .map_err(|e| FieldError::new(&item.referenced, format!("{key}: {e}")))?;
        if list.contains(&bdf) {
            return Err(FieldError::new(
                &item.referenced,
                format!("{key}: {bdf} is listed twice"),
            ));
        }
        list.push(bdf);
    }
    Ok(list)
}

/// A `p2p_level` value: pix, pxb, phb, node or sys.
pub fn p2p_level(level: &Spanned<String>) -> Result<PathKind, FieldError> {
    match level.value.parse() {
        Err(e) => Err(FieldError::new(
            &level.referenced,
            format!("p2p_level: {e}"),
        )),
        Ok(PathKind::X) => Err(FieldError::new(
            &level.referenced,
            "p2p_level: 'x' means a GPU with itself; use pix, pxb, phb, node or sys".into(),
        )),
        Ok(kind) => Ok(kind),
    }
}

/// A VM name usable as a libvirt domain name and a file name (`NAME.yaml`).
pub fn is_valid_vm_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && !name.starts_with(['-', '.'])
}
