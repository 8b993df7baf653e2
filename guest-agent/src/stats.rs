//! Summaries of repeated measurements.

use serde::{Deserialize, Serialize};

/// Median and spread of several samples of one measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stat {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// (max - min) / median, in percent.
    pub spread_pct: f64,
    pub samples: Vec<f64>,
}

impl Stat {
    /// `None` for no samples.
    pub fn of(samples: Vec<f64>) -> Option<Stat> {
        if samples.is_empty() {
            return None;
        }
        let mut s = samples.clone();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median = if n % 2 == 1 {
            s[n / 2]
        } else {
            (s[n / 2 - 1] + s[n / 2]) / 2.0
        };
        let (min, max) = (s[0], s[n - 1]);
        let spread_pct = if median > 0.0 {
            (max - min) / median * 100.0
        } else {
            0.0
        };
        Some(Stat {
            median,
            min,
            max,
            spread_pct,
            samples,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_spread() {
        let s = Stat::of(vec![3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        assert_eq!(s.spread_pct, 100.0);
        assert_eq!(s.samples, [3.0, 1.0, 2.0]);
        assert_eq!(Stat::of(vec![1.0, 2.0, 4.0, 10.0]).unwrap().median, 3.0);
        assert!(Stat::of(vec![]).is_none());
    }
}
