//! The GPU kernels, shipped as PTX inside the binary.
//!
//! Guests often have the driver but no CUDA toolkit, so the kernels are PTX text that
//! the driver's JIT compiles for whatever GPU it finds: only libcuda is needed.

use vfio_p2p_cuda_driver::{CudaError, Gpu, KernelEntry, Module, ParamType};

/// The PTX module with every kernel (see the comments in the file for their C equivalents).
pub const PTX: &str = include_str!("p2p.ptx");

/// Flag polls of a ping-pong wait between two checks of its give-up counter: the
/// polls of one round are written out in the PTX, so the counter costs one add and
/// compare per this many polls rather than per poll.
pub const POLLS_PER_CHECK: u64 = 16;

/// The kernels of [`PTX`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// Ping side of the flag ping-pong over a pass of flag places: writes the peer's
    /// flag, waits for its own, and stamps each place's start and end.
    Ping,
    /// Pong side: waits for its own flag, then writes the peer's, place after place.
    Pong,
    /// Dependent pointer chase, one thread.
    Chase,
    /// Writes the verification pattern.
    Fill,
    /// Counts words that differ from the pattern.
    Check,
    /// 16-byte-word copy (SM copy bandwidth).
    Copy,
}

impl Kernel {
    pub const ALL: [Kernel; 6] = [
        Kernel::Ping,
        Kernel::Pong,
        Kernel::Chase,
        Kernel::Fill,
        Kernel::Check,
        Kernel::Copy,
    ];

    /// Entry name in the PTX.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Ping => "ping",
            Kernel::Pong => "pong",
            Kernel::Chase => "chase",
            Kernel::Fill => "fill",
            Kernel::Check => "check",
            Kernel::Copy => "copy",
        }
    }

    /// Parameter list; launches are checked against it, and a test against the PTX.
    pub fn params(self) -> &'static [ParamType] {
        use ParamType::*;
        match self {
            Kernel::Ping => &[U64, U64, U64, U32, U32, U64, U64, U64],
            Kernel::Pong => &[U64, U64, U64, U32, U32, U64, U64],
            Kernel::Chase => &[U64, U32, U64],
            Kernel::Fill => &[U64, U64, U32],
            Kernel::Check => &[U64, U64, U32, U64, U64],
            Kernel::Copy => &[U64, U64, U64],
        }
    }
}

impl KernelEntry for Kernel {
    fn name(self) -> &'static str {
        Kernel::name(self)
    }

    fn params(self) -> &'static [ParamType] {
        Kernel::params(self)
    }
}

/// [`PTX`] JIT-compiled for `gpu`, with every [`Kernel`] looked up.
pub fn load(gpu: &Gpu) -> Result<Module<'_>, CudaError> {
    Module::load(gpu, PTX, &Kernel::ALL)
}

/// The word that `fill` writes and `check` expects at index `i`.
///
/// An odd multiplier makes it a bijection on u32, so a stale or zeroed buffer
/// matches it in at most one word per 2^32.
pub fn pattern(i: u64, seed: u32) -> u32 {
    (i as u32).wrapping_mul(0x9E37_79B1).wrapping_add(seed)
}

/// Successor function of the pointer-chase chain: a full-period LCG modulo `n`
/// (a power of two), so a walk from 0 visits `n` distinct words before repeating.
pub fn chase_next(i: u32, n: u32) -> u32 {
    debug_assert!(n.is_power_of_two());
    // The remainder by a power of two, as a mask: the 4 Mi words of the full plan's
    // chain took ~20 ms with a division each.
    ((i as u64 * 2_654_435_761 + 12_345) & (n as u64 - 1)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// `.visible .entry NAME( .param .TYPE NAME, ... )` blocks of the PTX.
    fn ptx_entries(ptx: &str) -> Vec<(String, Vec<ParamType>)> {
        let mut out = Vec::new();
        let mut lines = ptx.lines().map(str::trim);
        while let Some(line) = lines.next() {
            let Some(rest) = line.strip_prefix(".visible .entry ") else {
                continue;
            };
            let name = rest.trim_end_matches('(').to_string();
            let mut params = Vec::new();
            for p in lines.by_ref() {
                if p.starts_with(')') {
                    break;
                }
                params.push(match p.split_whitespace().nth(1) {
                    Some(".u32") => ParamType::U32,
                    Some(".u64") => ParamType::U64,
                    other => panic!("unexpected parameter type {other:?} in {name}"),
                });
            }
            out.push((name, params));
        }
        out
    }

    #[test]
    fn ptx_entries_match_launch_signatures() {
        let entries = ptx_entries(PTX);
        assert_eq!(entries.len(), Kernel::ALL.len(), "{entries:?}");
        for k in Kernel::ALL {
            let (_, params) = entries
                .iter()
                .find(|(n, _)| n == k.name())
                .unwrap_or_else(|| panic!("no entry {} in the PTX", k.name()));
            assert_eq!(params.as_slice(), k.params(), "parameters of {}", k.name());
        }
    }

    /// The body of entry `name`: from its `.visible .entry` line to the next entry.
    fn entry_body<'a>(ptx: &'a str, name: &str) -> &'a str {
        let start = ptx
            .find(&format!(".visible .entry {name}("))
            .unwrap_or_else(|| panic!("no entry {name}"));
        let rest = &ptx[start + 1..];
        &ptx[start..start + 1 + rest.find(".visible .entry").unwrap_or(rest.len())]
    }

    #[test]
    fn pingpong_waits_check_their_counter_once_per_round_of_polls() {
        for k in [Kernel::Ping, Kernel::Pong] {
            let body = entry_body(PTX, k.name());
            let polls = body.matches("ld.volatile.global.u32").count() as u64;
            assert_eq!(polls, POLLS_PER_CHECK, "polls written out in {}", k.name());
            let checks = body.matches("add.u64 \t%rd5, %rd5, 1;").count();
            assert_eq!(checks, 1, "give-up counter steps in {}", k.name());
        }
    }

    #[test]
    fn ptx_is_loadable_by_old_drivers() {
        assert!(PTX.contains("\n.version 7.0\n"));
        assert!(PTX.contains("\n.target sm_70\n"));
        assert!(
            !PTX.contains('\0'),
            "cuModuleLoadData needs one NUL, at the end"
        );
    }

    #[test]
    fn pattern_matches_ptx_constant() {
        // The PTX uses the signed spelling of the same multiplier.
        assert!(PTX.contains("-1640531535"));
        assert_eq!(0x9E37_79B1u32 as i32, -1_640_531_535);
        assert_eq!(pattern(0, 7), 7);
        assert_eq!(pattern(1, 0), 0x9E37_79B1);
        assert_eq!(pattern(1 << 32, 5), 5);
    }

    #[test]
    fn chase_chain_has_full_period() {
        let n = 1 << 12;
        let mut seen = HashSet::new();
        let mut x = 0;
        for _ in 0..n {
            assert!(seen.insert(x), "chain repeats early at {x}");
            x = chase_next(x, n);
        }
        assert_eq!(x, 0);
    }
}
