//! The root of many sessions (`FsRootStore`) passes the whole conformance
//! kit, against a fresh temp root per case, at both durability levels, on
//! a store clock the kit moves. Where the single-session store refuses a
//! foreign tenant's write (`keeps_one_tenants_runs_out_of_another_tenants_listing`
//! takes its refusal branch), the root takes the other: it holds both
//! tenants and lists each apart.

use std::sync::Arc;

use runkeep_conformance::{support, Fixture};
use runkeep_fs::{Durability, FsRootOptions, FsRootStore};

fn open(durability: Durability) -> Fixture {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = support::store_clock();
    let store = FsRootStore::open(
        dir.path().join("root"),
        FsRootOptions {
            durability,
            clock: Some(Arc::new(clock.clone())),
            ..Default::default()
        },
    )
    .expect("open the root");
    Fixture::new(Arc::new(store), 3, dir).with_clock(clock)
}

async fn process_crash() -> Fixture {
    open(Durability::ProcessCrash)
}

async fn power_loss() -> Fixture {
    open(Durability::PowerLoss)
}

runkeep_conformance::conformance_tests!(process_crash);

mod power_loss_durability {
    use super::power_loss;
    runkeep_conformance::conformance_tests!(power_loss);
}
