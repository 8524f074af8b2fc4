//! System calls of `claim_next` + release with N runs queued, plain or
//! with 20 concurrency keys (the bench's `claim-next.keys20-N` queue: the
//! first 95 % of it in 19 keys held at their limit, so every call passes
//! them by), counted rather than timed: run it under `strace -c -f` with 0
//! and with M cycles, and subtract.
//!
//! ```text
//! strace -f -c -o base.txt target/release/examples/claim_next_cost <dir> keys20 1000 0
//! strace -f -c -o more.txt target/release/examples/claim_next_cost <dir2> keys20 1000 500
//! ```
//!
//! It also prints the cycles' wall time (stderr), for a rough look only:
//! the bench (`runkeep-bench --scaling --only claim-next`) is what times it.

use std::path::Path;

use runkeep::scheduling::Concurrency;
use runkeep::{
    Checkpoint, CheckpointId, CheckpointStore, ClaimNextFilter, ClaimOptions, EnqueueOptions,
    Holder, ListingScope, ProjectId, RunId, RunScope, SessionId, TenantId, Timestamp, Ttl,
};
use runkeep_fs::testing::inline;
use runkeep_fs::{Attribution, FsOptions, FsStore};

/// The bench's key of run `i` of `size`: keys 0–18 (limits 1–3) for the
/// first 95 %, key 19 after.
fn key_of(i: usize, size: usize) -> (usize, Concurrency) {
    let k = if i < size * 95 / 100 { i % 19 } else { 19 };
    (
        k,
        Concurrency::new(format!("key-{k:02}"), 1 + (k % 3) as u32).unwrap(),
    )
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(dir), Some(mix), Some(n), Some(m)) =
        (args.get(1), args.get(2), args.get(3), args.get(4))
    else {
        eprintln!("usage: claim_next_cost <fresh dir> <plain|keys20> <queued> <cycles>");
        std::process::exit(2);
    };
    let keyed = match mix.as_str() {
        "plain" => false,
        "keys20" => true,
        other => panic!("mix {other:?}: plain or keys20"),
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
    let scope = |name: &str| {
        RunScope::new(
            a.tenant_id.clone(),
            a.project_id.clone(),
            a.session_id.clone(),
            RunId::new(name).unwrap(),
        )
    };
    let cp = Checkpoint::new(
        CheckpointId::new("cp_1").unwrap(),
        Timestamp::from_millis(1_800_000_000_000).unwrap(),
        Default::default(),
    );
    for i in 0..n {
        let options = EnqueueOptions {
            concurrency: keyed.then(|| key_of(i, n).1),
            ..EnqueueOptions::default()
        };
        inline(store.enqueue(&scope(&format!("run_c{i:09}")), &cp, &options)).unwrap();
    }
    let opts = |who: &str| {
        ClaimOptions::new(
            Holder::new(who).unwrap(),
            Ttl::from_millis(600_000).unwrap(),
        )
    };
    if keyed {
        let mut held = [0u32; 19];
        for i in 0..n * 95 / 100 {
            let (k, c) = key_of(i, n);
            if held[k] < c.limit {
                let r = inline(store.claim(&scope(&format!("run_c{i:09}")), &opts("blocker")));
                assert!(r.unwrap().lease().is_some());
                held[k] += 1;
            }
        }
    }
    let listing = ListingScope::session(a.tenant_id.clone(), a.project_id.clone(), a.session_id);
    let o = opts("cycle");
    let t = std::time::Instant::now();
    for _ in 0..m {
        let (s, lease) = inline(store.claim_next(&listing, &ClaimNextFilter::default(), &o))
            .unwrap()
            .expect("a run to claim");
        assert!(inline(store.release(&s, lease.fence)).unwrap());
    }
    if m > 0 {
        eprintln!(
            "{mix} at {n}: {:.1} µs per claim_next + release ({m} cycles)",
            t.elapsed().as_secs_f64() * 1e6 / m as f64
        );
    }
}
