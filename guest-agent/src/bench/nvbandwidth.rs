//! The nvbandwidth testcase each figure of a pair corresponds to (issue 42), so the
//! agent's JSON lines up with nvbandwidth and DCGM's nvbandwidth plugin, which name
//! their results so (NVIDIA/nvbandwidth README, "Testcases").
//!
//! - `ce_bandwidth_gbps`: copy-engine copy pushed by the source into the peer:
//!   `device_to_device_memcpy_write_ce`.
//! - `ce_bidir_bandwidth_gbps`: both ways at once by copy engines; the agent gives the
//!   total of both directions, as nvbandwidth's `…_total` figure does:
//!   `device_to_device_bidirectional_memcpy_write_ce`.
//! - `sm_copy_bandwidth_gbps`: a kernel on the source storing into the peer:
//!   `device_to_device_memcpy_write_sm`.
//! - `remote_read_latency_us`: a pointer chase by one thread through the peer's memory:
//!   `device_to_device_latency_sm` (nvbandwidth chases a 2 MiB buffer, the agent 16 MiB).
//!
//! The one-way flag ping-pong and the 4-byte copy have no nvbandwidth counterpart.

use std::collections::BTreeMap;

/// (field of `PairBench`, nvbandwidth testcase).
pub const TESTCASES: [(&str, &str); 4] = [
    ("ce_bandwidth_gbps", "device_to_device_memcpy_write_ce"),
    (
        "ce_bidir_bandwidth_gbps",
        "device_to_device_bidirectional_memcpy_write_ce",
    ),
    ("sm_copy_bandwidth_gbps", "device_to_device_memcpy_write_sm"),
    ("remote_read_latency_us", "device_to_device_latency_sm"),
];

/// [`TESTCASES`] as the map a pair's JSON carries.
pub fn testcases() -> BTreeMap<String, String> {
    TESTCASES
        .iter()
        .map(|(f, t)| (f.to_string(), t.to_string()))
        .collect()
}
