//! Samples, medians, percentiles and the ratios of alternating repetitions.

use std::future::Future;
use std::time::{Duration, Instant};

/// What one measurement of one case counted.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    /// Units done (operations, cycles, events, jobs).
    pub units: f64,
    /// Seconds the timed part took.
    pub secs: f64,
    /// The latency of each timed operation, µs (empty for throughput-only
    /// cases).
    pub latencies_us: Vec<f64>,
}

impl Sample {
    /// Units per second.
    pub fn rate(&self) -> f64 {
        if self.secs > 0.0 {
            self.units / self.secs
        } else {
            0.0
        }
    }
}

/// The fewest timed operations of a sequential measurement, however slow.
const MIN_OPS: usize = 5;

/// Runs `op(i)` one after the other: 2 untimed warm-up calls, then timed
/// calls until `budget` has passed (and at least [`MIN_OPS`] ran). `op`
/// answers how many units it did.
pub async fn sequential<F, Fut>(budget: Duration, mut op: F) -> Result<Sample, String>
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = Result<f64, String>>,
{
    let mut i = 0u64;
    for _ in 0..2 {
        op(i).await?;
        i += 1;
    }
    let started = Instant::now();
    let mut latencies = Vec::new();
    let mut units = 0.0;
    loop {
        let t = Instant::now();
        units += op(i).await?;
        latencies.push(t.elapsed().as_secs_f64() * 1e6);
        i += 1;
        if started.elapsed() >= budget && latencies.len() >= MIN_OPS {
            break;
        }
    }
    Ok(Sample {
        units,
        secs: started.elapsed().as_secs_f64(),
        latencies_us: latencies,
    })
}

/// The median (0 for none).
pub fn median(xs: &[f64]) -> f64 {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The `p`-th percentile (0–100, nearest rank) of `xs`; `None` for none.
pub fn percentile(xs: &[f64], p: f64) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    Some(v[rank.clamp(1, v.len()) - 1])
}

/// Smallest and largest.
pub fn min_max(xs: &[f64]) -> (f64, f64) {
    xs.iter()
        .copied()
        .filter(|x| x.is_finite())
        .fold(None, |acc: Option<(f64, f64)>, x| match acc {
            None => Some((x, x)),
            Some((lo, hi)) => Some((lo.min(x), hi.max(x))),
        })
        .unwrap_or((0.0, 0.0))
}

/// Per-repetition ratios `num[i] / den[i]` over the repetitions both have.
pub fn paired(num: &[f64], den: &[f64]) -> Vec<f64> {
    num.iter()
        .zip(den)
        .filter(|(_, d)| **d > 0.0)
        .map(|(n, d)| n / d)
        .collect()
}

/// A rate for humans: `12 345`, `987`, `12.3`, `0.52`.
pub fn human_rate(x: f64) -> String {
    if !x.is_finite() {
        return "-".into();
    }
    if x >= 1000.0 {
        group_thousands(x.round() as u64)
    } else if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

fn group_thousands(n: u64) -> String {
    let mut out = Vec::new();
    let mut in_group = 0;
    for c in n.to_string().chars().rev() {
        if in_group == 3 {
            out.push(' ');
            in_group = 0;
        }
        out.push(c);
        in_group += 1;
    }
    out.into_iter().rev().collect()
}

/// A latency for humans, from µs.
pub fn human_us(us: f64) -> String {
    if us >= 1_000_000.0 {
        format!("{:.2} s", us / 1e6)
    } else if us >= 1000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else if us >= 10.0 {
        format!("{us:.0} µs")
    } else {
        format!("{us:.1} µs")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_percentiles_and_pairs() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
        let xs: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&xs, 50.0), Some(50.0));
        assert_eq!(percentile(&xs, 99.0), Some(99.0));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(paired(&[2.0, 3.0, 9.0], &[1.0, 0.0]), vec![2.0]);
        assert_eq!(min_max(&[2.0, 5.0, 1.0]), (1.0, 5.0));
        assert_eq!(human_rate(1_234_567.0), "1 234 567");
        assert_eq!(human_rate(0.5), "0.50");
    }
}
