//! The committed OpenAPI document (`crates/runkeep-server/openapi.json`) is
//! the one the code generates, and it documents every route of the table.

use std::path::PathBuf;

use runkeep_server::{api, openapi};

const REGENERATE: &str = "RUNKEEP_WRITE_OPENAPI=1 cargo test -p runkeep-server --test openapi";

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
            "crates/runkeep-server/openapi.json is not what the code generates (first difference at line {line}); regenerate it with: {REGENERATE}"
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
    let table = api::route_table();
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
        if spec.role > runkeep_server::auth::Role::Reader {
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

/// The README's route table lists every route of the table (with `{run}`
/// and `{tenant}` standing for the per-run and tenant prefixes).
#[test]
fn the_readme_route_table_lists_every_route() {
    let readme =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("README.md"))
            .expect("README.md");
    for spec in api::route_table() {
        let short = if let Some(rest) = spec.path.strip_prefix(api::RUN) {
            format!("{{run}}{rest}")
        } else if let Some(rest) = spec.path.strip_prefix(api::TENANT) {
            format!("{{tenant}}{rest}")
        } else {
            spec.path.clone()
        };
        let row = format!("| `{} {short}` |", spec.method);
        assert!(
            readme.contains(&row),
            "README.md's route table lacks {row} ({})",
            spec.operation
        );
    }
}

/// Every integer the document describes has both bounds (an instant, a
/// fence, a count, a wait…; `openapi::tighten`): an unbounded one would let
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
        "integers without minimum and maximum (give their name a rule in openapi::integer_rule): {unbounded:#?}"
    );
}

/// The schemas the document closes (`additionalProperties: false`) are the
/// wire types that refuse an unknown member, and every other object schema
/// a request body reaches takes one (so the document says what the server
/// does, both ways).
#[test]
fn closed_schemas_are_exactly_the_bodies_that_refuse_unknown_members() {
    use runkeep_server::wire;
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
            "PutThreadCheckpointBody",
            refuses_unknown::<runkeep_server::wire_threads::PutThreadCheckpointBody>(unknown),
        ),
        (
            "PutThreadWritesBody",
            refuses_unknown::<runkeep_server::wire_threads::PutThreadWritesBody>(unknown),
        ),
        (
            "ThreadBlobBody",
            refuses_unknown::<runkeep_server::wire_threads::ThreadBlobBody>(unknown),
        ),
        (
            "ThreadParkBody",
            refuses_unknown::<runkeep_server::wire_threads::ThreadParkBody>(unknown),
        ),
        (
            "ThreadWriteBody",
            refuses_unknown::<runkeep_server::wire_threads::ThreadWriteBody>(unknown),
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
            "{name}: the server {} unknown members but the document {} it (openapi::CLOSED_SCHEMAS)",
            if refuses { "refuses" } else { "takes" },
            if closed { "closes" } else { "leaves open" }
        );
        assert_eq!(openapi::CLOSED_SCHEMAS.contains(&name), refuses, "{name}");
    }
}
