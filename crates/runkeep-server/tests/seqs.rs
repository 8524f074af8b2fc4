//! A seq a request names (`sinceSeq`, `Last-Event-ID`) is at most 2^53 − 1,
//! as the OpenAPI document says, on every route that takes one (issue 26,
//! item 6): above it (2^53, 2^63) is 400 naming the field and the maximum;
//! above what a u64 holds is 400 naming the field too.

mod common;

use std::sync::Arc;

use runkeep::RunStore;
use runkeep_conformance::support;
use serde_json::Value;

use common::{TestServer, TOKEN_A};

const MAX: u64 = (1 << 53) - 1;

fn run_path(tail: &str) -> String {
    format!(
        "/v1/tenants/{}/projects/{}/sessions/{}/runs/r{tail}",
        support::tenant(),
        support::project(),
        support::session()
    )
}

async fn get(server: &TestServer, path: &str, header: Option<(&str, String)>) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .get(format!("{}{path}", server.url()))
        .bearer_auth(TOKEN_A);
    if let Some((k, v)) = header {
        req = req.header(k, v);
    }
    let res = req.send().await.unwrap();
    let status = res.status().as_u16();
    let ct = res
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    if ct.starts_with("text/event-stream") {
        return (status, Value::Null);
    }
    (status, res.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_since_seq_above_2_pow_53_minus_1_is_refused_on_every_route_naming_the_field() {
    let store: Arc<dyn RunStore> = Arc::new(runkeep::MemoryStore::new());
    let server = TestServer::start(store);
    let routes = [
        "/events?sinceSeq=",
        "/events/wait?timeoutMs=0&sinceSeq=",
        "/events/stream?sinceSeq=",
        "/audit?sinceSeq=",
    ];
    for route in routes {
        for bad in [MAX + 1, 1 << 63, u64::MAX] {
            let (status, body) = get(&server, &run_path(&format!("{route}{bad}")), None).await;
            assert_eq!(status, 400, "{route}{bad}: {body}");
            assert_eq!(body["field"], "sinceSeq", "{route}{bad}: {body}");
            let detail = body["detail"].as_str().unwrap_or_default();
            assert!(detail.contains(&MAX.to_string()), "{route}{bad}: {detail}");
        }
        // Beyond a u64: still 400 naming the field.
        let (status, body) = get(
            &server,
            &run_path(&format!("{route}18446744073709551616")),
            None,
        )
        .await;
        assert_eq!(status, 400, "{route}2^64: {body}");
        assert_eq!(body["field"], "sinceSeq", "{route}2^64: {body}");
        // The maximum itself is taken.
        let (status, body) = get(&server, &run_path(&format!("{route}{MAX}")), None).await;
        assert_eq!(status, 200, "{route}{MAX}: {body}");
    }
    // The tail's Last-Event-ID, likewise.
    let (status, body) = get(
        &server,
        &run_path("/events/stream"),
        Some(("last-event-id", (MAX + 1).to_string())),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["field"], "Last-Event-ID", "{body}");
    let (status, _) = get(
        &server,
        &run_path("/events/stream"),
        Some(("last-event-id", MAX.to_string())),
    )
    .await;
    assert_eq!(status, 200);
}
