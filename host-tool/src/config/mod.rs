//! Files the operator writes: parsed (syntax, unknown keys, types) then validated (meaning).

pub mod vm;
