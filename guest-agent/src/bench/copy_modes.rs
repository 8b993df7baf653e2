//! The 4-byte peer copy's modes: its latency is bimodal between processes (2 × H200:
//! 1.55–3.16 µs in the agent, 1.75–2.54 µs in the reference probe itself, issue 42),
//! so the agent times it on several streams of one process and reports each distinct
//! figure with how many streams gave it and which. Sorted by figure, a new mode begins
//! where a stream's figure is more than [`MODE_GAP`] above the one before it.

use serde::{Deserialize, Serialize};

use crate::stats::Stat;

/// Relative step beyond which the next stream's figure starts another mode: the modes
/// seen lie 40 % and more apart (1.6 and 2.4 µs), the streams of one mode within 10 %
/// (2.26–2.50 µs; comparing with a mode's lowest split those, 2 × H200).
pub const MODE_GAP: f64 = 0.10;

/// One mode of the 4-byte copy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CopyMode {
    /// The median of its streams' medians (µs per copy).
    pub us: f64,
    /// How many streams gave it.
    pub count: usize,
    /// Which streams (0 is the pair's own stream, then in creation order).
    pub streams: Vec<usize>,
}

/// The modes of `by_stream` (one Stat per stream), fastest first.
pub fn modes(by_stream: &[Stat]) -> Vec<CopyMode> {
    let mut order: Vec<usize> = (0..by_stream.len()).collect();
    order.sort_by(|&a, &b| by_stream[a].median.total_cmp(&by_stream[b].median));
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for i in order {
        let v = by_stream[i].median;
        match groups.last_mut() {
            Some(g) if v <= by_stream[g[g.len() - 1]].median * (1.0 + MODE_GAP) => g.push(i),
            _ => groups.push(vec![i]),
        }
    }
    groups
        .into_iter()
        .map(|mut streams| {
            let us = Stat::of(streams.iter().map(|&i| by_stream[i].median).collect())
                .expect("a group has a stream")
                .median;
            streams.sort_unstable();
            CopyMode {
                us,
                count: streams.len(),
                streams,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(v: &[f64]) -> Vec<Stat> {
        v.iter().map(|&x| Stat::of(vec![x]).unwrap()).collect()
    }

    #[test]
    fn two_modes_are_counted_with_their_streams() {
        let m = modes(&stats(&[2.54, 1.75, 1.76, 2.50]));
        assert_eq!(m.len(), 2);
        assert_eq!((m[0].count, m[0].streams.clone()), (2, vec![1, 2]));
        assert_eq!((m[1].count, m[1].streams.clone()), (2, vec![0, 3]));
        assert!((m[0].us - 1.755).abs() < 1e-9);
    }

    #[test]
    fn figures_within_the_gap_are_one_mode() {
        let m = modes(&stats(&[1.60, 1.55, 1.70]));
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].count, 3);
        // Just past the gap: two.
        assert_eq!(modes(&stats(&[1.0, 1.11])).len(), 2);
        // Steps under the gap chain into one mode (recorded 2 × H200 streams), though
        // the ends lie 10.6 % apart.
        let recorded = [2.263, 2.32, 2.502, 2.439, 2.462, 2.438, 2.419, 2.417];
        assert_eq!(modes(&stats(&recorded)).len(), 1);
        assert!(modes(&[]).is_empty());
    }
}
