//! The differential driver's sanity run: the reference model against
//! itself must agree on every answer and read-back. The fs store runs the
//! same driver in `crates/runkeep-fs/tests/differential.rs`.

use runkeep_conformance::differential;

#[test]
fn the_reference_model_agrees_with_itself_under_random_operations() {
    let config = differential::Config::default();
    let report = differential::check(differential::memory_fixture, config);
    eprintln!("differential (memory vs memory): {report:?}");
    assert_eq!(report.cases, config.cases);
    assert!(
        report.operations >= u64::from(config.cases) * config.min_ops as u64,
        "fewer operations ran than the sequences hold: {report:?}"
    );
    assert!(
        report.accepted * 3 >= report.operations,
        "most operations were refusals; the sequences test little: {report:?}"
    );
}
