//! Prometheus `/metrics`.
//!
//! The interface the API handlers call is fixed here; the helper writing
//! the exposition fills the bodies. Every method is cheap and never fails.

use std::time::Duration;

/// The server's counters and histograms.
#[derive(Debug, Default)]
pub struct Metrics {}

impl Metrics {
    /// A claim (or `claim_next`) answered; `outcome` is a short label such
    /// as `acquired`, `held`, `finished`, `empty`.
    pub fn record_claim(&self, outcome: &'static str) {
        let _ = outcome;
    }

    /// A write the store refused because the presented fence was stale.
    pub fn record_fenced_out(&self) {}

    /// One atomic step commit took `elapsed` (whatever its result).
    pub fn observe_step(&self, elapsed: Duration) {
        let _ = elapsed;
    }

    /// An SSE client connected; the returned guard counts it until dropped.
    pub fn sse_client(&self) -> SseClientGuard<'_> {
        SseClientGuard { _metrics: self }
    }
}

/// Counts one connected SSE client while alive.
#[derive(Debug)]
pub struct SseClientGuard<'a> {
    _metrics: &'a Metrics,
}
