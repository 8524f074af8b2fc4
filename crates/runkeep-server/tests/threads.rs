//! The thread routes (`api::threads`): a LangGraph-style checkpoint chain
//! in one run — latest by checkpoint id, values rebuilt from versions,
//! listings filtered by namespace, `before`, metadata and `limit`, pending
//! writes under LangGraph's conflict rule, parks from writes, deletion,
//! the listing across threads, and every write fenced and bound to the
//! claiming token.

mod common;

use std::sync::Arc;

use runkeep_conformance::support;
use serde_json::{json, Value};

use common::{TestServer, READER_A, TOKEN_A, WORKER_A, WORKER_A2};

fn run_path(run: &str, tail: &str) -> String {
    format!(
        "/v1/tenants/{}/projects/{}/sessions/{}/runs/{run}{tail}",
        support::tenant(),
        support::project(),
        support::session()
    )
}

struct Answer {
    status: u16,
    body: Value,
}

async fn send(
    server: &TestServer,
    method: reqwest::Method,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> Answer {
    let mut req = reqwest::Client::new()
        .request(method, format!("{}{path}", server.url()))
        .bearer_auth(token);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let res = req.send().await.expect("the server answers");
    let status = res.status().as_u16();
    let bytes = res.bytes().await.unwrap();
    Answer {
        status,
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    }
}

async fn get(server: &TestServer, path: &str) -> Answer {
    send(server, reqwest::Method::GET, path, READER_A, None).await
}

fn blob(channel: &str, version: &str, data: &str) -> Value {
    json!({ "channel": channel, "version": version, "type": "json", "data": data })
}

fn cp(
    thread: &str,
    ns: &str,
    id: &str,
    parent: Option<&str>,
    versions: Value,
    blobs: Value,
) -> Value {
    let mut v = json!({
        "thread": thread,
        "ns": ns,
        "checkpointId": id,
        "checkpoint": { "v": 4, "id": id, "channel_versions": versions },
        "metadata": { "source": "loop", "step": id.len() },
        "blobs": blobs,
    });
    if let Some(p) = parent {
        v["parentId"] = json!(p);
    }
    v
}

async fn put_cp(server: &TestServer, run: &str, token: &str, body: Value) -> Answer {
    send(
        server,
        reqwest::Method::PUT,
        &run_path(run, "/thread/checkpoints"),
        token,
        Some(body),
    )
    .await
}

async fn put_writes(server: &TestServer, run: &str, token: &str, body: Value) -> Answer {
    send(
        server,
        reqwest::Method::POST,
        &run_path(run, "/thread/writes"),
        token,
        Some(body),
    )
    .await
}

fn server() -> TestServer {
    TestServer::start(Arc::new(runkeep::MemoryStore::new()))
}

fn values(body: &Value) -> Vec<(String, String, String)> {
    let mut v: Vec<(String, String, String)> = body["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["channel"].as_str().unwrap().to_string(),
                b["version"].as_str().unwrap().to_string(),
                b["data"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn latest_is_the_greatest_id_and_values_come_from_their_versions() {
    let s = server();
    let run = "run_t1";
    // Written out of id order: "b" first, then "a" (a fork of nothing).
    let b = cp(
        "t1",
        "",
        "b",
        Some("a"),
        json!({"x": 2, "y": "1.0"}),
        json!([blob("x", "2", "X2")]),
    );
    let a = cp(
        "t1",
        "",
        "a",
        None,
        json!({"x": 1, "y": "1.0"}),
        json!([blob("x", "1", "X1"), blob("y", "1.0", "Y1")]),
    );
    assert_eq!(put_cp(&s, run, TOKEN_A, b).await.status, 200);
    assert_eq!(put_cp(&s, run, TOKEN_A, a).await.status, 200);
    let latest = get(&s, &run_path(run, "/thread/checkpoint")).await;
    assert_eq!(latest.status, 200, "{}", latest.body);
    let c = &latest.body["checkpoint"];
    assert_eq!(c["checkpointId"], "b");
    assert_eq!(c["parentId"], "a");
    assert_eq!(c["thread"], "t1");
    assert_eq!(c["run"], run);
    // x at version 2 from "b" itself, y at "1.0" from "a".
    assert_eq!(
        values(c),
        vec![
            ("x".into(), "2".into(), "X2".into()),
            ("y".into(), "1.0".into(), "Y1".into())
        ]
    );
    let first = get(&s, &run_path(run, "/thread/checkpoint?checkpointId=a")).await;
    assert_eq!(values(&first.body["checkpoint"]).len(), 2);
    assert_eq!(first.body["checkpoint"]["parentId"], Value::Null);
    // A channel the versions no longer name does not come back.
    let c2 = cp("t1", "", "c", Some("b"), json!({"x": 2}), json!([]));
    put_cp(&s, run, TOKEN_A, c2).await;
    let latest = get(&s, &run_path(run, "/thread/checkpoint")).await;
    assert_eq!(
        values(&latest.body["checkpoint"]),
        vec![("x".into(), "2".into(), "X2".into())]
    );
    // Another namespace is its own chain; a missing one reads null.
    let sub = cp("t1", "node:1|sub", "0", None, json!({}), json!([]));
    put_cp(&s, run, TOKEN_A, sub).await;
    let latest = get(&s, &run_path(run, "/thread/checkpoint")).await;
    assert_eq!(latest.body["checkpoint"]["checkpointId"], "c");
    let sub = get(&s, &run_path(run, "/thread/checkpoint?ns=node%3A1%7Csub")).await;
    assert_eq!(sub.body["checkpoint"]["checkpointId"], "0");
    assert_eq!(sub.body["checkpoint"]["ns"], "node:1|sub");
    let none = get(&s, &run_path(run, "/thread/checkpoint?checkpointId=zz")).await;
    assert_eq!(none.body["checkpoint"], Value::Null);
    let none = get(&s, &run_path("run_nothing", "/thread/checkpoint")).await;
    assert_eq!((none.status, &none.body["checkpoint"]), (200, &Value::Null));
}

#[tokio::test]
async fn listings_filter_by_namespace_before_metadata_and_limit() {
    let s = server();
    let run = "run_t2";
    for (ns, id) in [("", "1"), ("", "2"), ("", "3"), ("child", "2")] {
        let mut body = cp("t2", ns, id, None, json!({}), json!([]));
        body["metadata"] =
            json!({ "source": if id == "2" { "input" } else { "loop" }, "score": 1 });
        assert_eq!(put_cp(&s, run, WORKER_A, body).await.status, 200);
    }
    let ids = |a: &Answer| -> Vec<(String, String)> {
        a.body["checkpoints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["ns"].as_str().unwrap().to_string(),
                    c["checkpointId"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let p = |q: &str| run_path(run, &format!("/thread/checkpoints{q}"));
    let all = get(&s, &p("")).await;
    assert_eq!(
        ids(&all),
        vec![
            ("".into(), "3".into()),
            ("".into(), "2".into()),
            ("child".into(), "2".into()),
            ("".into(), "1".into())
        ]
    );
    assert_eq!(ids(&get(&s, &p("?ns=")).await).len(), 3);
    assert_eq!(
        ids(&get(&s, &p("?ns=child")).await),
        vec![("child".into(), "2".into())]
    );
    assert_eq!(
        ids(&get(&s, &p("?ns=&before=3")).await),
        vec![("".into(), "2".into()), ("".into(), "1".into())]
    );
    assert_eq!(
        ids(&get(&s, &p("?ns=&limit=1")).await),
        vec![("".into(), "3".into())]
    );
    let filter = urlencode(r#"{"source":"input","score":1}"#);
    assert_eq!(
        ids(&get(&s, &p(&format!("?filter={filter}"))).await),
        vec![("".into(), "2".into()), ("child".into(), "2".into())]
    );
    let filter = urlencode(r#"{"missing":null}"#);
    assert_eq!(
        ids(&get(&s, &p(&format!("?filter={filter}"))).await).len(),
        4
    );
    let bad = get(&s, &p("?filter=notjson")).await;
    assert_eq!(bad.status, 400);
    assert_eq!(bad.body["field"], "filter");
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[tokio::test]
async fn writes_keep_the_first_ordinary_write_and_replace_special_ones() {
    let s = server();
    let run = "run_t3";
    put_cp(
        &s,
        run,
        TOKEN_A,
        cp("t3", "", "1", None, json!({}), json!([])),
    )
    .await;
    let w = |task: &str, path: &str, writes: Value| json!({ "thread": "t3", "checkpointId": "1", "taskId": task, "taskPath": path, "writes": writes });
    let one = |idx: i32, ch: &str, data: &str| json!({ "idx": idx, "channel": ch, "type": "json", "data": data });
    for (task, path, writes) in [
        ("tb", "p2", json!([one(0, "a", "first"), one(1, "b", "B")])),
        ("tb", "p2", json!([one(0, "a", "second")])),
        ("ta", "p1", json!([one(-1, "__error__", "E1")])),
        ("ta", "p1", json!([one(-1, "__error__", "E2")])),
    ] {
        let a = put_writes(&s, run, WORKER_A, w(task, path, writes)).await;
        assert_eq!(a.status, 200, "{}", a.body);
    }
    let got = get(&s, &run_path(run, "/thread/checkpoint?checkpointId=1")).await;
    let writes: Vec<(String, i64, String, String)> = got.body["checkpoint"]["writes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["taskId"].as_str().unwrap().into(),
                w["idx"].as_i64().unwrap(),
                w["channel"].as_str().unwrap().into(),
                w["data"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        writes,
        vec![
            ("ta".into(), -1, "__error__".into(), "E2".into()),
            ("tb".into(), 0, "a".into(), "first".into()),
            ("tb".into(), 1, "b".into(), "B".into()),
        ]
    );
    // A park from writes: the run parks on the writes record, readable
    // like any park; the same request again keeps it.
    let mut parked = w("tc", "p3", json!([one(-3, "__interrupt__", "I")]));
    parked["park"] = json!({ "request": { "type": "langgraph-interrupt", "value": "approve?" } });
    assert_eq!(
        put_writes(&s, run, WORKER_A, parked.clone()).await.status,
        200
    );
    let pending = get(&s, &run_path(run, "/checkpoints/pending")).await;
    let park_id = pending.body["checkpoint"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(park_id.starts_with("tw-"), "{park_id}");
    let answer = send(
        &s,
        reqwest::Method::POST,
        &run_path(run, &format!("/checkpoints/by-id/{park_id}/answer")),
        TOKEN_A,
        Some(json!({ "resolution": { "action": "answer", "decision": "yes" } })),
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(put_writes(&s, run, WORKER_A, parked).await.status, 200);
    let got = get(&s, &run_path(run, "/thread/checkpoint?checkpointId=1")).await;
    let park = &got.body["checkpoint"]["park"];
    assert_eq!(park["checkpoint"], park_id.as_str());
    assert_eq!(
        park["pending"]["decision"], "yes",
        "the answer is kept: {park}"
    );
    assert_eq!(park["pending"]["request"]["value"], "approve?");
    // A park request without a type is refused.
    let mut bad = w("tc", "p3", json!([]));
    bad["park"] = json!({ "request": {} });
    assert_eq!(put_writes(&s, run, WORKER_A, bad).await.status, 400);
}

#[tokio::test]
async fn every_thread_write_is_fenced_and_bound_to_the_claiming_token() {
    let s = server();
    let run = "run_t4";
    let claim = |holder: &str| json!({ "holder": holder, "ttlMs": 60000 });
    let c = send(
        &s,
        reqwest::Method::POST,
        &run_path(run, "/claim"),
        WORKER_A,
        Some(claim("w1")),
    )
    .await;
    assert_eq!(c.body["lease"]["fence"], 1, "{}", c.body);
    let mut body = cp("t4", "", "1", None, json!({}), json!([]));
    body["fence"] = json!(1);
    assert_eq!(put_cp(&s, run, WORKER_A, body.clone()).await.status, 200);
    // Another worker token presenting the holder's fence: 403.
    assert_eq!(put_cp(&s, run, WORKER_A2, body.clone()).await.status, 403);
    // An unfenced worker write to the held run: 403. A reader: 403.
    let mut unfenced = body.clone();
    unfenced.as_object_mut().unwrap().remove("fence");
    assert_eq!(
        put_cp(&s, run, WORKER_A, unfenced.clone()).await.status,
        403
    );
    assert_eq!(put_cp(&s, run, READER_A, unfenced).await.status, 403);
    // The operator takes the run over (release, then claim: fence 3);
    // the first holder's fence is refused on every write route.
    let r = send(
        &s,
        reqwest::Method::POST,
        &run_path(run, "/release"),
        TOKEN_A,
        Some(json!({})),
    )
    .await;
    assert_eq!(r.body["done"], true, "{}", r.body);
    let c = send(
        &s,
        reqwest::Method::POST,
        &run_path(run, "/claim"),
        WORKER_A2,
        Some(claim("w2")),
    )
    .await;
    assert_eq!(c.body["lease"]["fence"], 3, "{}", c.body);
    let mut stale = cp("t4", "", "2", Some("1"), json!({}), json!([]));
    stale["fence"] = json!(1);
    let a = put_cp(&s, run, WORKER_A, stale).await;
    assert_eq!(a.status, 409, "{}", a.body);
    assert!(
        a.body["type"].as_str().unwrap().ends_with("fenced-out"),
        "{}",
        a.body
    );
    assert_eq!(
        (a.body["presented"].clone(), a.body["current"].clone()),
        (json!(1), json!(3))
    );
    let w = json!({ "thread": "t4", "checkpointId": "1", "taskId": "t", "writes": [
        { "idx": 0, "channel": "a", "type": "json", "data": "x" } ], "fence": 1 });
    assert_eq!(put_writes(&s, run, WORKER_A, w).await.status, 409);
    let d = send(
        &s,
        reqwest::Method::DELETE,
        &run_path(run, "/thread?fence=1"),
        WORKER_A,
        None,
    )
    .await;
    assert_eq!(d.status, 409, "{}", d.body);
    // The chain holds exactly the legitimate checkpoint.
    let all = get(&s, &run_path(run, "/thread/checkpoints")).await;
    assert_eq!(all.body["checkpoints"].as_array().unwrap().len(), 1);
    // The new holder writes and deletes.
    let mut ok = cp("t4", "", "2", Some("1"), json!({}), json!([]));
    ok["fence"] = json!(3);
    assert_eq!(put_cp(&s, run, WORKER_A2, ok).await.status, 200);
    let d = send(
        &s,
        reqwest::Method::DELETE,
        &run_path(run, "/thread?fence=3"),
        WORKER_A2,
        None,
    )
    .await;
    assert_eq!(
        (d.status, d.body["checkpointCount"].clone()),
        (200, json!(2))
    );
}

#[tokio::test]
async fn deleting_a_thread_leaves_other_threads_and_listing_spans_threads() {
    let s = server();
    for (run, thread, ids) in [("run_ta", "a", ["1", "3"]), ("run_tb", "b", ["2", "4"])] {
        for id in ids {
            put_cp(
                &s,
                run,
                TOKEN_A,
                cp(thread, "", id, None, json!({}), json!([])),
            )
            .await;
        }
        let w = json!({ "thread": thread, "checkpointId": ids[0], "taskId": "t", "writes": [
            { "idx": 0, "channel": "a", "type": "json", "data": "x" } ] });
        put_writes(&s, run, TOKEN_A, w).await;
    }
    let tenant_path = |q: &str| {
        format!(
            "/v1/tenants/{}/thread-checkpoints?project={}&session={}{q}",
            support::tenant(),
            support::project(),
            support::session()
        )
    };
    let listed = |a: &Answer| -> Vec<(String, String)> {
        a.body["checkpoints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["thread"].as_str().unwrap().to_string(),
                    c["checkpointId"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let all = get(&s, &tenant_path("")).await;
    assert_eq!(all.status, 200, "{}", all.body);
    assert_eq!(
        listed(&all),
        vec![
            ("b".into(), "4".into()),
            ("a".into(), "3".into()),
            ("b".into(), "2".into()),
            ("a".into(), "1".into())
        ]
    );
    assert_eq!(
        listed(&get(&s, &tenant_path("&limit=2&before=4")).await),
        vec![("a".into(), "3".into()), ("b".into(), "2".into())]
    );
    // With `ns` each thread is paged without the scan: the same answers.
    assert_eq!(
        listed(&get(&s, &tenant_path("&ns=&limit=2&before=4")).await),
        vec![("a".into(), "3".into()), ("b".into(), "2".into())]
    );
    assert_eq!(
        get(&s, &tenant_path("&ns=&limit=10")).await.body,
        get(&s, &tenant_path("")).await.body
    );
    let d = send(
        &s,
        reqwest::Method::DELETE,
        &run_path("run_ta", "/thread"),
        TOKEN_A,
        None,
    )
    .await;
    assert_eq!(
        (d.status, d.body["checkpointCount"].clone()),
        (200, json!(3))
    );
    let gone = get(&s, &run_path("run_ta", "/thread/checkpoints")).await;
    assert_eq!(gone.body["checkpoints"], json!([]));
    assert_eq!(
        listed(&get(&s, &tenant_path("")).await),
        vec![("b".into(), "4".into()), ("b".into(), "2".into())]
    );
    let kept = get(&s, &run_path("run_tb", "/thread/checkpoint?checkpointId=2")).await;
    assert_eq!(
        kept.body["checkpoint"]["writes"].as_array().unwrap().len(),
        1
    );
    // Deleting an unknown thread is a no-op.
    let d = send(
        &s,
        reqwest::Method::DELETE,
        &run_path("run_none", "/thread"),
        TOKEN_A,
        None,
    )
    .await;
    assert_eq!(
        (d.status, d.body["checkpointCount"].clone()),
        (200, json!(0))
    );
}

fn interrupt_batch(thread: &str, task: &str, ids: &[&str], resume: Option<Value>) -> Value {
    let interrupts: Vec<Value> = ids
        .iter()
        .map(|id| json!({ "id": id, "value": format!("ask {id}") }))
        .collect();
    let mut b = json!({
        "thread": thread,
        "checkpointId": "1",
        "taskId": task,
        "writes": [{ "idx": -3, "channel": "__interrupt__", "type": "json", "data": task }],
        "park": { "request": {
            "type": "langgraph-interrupt",
            "thread": thread,
            "checkpointId": "1",
            "taskId": task,
            "interrupts": interrupts,
        } },
    });
    if let Some(r) = resume {
        b["resume"] = r;
    }
    b
}

async fn park_of(s: &TestServer, run: &str) -> Value {
    let got = get(s, &run_path(run, "/thread/checkpoint?checkpointId=1")).await;
    assert_eq!(got.status, 200, "{}", got.body);
    got.body["checkpoint"]["park"]["pending"].clone()
}

#[tokio::test]
async fn two_tasks_interrupting_in_one_step_leave_one_open_park_with_both() {
    let s = server();
    let run = "run_t6";
    put_cp(
        &s,
        run,
        TOKEN_A,
        cp("t6", "", "1", None, json!({}), json!([])),
    )
    .await;
    for (task, ids) in [
        ("ta", vec!["i1"]),
        ("tb", vec!["i2", "i1"]),
        ("ta", vec!["i1"]),
    ] {
        let a = put_writes(&s, run, WORKER_A, interrupt_batch("t6", task, &ids, None)).await;
        assert_eq!(a.status, 200, "{}", a.body);
    }
    let pending = park_of(&s, run).await;
    assert!(pending["resolvedAt"].is_null(), "{pending}");
    let interrupts: Vec<(String, String)> = pending["request"]["interrupts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["id"].as_str().unwrap().to_string(),
                i["taskId"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        interrupts,
        vec![("i1".into(), "ta".into()), ("i2".into(), "tb".into())],
        "the union by id, in arrival order, each with its task"
    );
    // Both tasks' writes are kept.
    let got = get(&s, &run_path(run, "/thread/checkpoint?checkpointId=1")).await;
    assert_eq!(
        got.body["checkpoint"]["writes"].as_array().unwrap().len(),
        2
    );
}

#[tokio::test]
async fn resume_closes_an_outstanding_park_and_never_an_answered_one() {
    let s = server();
    let run = "run_t7";
    put_cp(
        &s,
        run,
        TOKEN_A,
        cp("t7", "", "1", None, json!({}), json!([])),
    )
    .await;
    let a = put_writes(
        &s,
        run,
        WORKER_A,
        interrupt_batch("t7", "ta", &["i1"], None),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    // A batch without `resume` leaves the park open.
    let plain = json!({ "thread": "t7", "checkpointId": "1", "taskId": "tz", "writes": [] });
    assert_eq!(
        put_writes(&s, run, WORKER_A, plain.clone()).await.status,
        200
    );
    assert!(park_of(&s, run).await["resolvedAt"].is_null());
    let mut resume = plain.clone();
    resume["resume"] = json!({ "approved": true });
    assert_eq!(put_writes(&s, run, WORKER_A, resume).await.status, 200);
    let closed = park_of(&s, run).await;
    assert!(closed["resolvedAt"].is_i64(), "{closed}");
    assert_eq!(closed["decision"], json!({ "approved": true }));
    let pending = get(&s, &run_path(run, "/checkpoints/pending")).await;
    assert!(pending.body["checkpoint"].is_null(), "{}", pending.body);
    // A second resume does not overwrite the first answer.
    let mut again = plain;
    again["resume"] = json!("no");
    assert_eq!(put_writes(&s, run, WORKER_A, again).await.status, 200);
    let kept = park_of(&s, run).await;
    assert_eq!(kept["decision"], json!({ "approved": true }));
    assert_eq!(kept["resolvedAt"], closed["resolvedAt"]);
    // After an answer, a new interrupt at the same checkpoint replaces it.
    let a = put_writes(
        &s,
        run,
        WORKER_A,
        interrupt_batch("t7", "tb", &["i9"], None),
    )
    .await;
    assert_eq!(a.status, 200);
    let new = park_of(&s, run).await;
    assert!(new["resolvedAt"].is_null(), "{new}");
    assert_eq!(new["request"]["interrupts"][0]["id"], "i9");
    assert_eq!(new["request"]["interrupts"].as_array().unwrap().len(), 1);
}

/// `Command(resume="one")` on a node that asks twice: LangGraph sends the
/// resume (null task) and the node's next interrupt at once, so the
/// interrupt can be stored first. The resume names the interrupt it was
/// made for (`resumeOf`) and answers only that one; the second question
/// stays waiting. Both savers' shapes: the node's batch answering the first
/// question itself (Python) or only asking (LangGraph.js, merged into the
/// open park).
#[tokio::test]
async fn a_resume_overtaken_by_the_next_question_leaves_that_question_waiting() {
    let s = server();
    for (run, node_answers) in [("run_t7a", true), ("run_t7b", false)] {
        let thread = format!("t-{run}");
        put_cp(
            &s,
            run,
            TOKEN_A,
            cp(&thread, "", "1", None, json!({}), json!([])),
        )
        .await;
        let first = interrupt_batch(&thread, "node", &["i1"], None);
        assert_eq!(put_writes(&s, run, WORKER_A, first).await.status, 200);
        let mut next =
            interrupt_batch(&thread, "node", &["i2"], node_answers.then(|| json!("one")));
        if node_answers {
            next["resumeOf"] = json!(["i1"]);
        }
        let a = put_writes(&s, run, WORKER_A, next).await;
        assert_eq!(a.status, 200, "{}", a.body);
        let null = |value: &str, of: &str| {
            json!({
                "thread": thread, "checkpointId": "1",
                "taskId": "00000000-0000-0000-0000-000000000000",
                "writes": [{ "idx": -4, "channel": "__resume__", "type": "json", "data": value }],
                "resume": value, "resumeOf": [of],
            })
        };
        let late = put_writes(&s, run, WORKER_A, null("one", "i1")).await;
        assert_eq!(late.status, 200, "{}", late.body);
        let pending = get(&s, &run_path(run, "/checkpoints/pending")).await;
        let park = &pending.body["checkpoint"]["pending"];
        assert!(park["resolvedAt"].is_null(), "{run}: {}", pending.body);
        let ids: Vec<&str> = park["request"]["interrupts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["i2"], "{run}: the second question alone waits");
        assert_eq!(park_of(&s, run).await, *park);
        // Its own answer closes it.
        assert_eq!(
            put_writes(&s, run, WORKER_A, null("two", "i2"))
                .await
                .status,
            200
        );
        let closed = park_of(&s, run).await;
        assert_eq!(closed["decision"], json!("two"), "{run}: {closed}");
        let pending = get(&s, &run_path(run, "/checkpoints/pending")).await;
        assert!(pending.body["checkpoint"].is_null(), "{}", pending.body);
    }
}

async fn delete_cps(s: &TestServer, run: &str, token: &str, body: Value) -> Answer {
    send(
        s,
        reqwest::Method::POST,
        &run_path(run, "/thread/checkpoints/delete"),
        token,
        Some(body),
    )
    .await
}

#[tokio::test]
async fn deleting_chosen_checkpoints_is_fenced_and_takes_their_writes() {
    let s = server();
    let run = "run_t8";
    let c = send(
        &s,
        reqwest::Method::POST,
        &run_path(run, "/claim"),
        WORKER_A,
        Some(json!({ "holder": "w1", "ttlMs": 60000 })),
    )
    .await;
    assert_eq!(c.body["lease"]["fence"], 1, "{}", c.body);
    for (ns, id) in [("", "1"), ("", "2"), ("", "3"), ("sub", "2")] {
        let mut b = cp("t8", ns, id, None, json!({}), json!([]));
        b["fence"] = json!(1);
        assert_eq!(put_cp(&s, run, WORKER_A, b).await.status, 200);
        let w = json!({ "thread": "t8", "ns": ns, "checkpointId": id, "taskId": "t",
            "writes": [{ "idx": 0, "channel": "c", "type": "json", "data": "x" }], "fence": 1 });
        assert_eq!(put_writes(&s, run, WORKER_A, w).await.status, 200);
    }
    let total = || async {
        get(&s, &run_path(run, "/checkpoints?fields=summary"))
            .await
            .body
            .as_array()
            .map(Vec::len)
    };
    assert_eq!(total().await, Some(8));
    // A renewal moves the fence to 2: fence 1 is stale, nothing is deleted.
    let c = send(
        &s,
        reqwest::Method::POST,
        &run_path(run, "/claim"),
        WORKER_A,
        Some(json!({ "holder": "w1", "ttlMs": 60000 })),
    )
    .await;
    assert_eq!(c.body["lease"]["fence"], 2, "{}", c.body);
    let body = |fence: u64| {
        json!({ "checkpoints": [
            { "ns": "", "checkpointId": "1" },
            { "ns": "sub", "checkpointId": "2" },
            { "ns": "", "checkpointId": "nope" },
        ], "fence": fence })
    };
    let stale = delete_cps(&s, run, WORKER_A, body(1)).await;
    assert_eq!(stale.status, 409, "{}", stale.body);
    assert_eq!(total().await, Some(8), "a refused delete deletes nothing");
    // Bad input is refused before anything is deleted.
    let mut bad = body(2);
    bad["checkpoints"][1]["checkpointId"] = json!("");
    assert_eq!(delete_cps(&s, run, WORKER_A, bad).await.status, 400);
    assert_eq!(total().await, Some(8));
    let ok = delete_cps(&s, run, WORKER_A, body(2)).await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(ok.body, json!({ "deleted": 2 }));
    assert_eq!(total().await, Some(4));
    let left = get(&s, &run_path(run, "/thread/checkpoints")).await;
    let ids: Vec<(String, String)> = left.body["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["ns"].as_str().unwrap().into(),
                c["checkpointId"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(ids, vec![("".into(), "3".into()), ("".into(), "2".into())]);
}

/// Counts the reads the thread routes make of the store.
#[derive(Debug, Default)]
struct CountingReads {
    inner: runkeep::MemoryStore,
    scans: std::sync::atomic::AtomicU64,
    point_reads: std::sync::atomic::AtomicU64,
}

#[async_trait::async_trait]
impl runkeep_conformance::intercept::Intercept for CountingReads {
    fn inner(&self) -> &dyn runkeep::RunStore {
        &self.inner
    }
    async fn read_checkpoint(
        &self,
        scope: &runkeep::RunScope,
        id: &runkeep::CheckpointId,
    ) -> runkeep::Result<Option<runkeep::Checkpoint>> {
        self.point_reads
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        runkeep::CheckpointStore::read_checkpoint(&self.inner, scope, id).await
    }
    async fn list_checkpoints(
        &self,
        scope: &runkeep::RunScope,
    ) -> runkeep::Result<Vec<runkeep::Checkpoint>> {
        self.scans.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        runkeep::CheckpointStore::list_checkpoints(&self.inner, scope).await
    }
}

/// 1 000 checkpoints in the root namespace and 100 in a subgraph's, each
/// changing one of three channels: the latest read and a page of 5 never
/// scan the thread and read a bounded number of records, and answer what
/// the scan answers.
#[tokio::test]
async fn the_latest_read_and_a_page_read_only_what_they_return() {
    use std::sync::atomic::Ordering::SeqCst;
    let counting = Arc::new(runkeep_conformance::intercept::Intercepted(
        CountingReads::default(),
    ));
    let s = TestServer::start(counting.clone());
    let run = "run_t9";
    let id = |i: usize| format!("1ef{i:05}");
    for (ns, n) in [("", 1000usize), ("sub:1", 100)] {
        for i in 1..=n {
            let channel = ["c", "a", "b"][i % 3];
            let versions = json!({
                "a": format!("{}", i.div_ceil(3)),
                "b": format!("{}", (i + 1) / 3),
                "c": format!("{}", i / 3),
            });
            let parent = (i > 1).then(|| id(i - 1));
            let body = cp(
                "t9",
                ns,
                &id(i),
                parent.as_deref(),
                versions.clone(),
                json!([blob(
                    channel,
                    versions[channel].as_str().unwrap(),
                    &format!("{ns}{i}")
                )]),
            );
            let a = put_cp(&s, run, TOKEN_A, body).await;
            assert_eq!(a.status, 200, "{}", a.body);
        }
    }
    let before = (
        counting.scans.load(SeqCst),
        counting.point_reads.load(SeqCst),
    );
    let latest = get(&s, &run_path(run, "/thread/checkpoint")).await;
    let sub = get(&s, &run_path(run, "/thread/checkpoint?ns=sub%3A1")).await;
    let page = get(
        &s,
        &run_path(run, "/thread/checkpoints?ns=&limit=5&before=1ef00500"),
    )
    .await;
    let after = (
        counting.scans.load(SeqCst),
        counting.point_reads.load(SeqCst),
    );
    assert_eq!(after.0, before.0, "no read scanned the thread");
    // Latest: its record, two blob records, its writes record = 4 reads.
    // A page of 5: 5 × 4 at most.
    assert!(
        after.1 - before.1 <= 4 + 4 + 20,
        "{} point reads",
        after.1 - before.1
    );
    let l = &latest.body["checkpoint"];
    assert_eq!(l["checkpointId"], "1ef01000");
    assert_eq!(
        values(l),
        vec![
            ("a".into(), "334".into(), "1000".into()),
            ("b".into(), "333".into(), "998".into()),
            ("c".into(), "333".into(), "999".into()),
        ]
    );
    assert_eq!(sub.body["checkpoint"]["checkpointId"], "1ef00100");
    let ids: Vec<&str> = page.body["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["checkpointId"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        ["1ef00499", "1ef00498", "1ef00497", "1ef00496", "1ef00495"]
    );
    // The same answers as the scan (a listing of everything takes it).
    let all = get(&s, &run_path(run, "/thread/checkpoints?ns=")).await;
    assert!(counting.scans.load(SeqCst) > after.0);
    let all = all.body["checkpoints"].as_array().unwrap().clone();
    assert_eq!(all.len(), 1000);
    assert_eq!(&all[0], l);
    assert_eq!(
        &all[501..506],
        page.body["checkpoints"].as_array().unwrap().as_slice()
    );
}

/// Records written before layout v2 (no `locations`) read back as before,
/// through the scan.
#[tokio::test]
async fn records_of_the_old_layout_still_read_back() {
    let store = Arc::new(runkeep::MemoryStore::new());
    let s = TestServer::start(store.clone());
    let scope = support::run("run_t10");
    for (i, blobs) in [
        (1, json!([blob("a", "1", "A1"), blob("b", "1", "B1")])),
        (2, json!([blob("a", "2", "A2")])),
    ] {
        let mut state = serde_json::Map::new();
        state.insert("threadRecord".into(), json!("checkpoint"));
        state.insert("thread".into(), json!("t10"));
        state.insert("ns".into(), json!(""));
        state.insert("checkpointId".into(), json!(format!("{i}")));
        state.insert(
            "checkpoint".into(),
            json!({ "id": format!("{i}"), "channel_versions": { "a": format!("{i}"), "b": "1" } }),
        );
        state.insert("metadata".into(), json!({ "step": i }));
        state.insert("blobs".into(), blobs);
        let cp = runkeep::Checkpoint {
            id: runkeep::CheckpointId::new(format!("tc-0-r{i}")).unwrap(),
            created_at: runkeep::Timestamp::now(),
            run_created_at: None,
            pending: None,
            fence: None,
            state,
        };
        runkeep::CheckpointStore::write_checkpoint(store.as_ref(), &scope, &cp, None)
            .await
            .unwrap();
    }
    let run = scope.run_id.to_string();
    let latest = get(&s, &run_path(&run, "/thread/checkpoint")).await;
    assert_eq!(
        latest.body["checkpoint"]["checkpointId"], "2",
        "{}",
        latest.body
    );
    assert_eq!(
        values(&latest.body["checkpoint"]),
        vec![
            ("a".into(), "2".into(), "A2".into()),
            ("b".into(), "1".into(), "B1".into())
        ]
    );
    // A v2 checkpoint on top of old ones: its untouched channel is found
    // through the scan too.
    let a = put_cp(
        &s,
        &run,
        TOKEN_A,
        cp(
            "t10",
            "",
            "3",
            Some("2"),
            json!({ "a": "3", "b": "1" }),
            json!([blob("a", "3", "A3")]),
        ),
    )
    .await;
    assert_eq!(a.status, 200);
    let page = get(&s, &run_path(&run, "/thread/checkpoints?ns=&limit=2")).await;
    let got: Vec<_> = page.body["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(values)
        .collect();
    assert_eq!(
        got,
        vec![
            vec![
                ("a".into(), "3".into(), "A3".into()),
                ("b".into(), "1".into(), "B1".into())
            ],
            vec![
                ("a".into(), "2".into(), "A2".into()),
                ("b".into(), "1".into(), "B1".into())
            ],
        ]
    );
}
