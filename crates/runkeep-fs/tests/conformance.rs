//! The directory backend passes the whole conformance kit, against a fresh
//! temp directory per case, at both durability levels, on a store clock the
//! kit moves (contract v2).

use std::sync::Arc;

use runkeep_conformance::{support, Fixture};
use runkeep_fs::{Attribution, Durability, FsOptions, FsStore};

fn open(durability: Durability) -> Fixture {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = support::store_clock();
    let store = FsStore::open(
        dir.path().join("runs"),
        FsOptions {
            attribution: Some(Attribution {
                tenant_id: support::tenant(),
                project_id: support::project(),
                session_id: support::session(),
            }),
            durability,
            clock: Some(Arc::new(clock.clone())),
            ..Default::default()
        },
    )
    .expect("open the store");
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
