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
        Some(
            Stat {
                median,
                min: s[0],
                max: s[n - 1],
                spread_pct: 0.0,
                samples,
            }
            .with_spread(),
        )
    }

    /// This statistic with another min (one that is not a sample's, such as the fastest
    /// pass of a placement distribution whose samples are the places' medians) and the
    /// spread that follows.
    pub fn with_min(self, min: f64) -> Stat {
        Stat { min, ..self }.with_spread()
    }

    fn with_spread(self) -> Stat {
        let spread_pct = if self.median > 0.0 {
            (self.max - self.min) / self.median * 100.0
        } else {
            0.0
        };
        Stat { spread_pct, ..self }
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
