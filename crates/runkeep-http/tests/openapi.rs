//! The committed OpenAPI document (`crates/runkeep-http/openapi.json`) is
//! the one the code generates; it documents every operation of the table,
//! and every rule it states agrees with the constant it comes from.

use std::path::PathBuf;

use runkeep_http::{openapi, routes};

const REGENERATE: &str = "RUNKEEP_WRITE_OPENAPI=1 cargo test -p runkeep-http --test openapi";

fn committed_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("openapi.json")
}

#[test]
fn the_committed_openapi_document_is_the_generated_one() {
    let generated = openapi::json();
    let path = committed_path();
    if std::env::var_os("RUNKEEP_WRITE_OPENAPI").is_some() {
        std::fs::write(&path, &generated).expect("write openapi.json");
        eprintln!("wrote {}", path.display());
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e}; regenerate it with: {REGENERATE}",
            path.display()
        )
    });
    if committed != generated {
        let line = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .map(|i| i + 1)
            .unwrap_or_else(|| committed.lines().count().min(generated.lines().count()) + 1);
        panic!(
            "crates/runkeep-http/openapi.json is not what the code generates (first difference at line {line}); regenerate it with: {REGENERATE}"
        );
    }
}

#[test]
fn the_document_is_openapi_3_1_and_has_every_route_of_the_table() {
    let doc: serde_json::Value = serde_json::from_str(&openapi::json()).unwrap();
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3.1"),
        "{}",
        doc["openapi"]
    );
    let table = routes::routes();
    for spec in &table {
        let op = &doc["paths"][&spec.path][spec.method.as_str().to_ascii_lowercase()];
        assert_eq!(
            op["operationId"], spec.operation,
            "{} {} is missing from the document",
            spec.method, spec.path
        );
        assert!(
            op["responses"]["401"].is_object(),
            "{}: no 401",
            spec.operation
        );
        if spec.role > runkeep_http::Role::Reader {
            assert!(
                op["responses"]["403"].is_object(),
                "{}: no 403",
                spec.operation
            );
        }
        // Every $ref points at a schema the document defines.
        let text = op.to_string();
        for r in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
            let name = &r[..r.find('"').unwrap()];
            assert!(
                doc["components"]["schemas"][name].is_object(),
                "{}: refers to the undefined schema {name}",
                spec.operation
            );
        }
    }
    let documented: usize = doc["paths"]
        .as_object()
        .unwrap()
        .values()
        .map(|p| p.as_object().unwrap().len())
        .sum();
    assert_eq!(
        documented,
        table.len(),
        "the document has operations the table lacks"
    );
}

/// Every integer the document describes has both bounds (an instant, a
/// fence, a count, a wait…; the wire types' attributes): an unbounded one would let
/// a generator send what the server refuses, or a client read what it
/// cannot represent.
#[test]
fn every_integer_of_the_document_is_bounded() {
    fn walk(v: &serde_json::Value, at: &str, unbounded: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                let integer = match m.get("type") {
                    Some(serde_json::Value::String(t)) => t == "integer",
                    Some(serde_json::Value::Array(ts)) => ts.iter().any(|t| t == "integer"),
                    _ => false,
                };
                if integer && !(m.contains_key("minimum") && m.contains_key("maximum")) {
                    unbounded.push(at.to_string());
                }
                for (k, v) in m {
                    walk(v, &format!("{at}/{k}"), unbounded);
                }
            }
            serde_json::Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    walk(v, &format!("{at}/{i}"), unbounded);
                }
            }
            _ => {}
        }
    }
    let mut unbounded = Vec::new();
    walk(&openapi::document(), "", &mut unbounded);
    assert!(
        unbounded.is_empty(),
        "integers without minimum and maximum (bound the field: #[schema(minimum = …, maximum = …)]): {unbounded:#?}"
    );
}

/// The schemas the document closes (`additionalProperties: false`) are the
/// wire types that refuse an unknown member, and every other object schema
/// a request body reaches takes one (so the document says what the server
/// does, both ways).
#[test]
fn closed_schemas_are_exactly_the_bodies_that_refuse_unknown_members() {
    use runkeep_http::wire;
    fn refuses_unknown<T: serde::de::DeserializeOwned>(sample: &str) -> bool {
        match serde_json::from_str::<T>(sample) {
            Ok(_) => false,
            Err(e) => {
                assert!(
                    e.to_string().contains("unknown field"),
                    "{}: {e}",
                    std::any::type_name::<T>()
                );
                true
            }
        }
    }
    // Every object schema a request body reaches, with a sample that is
    // valid but for one unknown member placed first.
    let unknown = r#"{"zzUnknown": 1}"#;
    let reached: Vec<(&str, bool)> = vec![
        (
            "AppendAuditBody",
            refuses_unknown::<wire::AppendAuditBody>(unknown),
        ),
        (
            "AppendEventsBody",
            refuses_unknown::<wire::AppendEventsBody>(unknown),
        ),
        (
            "CheckpointBody",
            refuses_unknown::<wire::CheckpointBody>(unknown),
        ),
        ("ClaimBody", refuses_unknown::<wire::ClaimBody>(unknown)),
        (
            "AttemptErrorBody",
            refuses_unknown::<wire::AttemptErrorBody>(unknown),
        ),
        ("CancelBody", refuses_unknown::<wire::CancelBody>(unknown)),
        (
            "FailAttemptBody",
            refuses_unknown::<wire::FailAttemptBody>(unknown),
        ),
        (
            "RetryPolicyBody",
            refuses_unknown::<wire::RetryPolicyBody>(unknown),
        ),
        (
            "ClaimNextBody",
            refuses_unknown::<wire::ClaimNextBody>(unknown),
        ),
        (
            "CommitStepBody",
            refuses_unknown::<wire::CommitStepBody>(unknown),
        ),
        ("EnqueueBody", refuses_unknown::<wire::EnqueueBody>(unknown)),
        (
            "ConcurrencyBody",
            refuses_unknown::<wire::ConcurrencyBody>(unknown),
        ),
        ("DedupeBody", refuses_unknown::<wire::DedupeBody>(unknown)),
        (
            "SetPriorityBody",
            refuses_unknown::<wire::SetPriorityBody>(unknown),
        ),
        ("FinishBody", refuses_unknown::<wire::FinishBody>(unknown)),
        (
            "HandOverBody",
            refuses_unknown::<wire::HandOverBody>(unknown),
        ),
        (
            "NewAuditBody",
            refuses_unknown::<wire::NewAuditBody>(unknown),
        ),
        (
            "NewEventBody",
            refuses_unknown::<wire::NewEventBody>(unknown),
        ),
        (
            "NextClaimBody",
            refuses_unknown::<wire::NextClaimBody>(unknown),
        ),
        ("OutcomeBody", refuses_unknown::<wire::OutcomeBody>(unknown)),
        ("PendingBody", refuses_unknown::<wire::PendingBody>(unknown)),
        ("PruneBody", refuses_unknown::<wire::PruneBody>(unknown)),
        (
            "PruneFinishedBody",
            refuses_unknown::<wire::PruneFinishedBody>(unknown),
        ),
        (
            "PutThreadCheckpointBody",
            refuses_unknown::<wire::threads::PutThreadCheckpointBody>(unknown),
        ),
        (
            "DeleteThreadCheckpointsBody",
            refuses_unknown::<wire::threads::DeleteThreadCheckpointsBody>(unknown),
        ),
        (
            "ThreadCheckpointRef",
            refuses_unknown::<wire::threads::ThreadCheckpointRef>(unknown),
        ),
        (
            "PutThreadWritesBody",
            refuses_unknown::<wire::threads::PutThreadWritesBody>(unknown),
        ),
        (
            "ThreadBlobBody",
            refuses_unknown::<wire::threads::ThreadBlobBody>(unknown),
        ),
        (
            "ThreadParkBody",
            refuses_unknown::<wire::threads::ThreadParkBody>(unknown),
        ),
        (
            "ThreadWriteBody",
            refuses_unknown::<wire::threads::ThreadWriteBody>(unknown),
        ),
        (
            "AdvanceScheduleBody",
            refuses_unknown::<wire::AdvanceScheduleBody>(unknown),
        ),
        (
            "ConcurrencyBody",
            refuses_unknown::<wire::ConcurrencyBody>(unknown),
        ),
        ("MissedBody", refuses_unknown::<wire::MissedBody>(unknown)),
        (
            "ScheduleBody",
            refuses_unknown::<wire::ScheduleBody>(unknown),
        ),
        ("RecordBody", refuses_unknown::<wire::RecordBody>(unknown)),
        ("ReleaseBody", refuses_unknown::<wire::ReleaseBody>(unknown)),
        ("ReportBody", refuses_unknown::<wire::ReportBody>(unknown)),
        ("ResolveBody", refuses_unknown::<wire::ResolveBody>(unknown)),
        (
            "ResolutionBody",
            refuses_unknown::<wire::ResolutionBody>(r#"{"zzUnknown": 1, "action": "expire"}"#),
        ),
        ("SnoozeBody", refuses_unknown::<wire::SnoozeBody>(unknown)),
        ("StepBody", refuses_unknown::<wire::StepBody>(unknown)),
        (
            "ClaimNextBatchBody",
            refuses_unknown::<wire::ClaimNextBatchBody>(unknown),
        ),
        (
            "CommitStepsBody",
            refuses_unknown::<wire::CommitStepsBody>(unknown),
        ),
        (
            "StepCommitBody",
            refuses_unknown::<wire::StepCommitBody>(unknown),
        ),
        ("RunAddress", refuses_unknown::<wire::RunAddress>(unknown)),
        (
            "StepMessagesBody",
            refuses_unknown::<wire::StepMessagesBody>(unknown),
        ),
        (
            "WriteCheckpointBody",
            refuses_unknown::<wire::WriteCheckpointBody>(unknown),
        ),
        (
            "WriteMessagesBody",
            refuses_unknown::<wire::WriteMessagesBody>(unknown),
        ),
    ];
    let doc = openapi::document();
    let schemas = &doc["components"]["schemas"];
    // The list above is every schema the request bodies reach.
    let mut seen = std::collections::BTreeSet::new();
    let mut todo: Vec<String> = doc["paths"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|item| item.as_object().unwrap().values())
        .filter_map(|op| op.pointer("/requestBody/content/application~1json/schema/$ref"))
        .map(|r| {
            r.as_str()
                .unwrap()
                .trim_start_matches("#/components/schemas/")
                .to_string()
        })
        .collect();
    while let Some(name) = todo.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        let text = schemas[&name].to_string();
        for r in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
            todo.push(r[..r.find('"').unwrap()].to_string());
        }
    }
    let enums: Vec<&str> = seen
        .iter()
        .filter(|n| schemas[n.as_str()].get("enum").is_some())
        .map(String::as_str)
        .collect();
    let listed: std::collections::BTreeSet<&str> = reached.iter().map(|(n, _)| *n).collect();
    let objects: std::collections::BTreeSet<&str> = seen
        .iter()
        .map(String::as_str)
        .filter(|n| !enums.contains(n))
        .collect();
    assert_eq!(
        listed, objects,
        "the test's list is every object schema a request body reaches"
    );
    for (name, refuses) in reached {
        let closed = schemas[name]["additionalProperties"] == serde_json::Value::Bool(false);
        assert_eq!(
            closed,
            refuses,
            "{name}: the server {} unknown members but the document {} it (serde's deny_unknown_fields closes a derived schema)",
            if refuses { "refuses" } else { "takes" },
            if closed { "closes" } else { "leaves open" }
        );
    }
}

/// The rules the wire types state as literals (`#[schema(maximum = …)]`,
/// `#[param(pattern = …)]`; utoipa's attributes take no constants) are the
/// core's: every bound, length and pattern of the document is one of the
/// rules below, each computed from the constant it states. A constant that
/// changes, or a literal mistyped, fails here.
#[test]
fn every_rule_of_the_document_is_computed_from_its_constant() {
    use runkeep_http::wire;
    let json_safe_max = (1i128 << 53) - 1;
    let bounds: Vec<(&str, i128, i128)> = vec![
        ("instant", 0, runkeep::time::MAX_TIMESTAMP_MS as i128),
        ("fence", 1, runkeep::lease::MAX_FENCE as i128),
        ("count (JSON-safe)", 0, json_safe_max),
        ("lease ttl", 1000, runkeep::time::MAX_TTL_MS as i128),
        ("wait", 0, wire::MAX_WAIT_MS as i128),
        ("attempts", 0, u32::MAX as i128),
        ("attempt limit", 1, u32::MAX as i128),
        ("HTTP status", 100, 599),
        ("pending write index", i32::MIN as i128, i32::MAX as i128),
        // Also a schedule's catch-up max (`MAX_CATCH_UP`, the same bounds).
        ("run listing limit", 1, runkeep::listing::MAX_LIMIT as i128),
        ("events page", 0, wire::MAX_EVENTS_PAGE as i128),
        ("checkpoints page", 0, wire::MAX_CHECKPOINTS_PAGE as i128),
        ("attempt timeout", 1, runkeep::time::MAX_TTL_MS as i128),
        (
            "retry delay",
            0,
            runkeep::failure::MAX_RETRY_CAP.as_millis() as i128,
        ),
        ("retry factor", 1, 100),
        (
            "priority",
            runkeep::Priority::MIN as i128,
            runkeep::Priority::MAX as i128,
        ),
        (
            "concurrency limit",
            1,
            runkeep::scheduling::concurrency::MAX_LIMIT as i128,
        ),
        (
            "dedupe window",
            1,
            runkeep::scheduling::dedupe::MAX_WINDOW_MS as i128,
        ),
        ("batch size", 1, runkeep::batch::MAX_BATCH as i128),
    ];
    let id = openapi::id_pattern();
    let max_id = runkeep::id::MAX_ID_LEN;
    let printable = |bytes: usize| {
        format!(
            "(?:[\\x20-\\x7e]{{1,{bytes}}}|[^\\x00-\\x1f\\x7f-\\x9f]{{1,{}}})",
            bytes / 4
        )
    };
    let tag = runkeep_http::holder::TAG.trim_start();
    let room = runkeep::id::MAX_HOLDER_LEN
        - runkeep_http::holder::TAG.len()
        - runkeep_http::holder::TOKEN_ID_LEN;
    let csv = |names: &[&str]| {
        let one = format!("(?:{})", names.join("|"));
        format!("^{one}(?:,{one})*$")
    };
    // (what, pattern, minLength, maxLength) as the document may state them.
    let patterns: Vec<(&str, String, Option<u64>, Option<u64>)> = vec![
        ("id", id.clone(), Some(1), Some(max_id as u64)),
        // A path parameter: the router has matched one segment already.
        ("id in a path", id.clone(), None, None),
        (
            "enqueued run",
            format!("^run_[A-Za-z0-9_-]{{0,{}}}$", max_id - 4),
            Some(4),
            Some(max_id as u64),
        ),
        (
            "holder",
            format!("^(?![\\s\\S]*{tag})(?=[\\s\\S]*\\S){}$", printable(room)),
            None,
            None,
        ),
        ("event type", format!("^{}$", printable(128)), None, None),
        (
            "park states",
            csv(&[
                runkeep::ParkState::Outstanding,
                runkeep::ParkState::Expired,
                runkeep::ParkState::Resolved,
            ]
            .map(|p| p.as_str())),
            None,
            None,
        ),
        (
            "run statuses",
            csv(&[
                runkeep::RunStatus::Active,
                runkeep::RunStatus::Completed,
                runkeep::RunStatus::Failed,
                runkeep::RunStatus::Cancelled,
            ]
            .map(|s| s.as_str())),
            None,
            None,
        ),
        ("SSE event id", "^[1-9][0-9]*$".to_string(), None, None),
        (
            "concurrency key",
            "^[A-Za-z0-9_.:@/-]+$".to_string(),
            Some(1),
            Some(runkeep::scheduling::concurrency::MAX_KEY_LEN as u64),
        ),
        (
            "schedule name",
            format!(
                "^[A-Za-z0-9][A-Za-z0-9_-]{{0,{}}}$",
                runkeep::scheduling::schedule::MAX_NAME_LEN - 1
            ),
            None,
            None,
        ),
        (
            "attempt error kind",
            "\\S".to_string(),
            Some(1),
            Some(runkeep::failure::MAX_ERROR_KIND_CHARS as u64),
        ),
    ];
    fn walk(v: &serde_json::Value, at: &str, found: &mut Vec<(String, serde_json::Value)>) {
        match v {
            serde_json::Value::Object(m) => {
                if ["minimum", "maximum", "pattern", "minLength", "maxLength"]
                    .iter()
                    .any(|k| m.contains_key(*k))
                {
                    found.push((at.to_string(), v.clone()));
                }
                for (k, v) in m {
                    walk(v, &format!("{at}/{k}"), found);
                }
            }
            serde_json::Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    walk(v, &format!("{at}/{i}"), found);
                }
            }
            _ => {}
        }
    }
    let mut found = Vec::new();
    walk(&openapi::document(), "", &mut found);
    let mut bad = Vec::new();
    let mut seen_bounds = std::collections::BTreeSet::new();
    let mut seen_patterns = std::collections::BTreeSet::new();
    for (at, schema) in &found {
        let int = |k: &str| {
            schema
                .get(k)
                .and_then(serde_json::Value::as_i64)
                .map(i128::from)
        };
        if let (Some(min), Some(max)) = (int("minimum"), int("maximum")) {
            match bounds.iter().find(|(_, lo, hi)| (*lo, *hi) == (min, max)) {
                Some((what, ..)) => {
                    seen_bounds.insert(*what);
                }
                None => bad.push(format!("{at}: bounds {min}..={max} are no rule's")),
            }
        }
        let len = |k: &str| schema.get(k).and_then(serde_json::Value::as_u64);
        match schema.get("pattern").and_then(serde_json::Value::as_str) {
            Some(p) if at.ends_with("/filter/schema") || p.starts_with("^\\{") => {
                // The metadata filter's pattern is computed by its type.
            }
            Some(p) => {
                let lengths = (len("minLength"), len("maxLength"));
                match patterns
                    .iter()
                    .find(|(_, q, lo, hi)| q == p && (*lo, *hi) == lengths)
                {
                    Some((what, ..)) => {
                        seen_patterns.insert(*what);
                    }
                    None => bad.push(format!(
                        "{at}: pattern {p:?} with lengths {lengths:?} is no rule's"
                    )),
                }
            }
            None => {
                if let Some(max) = len("maxLength") {
                    let texts = [
                        runkeep::lifecycle::MAX_REASON_CHARS,
                        runkeep::failure::MAX_ERROR_MESSAGE_CHARS,
                        runkeep::scheduling::dedupe::MAX_KEY_LEN,
                    ];
                    if !texts.contains(&(max as usize)) {
                        bad.push(format!("{at}: maxLength {max} is no rule's"));
                    }
                }
            }
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
    // Every rule is used: a rule nothing states would be stale.
    assert_eq!(seen_bounds.len(), bounds.len(), "{seen_bounds:?}");
    assert_eq!(seen_patterns.len(), patterns.len(), "{seen_patterns:?}");
}
