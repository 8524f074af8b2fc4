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
