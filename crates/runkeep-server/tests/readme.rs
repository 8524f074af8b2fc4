//! The server's README documents every route of the operation table.

use std::path::PathBuf;

use runkeep_server::api;

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
