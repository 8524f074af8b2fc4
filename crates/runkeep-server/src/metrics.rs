//! Prometheus `/metrics`.
//!
//! The interface the API handlers call is fixed here; every method is cheap
//! (an atomic add, a bucket search) and never fails. [`Metrics::render`]
//! writes the Prometheus text exposition (format 0.0.4) that `GET /metrics`
//! serves.
//!
//! The series (all prefixed `runkeep_`):
//!
//! | name | type | labels | what |
//! |---|---|---|---|
//! | `runkeep_claims_total` | counter | `outcome` | claims, `claim_next` and hand-overs' claims answered, by outcome (`acquired`, `held`, `finished`, `empty`, `error` for a hand-over's claim that failed after its step, …) |
//! | `runkeep_fenced_out_total` | counter | | writes the store refused for a stale fence |
//! | `runkeep_run_failures_total` | counter | `kind`, `tenant` | failed attempts reported (`failed_attempt`), runs they dead-lettered (`dead_lettered`), runs an operator cancelled (`cancelled`), and failed attempts whose step ran past its attempt timeout (`timed_out`); per tenant, a label set as bounded as the server's tenants |
//! | `runkeep_step_seconds` | histogram | | latency of the atomic step commit (whatever its result; a hand-over's includes its claim) |
//! | `runkeep_sse_clients` | gauge | | Server-Sent Events tails connected now |
//! | `runkeep_http_requests_total` | counter | `method`, `route`, `status` | every request answered; `route` is the matched route template (`/v1/…/{run}`), never the raw path, so the label set stays bounded |
//! | `runkeep_http_request_seconds` | histogram | `method`, `route` | time to the response head |
//! | `runkeep_http_requests_in_flight` | gauge | | requests between their head and their response head now (a scrape counts itself) |
//! | `runkeep_http_rejected_total` | counter | `reason` | requests refused by the server's manners: `overloaded` (503: every request slot taken), `tenant_share` / `token_share` (503: the caller's tenant or token holds its share of them), `waits` / `tenant_waits` / `token_waits` (503: the same for long-polls and event tails), `body_too_large` (413), `timeout` (408/503) |
//! | `runkeep_http_slots_held` | gauge | `budget` | slots of the admission budgets held now ([`crate::manners`]): `requests` (short requests inside a handler), `waits` (long-polls waiting, event tails streaming) |
//!
//! The `prometheus` crate (tikv's, without its protobuf feature) does the
//! bookkeeping: label sets, bucket counting and the text format's escaping
//! are what it does well, and a hand-written version would be most of its
//! size again.

use std::sync::Arc;
use std::time::Duration;

use prometheus::{
    exponential_buckets, Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter,
    IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// The content type of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The server's counters and histograms.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    claims: IntCounterVec,
    fenced_out: IntCounter,
    run_failures: IntCounterVec,
    step_seconds: Histogram,
    sse_clients: IntGauge,
    requests: IntCounterVec,
    request_seconds: HistogramVec,
    in_flight: IntGauge,
    rejected: IntCounterVec,
    slots_held: IntGaugeVec,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

// The names and options are constants: registering them cannot fail.
fn must<T>(r: prometheus::Result<T>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => unreachable!("a constant metric definition was refused: {e}"),
    }
}

impl Metrics {
    /// Fresh counters, all zero.
    pub fn new() -> Self {
        let registry =
            Registry::new_custom(Some("runkeep".into()), None).unwrap_or_else(|_| Registry::new());
        // 0.5 ms … ~8 s, doubling.
        let latency = must(exponential_buckets(0.0005, 2.0, 15));
        let claims = must(IntCounterVec::new(
            Opts::new(
                "claims_total",
                "Claims and claim_next answered, by outcome.",
            ),
            &["outcome"],
        ));
        let fenced_out = must(IntCounter::new(
            "fenced_out_total",
            "Writes the store refused because the presented fence was stale.",
        ));
        let run_failures = must(IntCounterVec::new(
            Opts::new(
                "run_failures_total",
                "Failed attempts, dead-letterings, cancels and attempt timeouts, by kind and tenant.",
            ),
            &["kind", "tenant"],
        ));
        let step_seconds = must(Histogram::with_opts(
            HistogramOpts::new(
                "step_seconds",
                "Latency of the atomic step commit, whatever its result.",
            )
            .buckets(latency.clone()),
        ));
        let sse_clients = must(IntGauge::new(
            "sse_clients",
            "Server-Sent Events tails connected now.",
        ));
        let requests = must(IntCounterVec::new(
            Opts::new(
                "http_requests_total",
                "Requests answered, by method, matched route and status.",
            ),
            &["method", "route", "status"],
        ));
        let request_seconds = must(HistogramVec::new(
            HistogramOpts::new(
                "http_request_seconds",
                "Time to the response head, by method and matched route.",
            )
            .buckets(latency),
            &["method", "route"],
        ));
        let in_flight = must(IntGauge::new(
            "http_requests_in_flight",
            "Requests between their head and their response head now.",
        ));
        let rejected = must(IntCounterVec::new(
            Opts::new(
                "http_rejected_total",
                "Requests refused by the server's limits, by reason.",
            ),
            &["reason"],
        ));
        let slots_held = must(IntGaugeVec::new(
            Opts::new(
                "http_slots_held",
                "Slots of the admission budgets held now: requests (short requests in a handler), waits (long-polls, event tails).",
            ),
            &["budget"],
        ));
        for c in [
            Box::new(claims.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(fenced_out.clone()),
            Box::new(run_failures.clone()),
            Box::new(step_seconds.clone()),
            Box::new(sse_clients.clone()),
            Box::new(requests.clone()),
            Box::new(request_seconds.clone()),
            Box::new(in_flight.clone()),
            Box::new(rejected.clone()),
            Box::new(slots_held.clone()),
        ] {
            must(registry.register(c));
        }
        Self {
            registry,
            claims,
            fenced_out,
            run_failures,
            step_seconds,
            sse_clients,
            requests,
            request_seconds,
            in_flight,
            rejected,
            slots_held,
        }
    }

    /// A claim (or `claim_next`) answered; `outcome` is a short label such
    /// as `acquired`, `held`, `finished`, `empty`.
    pub fn record_claim(&self, outcome: &'static str) {
        self.claims.with_label_values(&[outcome]).inc();
    }

    /// A write the store refused because the presented fence was stale.
    /// A run failure of `kind` (`failed_attempt`, `dead_lettered`,
    /// `cancelled`, `timed_out`) in `tenant`.
    pub fn record_run_failure(&self, kind: &'static str, tenant: &str) {
        self.run_failures.with_label_values(&[kind, tenant]).inc();
    }

    /// A write refused for a stale fence.
    pub fn record_fenced_out(&self) {
        self.fenced_out.inc();
    }

    /// One atomic step commit took `elapsed` (whatever its result).
    pub fn observe_step(&self, elapsed: Duration) {
        self.step_seconds.observe(elapsed.as_secs_f64());
    }

    /// An SSE client connected; the returned guard counts it until dropped.
    pub fn sse_client(&self) -> SseClientGuard<'_> {
        self.sse_clients.inc();
        SseClientGuard { metrics: self }
    }

    /// [`Metrics::sse_client`] for a stream that outlives the borrow (a
    /// response body holds it): counts the client until dropped.
    pub fn sse_client_owned(self: &Arc<Self>) -> OwnedSseClientGuard {
        self.sse_clients.inc();
        OwnedSseClientGuard {
            metrics: self.clone(),
        }
    }

    /// One request answered: `route` is the matched route template (or
    /// `unmatched`), `status` the response's code.
    pub fn record_request(&self, method: &str, route: &str, status: u16, elapsed: Duration) {
        let status = status.to_string();
        self.requests
            .with_label_values(&[method, route, status.as_str()])
            .inc();
        self.request_seconds
            .with_label_values(&[method, route])
            .observe(elapsed.as_secs_f64());
    }

    /// A request entered the server; the guard counts it in
    /// `runkeep_http_requests_in_flight` until dropped.
    pub fn request_started(self: &Arc<Self>) -> InFlightGuard {
        self.in_flight.inc();
        InFlightGuard {
            metrics: self.clone(),
        }
    }

    /// A request the server's limits refused: `overloaded`,
    /// `tenant_share`, `token_share`, `waits`, `tenant_waits`,
    /// `token_waits`, `body_too_large` or `timeout`.
    pub fn record_rejected(&self, reason: &'static str) {
        self.rejected.with_label_values(&[reason]).inc();
    }

    /// The gauge of the slots of admission budget `budget` (`requests`,
    /// `waits`) held now; the budget sets it as slots are taken and given
    /// back.
    pub fn slots_held(&self, budget: &'static str) -> IntGauge {
        self.slots_held.with_label_values(&[budget])
    }

    /// SSE clients connected now.
    pub fn sse_clients(&self) -> i64 {
        self.sse_clients.get()
    }

    /// The Prometheus text exposition of every series ([`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding plain counters into a Vec cannot fail.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

/// Counts one request in flight while alive ([`Metrics::request_started`]).
#[derive(Debug)]
pub struct InFlightGuard {
    metrics: Arc<Metrics>,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.metrics.in_flight.dec();
    }
}

/// Counts one connected SSE client while alive.
#[derive(Debug)]
pub struct SseClientGuard<'a> {
    metrics: &'a Metrics,
}

impl Drop for SseClientGuard<'_> {
    fn drop(&mut self) {
        self.metrics.sse_clients.dec();
    }
}

/// Counts one connected SSE client while alive (owned form, see
/// [`Metrics::sse_client_owned`]).
#[derive(Debug)]
pub struct OwnedSseClientGuard {
    metrics: Arc<Metrics>,
}

impl Drop for OwnedSseClientGuard {
    fn drop(&mut self) {
        self.metrics.sse_clients.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the sample line starting with `series` (name and labels).
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }

    #[test]
    fn every_method_shows_in_the_exposition() {
        let m = Arc::new(Metrics::new());
        m.record_claim("acquired");
        m.record_claim("acquired");
        m.record_claim("held");
        m.record_fenced_out();
        m.observe_step(Duration::from_millis(3));
        m.observe_step(Duration::from_millis(300));
        let g1 = m.sse_client();
        let g2 = m.sse_client_owned();
        m.record_request("GET", "/v1/runs", 200, Duration::from_millis(1));
        m.record_rejected("overloaded");
        m.slots_held("waits").set(3);
        let in_flight = m.request_started();
        let text = m.render();
        assert_eq!(sample(&text, "runkeep_http_requests_in_flight"), Some(1.0));
        drop(in_flight);
        assert_eq!(
            sample(&text, r#"runkeep_claims_total{outcome="acquired"}"#),
            Some(2.0)
        );
        assert_eq!(
            sample(&text, r#"runkeep_claims_total{outcome="held"}"#),
            Some(1.0)
        );
        assert_eq!(sample(&text, "runkeep_fenced_out_total"), Some(1.0));
        assert_eq!(sample(&text, "runkeep_step_seconds_count"), Some(2.0));
        assert_eq!(
            sample(&text, r#"runkeep_step_seconds_bucket{le="0.004"}"#),
            Some(1.0)
        );
        assert_eq!(sample(&text, "runkeep_sse_clients"), Some(2.0));
        assert_eq!(
            sample(
                &text,
                r#"runkeep_http_requests_total{method="GET",route="/v1/runs",status="200"}"#
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, r#"runkeep_http_rejected_total{reason="overloaded"}"#),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, r#"runkeep_http_slots_held{budget="waits"}"#),
            Some(3.0)
        );
        drop(g1);
        drop(g2);
        assert_eq!(sample(&m.render(), "runkeep_sse_clients"), Some(0.0));
    }
}
