//! System calls of a fenced checkpoint write at N checkpoints (O(1)
//! work on the checkpoints directory), counted rather than timed: run it under `strace -c -f` twice
//! for each N, with and without the measured writes, and subtract.
//!
//! ```text
//! strace -f -c -o base.txt  target/release/examples/write_syscalls <dir> 10000 0
//! strace -f -c -o more.txt  target/release/examples/write_syscalls <dir> 10000 200
//! ```
//!
//! The first `N` writes fill the run (one store, one claim); the last `M`
//! are the measured ones, each a 4 KiB checkpoint under the same fence.

use std::path::Path;

use runkeep::{
    Checkpoint, CheckpointId, CheckpointStore, ClaimOptions, Holder, ProjectId, RunId, RunScope,
    SessionId, TenantId, Timestamp, Ttl,
};
use runkeep_fs::testing::inline;
use runkeep_fs::{Attribution, FsOptions, FsStore};
use serde_json::{json, Map};

fn checkpoint(id: &str) -> Checkpoint {
    let mut state = Map::new();
    state.insert(
        "messages".into(),
        json!([{"role": "user", "content": "x".repeat(4000)}]),
    );
    Checkpoint::new(
        CheckpointId::new(id).unwrap(),
        Timestamp::from_millis(1_800_000_000_000).unwrap(),
        state,
    )
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(dir), Some(n), Some(m)) = (args.get(1), args.get(2), args.get(3)) else {
        eprintln!("usage: write_syscalls <fresh dir> <checkpoints first> <measured writes>");
        std::process::exit(2);
    };
    let (n, m): (usize, usize) = (n.parse().unwrap(), m.parse().unwrap());
    let a = Attribution {
        tenant_id: TenantId::new("tnt_bench").unwrap(),
        project_id: ProjectId::new("prj_bench").unwrap(),
        session_id: SessionId::new("ses_bench").unwrap(),
    };
    let store = FsStore::open(
        Path::new(dir),
        FsOptions {
            attribution: Some(a.clone()),
            ..Default::default()
        },
    )
    .unwrap();
    let s = RunScope::new(
        a.tenant_id,
        a.project_id,
        a.session_id,
        RunId::new("run_writes").unwrap(),
    );
    let opts = ClaimOptions::new(
        Holder::new("bench").unwrap(),
        Ttl::from_millis(3_600_000).unwrap(),
    );
    let fence = inline(store.claim(&s, &opts))
        .unwrap()
        .lease()
        .unwrap()
        .fence;
    for i in 0..n + m {
        inline(store.write_checkpoint(&s, &checkpoint(&format!("cp_{i:06}")), Some(fence)))
            .unwrap();
    }
}
