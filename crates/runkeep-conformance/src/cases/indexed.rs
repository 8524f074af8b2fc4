//! The answers a backend may index (contract v2): `latest_checkpoint`,
//! `find_pending` and `resume_point` must agree with computing them from
//! the full read, `list_checkpoints`.

use std::sync::Arc;

use runkeep::{park, Checkpoint, ParkResolution, RunScope, RunStore, Timestamp};
use serde_json::json;

use crate::support::*;

/// Checks the three indexed answers against the full read at `now`.
async fn agree(store: &Arc<dyn RunStore>, scope: &RunScope, now: Timestamp, what: &str) {
    let all: Vec<Checkpoint> = store.list_checkpoints(scope).await.expect("list");
    let latest = store
        .latest_checkpoint(scope)
        .await
        .expect("latest_checkpoint");
    assert_eq!(
        latest.as_ref(),
        all.last(),
        "{what}: latest_checkpoint disagrees with the full read"
    );
    let pending = store.find_pending(scope, now).await.expect("find_pending");
    assert_eq!(
        pending.as_ref(),
        park::find_pending(&all, now),
        "{what}: find_pending at {now} disagrees with the full read"
    );
    let resume = store.resume_point(scope, now).await.expect("resume_point");
    let expected = park::find_pending(&all, now).or(all.last());
    assert_eq!(
        resume.as_ref(),
        expected,
        "{what}: resume_point at {now} disagrees with the full read"
    );
}

/// On runs with unfenced and fenced checkpoints across takeovers (a later
/// fence with an earlier clock), the latest is the full read's last, and
/// a run with none answers none.
pub async fn agrees_on_the_latest_checkpoint_with_the_full_read(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let empty = run("empty");
    agree(&store, &empty, at(0), "a run with no checkpoints").await;
    assert_eq!(store.latest_checkpoint(&empty).await.expect("latest"), None);
    let a = run("a");
    write(&store, &a, &checkpoint("u1", 500), None).await;
    agree(&store, &a, at(0), "one unfenced checkpoint").await;
    let w1 = take(&store, &a, claim_opts("w1", 1_000, 0)).await;
    write(&store, &a, &checkpoint("f1_late", 900), Some(w1.fence)).await;
    write(&store, &a, &checkpoint("f1_early", 100), Some(w1.fence)).await;
    agree(&store, &a, at(0), "fenced checkpoints").await;
    let w2 = take(&store, &a, claim_opts("w2", 60_000, 2_000)).await;
    write(&store, &a, &checkpoint("f2_earliest", 50), Some(w2.fence)).await;
    write(&store, &a, &checkpoint("u2", 40), None).await;
    agree(
        &store,
        &a,
        at(2_000),
        "a takeover's checkpoints written with earlier clocks",
    )
    .await;
    let replaced = checkpoint("f1_late", 901);
    write(&store, &a, &replaced, None).await;
    agree(&store, &a, at(2_000), "a checkpoint replaced under its id").await;
}

/// With outstanding, answered and expiring parks under mixed fences, the
/// pending checkpoint and the resume point agree with the full read before
/// and after a deadline and after an answer.
pub async fn agrees_on_the_pending_park_and_resume_point_with_the_full_read(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let a = run("a");
    write(&store, &a, &checkpoint("plain", 0), None).await;
    agree(&store, &a, at(0), "no park").await;
    let w1 = take(&store, &a, claim_opts("w1", 1_000, 0)).await;
    write(
        &store,
        &a,
        &parked("old_park", 10, 10, None),
        Some(w1.fence),
    )
    .await;
    agree(&store, &a, at(20), "one outstanding park").await;
    let w2 = take(&store, &a, claim_opts("w2", 60_000, 2_000)).await;
    write(
        &store,
        &a,
        &parked("deadline_park", 5, 5, Some(3_000)),
        Some(w2.fence),
    )
    .await;
    write(
        &store,
        &a,
        &checkpoint("after_parks", 2_100),
        Some(w2.fence),
    )
    .await;
    for now in [2_100, 2_999, 3_000, 10_000] {
        agree(
            &store,
            &a,
            at(now),
            &format!("two parks, one with a deadline, at +{now}"),
        )
        .await;
    }
    let id = parked("deadline_park", 5, 5, None).id;
    store
        .resolve_park(
            &a,
            &id,
            ParkResolution::Answer(json!("yes")),
            at(2_500),
            Some(w2.fence),
        )
        .await
        .expect("answer");
    for now in [2_600, 10_000] {
        agree(
            &store,
            &a,
            at(now),
            &format!("one park answered, at +{now}"),
        )
        .await;
    }
    let id = parked("old_park", 10, 10, None).id;
    store
        .resolve_park(
            &a,
            &id,
            ParkResolution::Answer(json!("no")),
            at(2_700),
            None,
        )
        .await
        .expect("answer");
    agree(&store, &a, at(2_800), "every park answered").await;
    assert_eq!(
        store
            .find_pending(&a, at(2_800))
            .await
            .expect("find_pending"),
        None
    );
    let p = run("parks_only");
    write(&store, &p, &parked("only", 0, 0, Some(100)), None).await;
    for now in [0, 99, 100] {
        agree(
            &store,
            &p,
            at(now),
            &format!("a run of one park, at +{now}"),
        )
        .await;
    }
}

/// `checkpoint_ids` (contract v2): exactly the ids with the prefix, below
/// `before`, greatest first in byte order, cut at `limit`, compared with
/// the ids of the full read; ids that are prefixes of each other, a `_`
/// in a prefix (a LIKE wildcard in SQL) and `-`, a prefix matching
/// nothing, an empty run; a bad query is `InvalidInput`.
pub async fn lists_checkpoint_ids_by_prefix_before_and_limit_greatest_first(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    use runkeep::{CheckpointId, CheckpointIdQuery};
    let q = |prefix: &str, before: Option<&str>, limit: Option<usize>| CheckpointIdQuery {
        prefix: prefix.to_string(),
        before: before.map(|b| CheckpointId::new(b).expect("id")),
        limit,
    };
    let empty = run("no_checkpoints");
    assert_eq!(
        store
            .checkpoint_ids(&empty, &q("", None, None))
            .await
            .expect("ids"),
        Vec::<CheckpointId>::new(),
        "a run without checkpoints has no ids"
    );
    let a = run("a");
    let ids = [
        "a", "ab", "abc", "abd", "a_b", "aXb", "b", "b1", "b10", "b2", "tc-0-r01", "tc-0-r02",
        "tc-0-r1", "tc-0-hff", "tc-1-r05", "tw-0-r01", "Z",
    ];
    for (i, id) in ids.iter().enumerate() {
        let offset = i64::try_from(i).expect("small") * 10;
        write(&store, &a, &checkpoint(id, offset), None).await;
    }
    let all: Vec<CheckpointId> = store
        .list_checkpoints(&a)
        .await
        .expect("list")
        .into_iter()
        .map(|c| c.id)
        .collect();
    let truth = |query: &CheckpointIdQuery| {
        let mut v: Vec<CheckpointId> = all
            .iter()
            .filter(|id| id.as_str().starts_with(&query.prefix))
            .filter(|id| {
                query
                    .before
                    .as_ref()
                    .is_none_or(|b| id.as_str().as_bytes() < b.as_str().as_bytes())
            })
            .cloned()
            .collect();
        v.sort_by(|x, y| y.as_str().as_bytes().cmp(x.as_str().as_bytes()));
        v.truncate(query.limit.unwrap_or(usize::MAX));
        v
    };
    let queries = [
        q("", None, None),
        q("", None, Some(3)),
        q("", Some("b1"), Some(4)),
        q("a", None, None),
        q("ab", None, None),
        q("ab", Some("abc"), None),
        q("abc", None, None),
        q("a_", None, None),
        q("b1", None, None),
        q("tc-0-r", None, Some(1)),
        q("tc-0-r", Some("tc-0-r02"), Some(1)),
        q("tc-0-r", Some("tc-0-r01"), None),
        q("tc-0-h", None, Some(1)),
        q("tc-", None, None),
        q("t", Some("tw"), Some(100)),
        q("zz", None, None),
        q("", Some("0"), None),
        q("", Some("a"), None),
    ];
    for query in &queries {
        let got = store
            .checkpoint_ids(&a, query)
            .await
            .expect("checkpoint_ids");
        assert_eq!(
            got,
            truth(query),
            "checkpoint_ids({query:?}) disagrees with the ids of the full read"
        );
    }
    for (bad, what) in [
        (q("a/", None, None), "a prefix outside the id alphabet"),
        (q("a", None, Some(0)), "a limit of 0"),
        (
            q(&"a".repeat(200), None, None),
            "a prefix longer than any id",
        ),
    ] {
        let r = store.checkpoint_ids(&a, &bad).await;
        assert!(
            matches!(r, Err(runkeep::Error::InvalidInput { .. })),
            "{what} must be InvalidInput, got {r:?}"
        );
    }
}
