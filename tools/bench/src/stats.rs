//! Latency summaries and a small random source (jitter, account choice).

use std::time::Duration;

use serde_json::{Value, json};

/// Percentiles of a set of latencies, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Summary {
    pub count: usize,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub mean: f64,
    pub max: f64,
}

impl Summary {
    pub fn of(samples: &[Duration]) -> Summary {
        Summary::of_values(samples.iter().map(|d| d.as_secs_f64() * 1e3).collect())
    }

    /// The same figures of values in any unit (a [`Tally`]'s counts).
    fn of_values(mut values: Vec<f64>) -> Summary {
        if values.is_empty() {
            return Summary::default();
        }
        values.sort_by(f64::total_cmp);
        Summary {
            count: values.len(),
            p50: percentile(&values, 50.0),
            p95: percentile(&values, 95.0),
            p99: percentile(&values, 99.0),
            mean: values.iter().sum::<f64>() / values.len() as f64,
            max: values[values.len() - 1],
        }
    }

    pub fn json(&self) -> Value {
        json!({
            "samples": self.count,
            "p50Ms": round(self.p50, 3),
            "p95Ms": round(self.p95, 3),
            "p99Ms": round(self.p99, 3),
            "meanMs": round(self.mean, 3),
            "maxMs": round(self.max, 3),
        })
    }
}

/// Percentiles of a set of whole-number counts (attempts or requests per committed transfer).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Tally {
    pub count: usize,
    pub p50: u32,
    pub p99: u32,
    pub max: u32,
    pub mean: f64,
}

impl Tally {
    pub fn of(samples: &[u32]) -> Tally {
        let s = Summary::of_values(samples.iter().map(|&n| f64::from(n)).collect());
        Tally { count: s.count, p50: s.p50 as u32, p99: s.p99 as u32, max: s.max as u32, mean: s.mean }
    }

    /// "max 7, p99 4, p50 1, mean 1.38"
    pub fn text(&self) -> String {
        format!("max {}, p99 {}, p50 {}, mean {:.2}", self.max, self.p99, self.p50, self.mean)
    }

    pub fn json(&self) -> Value {
        json!({
            "samples": self.count,
            "p50": self.p50,
            "p99": self.p99,
            "max": self.max,
            "mean": round(self.mean, 3),
        })
    }
}

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// 2 → "2", 2.5 → "2.5", 2.333 → "2.33".
pub fn trim(n: f64) -> String {
    let s = format!("{n:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

pub fn round(value: f64, decimals: i32) -> f64 {
    let factor = 10f64.powi(decimals);
    (value * factor).round() / factor
}

/// SplitMix64: enough randomness for jitter and picking accounts, seeded per client.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&values, 50.0), 50.0);
        assert_eq!(percentile(&values, 99.0), 99.0);
        assert_eq!(percentile(&values, 100.0), 100.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
    }

    #[test]
    fn tally_of_counts() {
        // 98 transfers committed on their first attempt, one on its 3rd, one on its 9th.
        let mut samples = vec![1u32; 98];
        samples.extend([9, 3]);
        let t = Tally::of(&samples);
        assert_eq!((t.count, t.p50, t.p99, t.max), (100, 1, 3, 9));
        assert!((t.mean - 1.1).abs() < 1e-9);
        assert_eq!(t.text(), "max 9, p99 3, p50 1, mean 1.10");
        assert_eq!(t.json()["p99"], json!(3));
        // Fewer than 100 samples: the p99 is the largest.
        assert_eq!(Tally::of(&[2, 1, 5]).p99, 5);
        assert_eq!(Tally::of(&[]), Tally::default());
    }

    #[test]
    fn summary_of_durations() {
        let samples: Vec<Duration> = (1..=10).map(Duration::from_millis).collect();
        let s = Summary::of(&samples);
        assert_eq!(s.count, 10);
        assert_eq!(s.p50, 5.0);
        assert_eq!(s.p99, 10.0);
        assert!((s.mean - 5.5).abs() < 1e-9);
    }
}
