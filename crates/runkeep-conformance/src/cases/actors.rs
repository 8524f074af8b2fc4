//! Writes made for a principal (`runkeep::acting`): a holding claimed for
//! one principal cannot be written, released or finished for another, and
//! the store judges it with the fence, on the same holding.
//!
//! These cases act in process (`acting::scope` around the store's calls,
//! holders tagged as a server tags them). Over HTTP the principal is the
//! request's token, which a client cannot choose; the server's own tests
//! check the same rule through two tokens (`runkeep-server/tests/hijack.rs`).

use std::future::Future;
use std::sync::Arc;

use runkeep::acting::{self, Actor};
use runkeep::{
    ClaimNextFilter, Error, Fence, NewAuditEvent, NextClaim, Outcome, ParkResolution, RunScope,
    RunStore, Step, Timestamp,
};
use serde_json::{json, Map};

use crate::support::*;

fn actor(id: &str) -> Actor {
    Actor::new(id).expect("actor id")
}

/// A holder name as a server records it for `token`.
fn bound(name: &str, token: &str) -> String {
    format!("{name}{}{token}", acting::TAG)
}

async fn as_actor<T>(id: &str, f: impl Future<Output = T>) -> T {
    acting::scope(actor(id), f).await
}

#[track_caller]
fn expect_not_yours<T: std::fmt::Debug>(
    r: runkeep::Result<T>,
    fence: Fence,
    fenced: bool,
    what: &str,
) {
    match r {
        Err(Error::NotYourHolding {
            fence: f,
            fenced: fd,
            ..
        }) if f == fence && fd == fenced => {}
        other => panic!(
            "{what}: expected NotYourHolding at fence {fence} (fenced: {fenced}), got {other:?}"
        ),
    }
}

fn a_step(tag: &str) -> Step {
    Step {
        events: vec![event("tool_result", json!({ "tag": tag }))],
        checkpoint: Some(checkpoint(&format!("step_{tag}"), 5)),
        ..Step::default()
    }
}

async fn event_count(store: &Arc<dyn RunStore>, scope: &RunScope) -> usize {
    store
        .read_events(scope, &Default::default())
        .await
        .expect("read events")
        .events
        .len()
}

/// Every fenced act of principal `b` at the fence of a holding `a` claimed
/// is refused, and leaves the run as it was; `a`'s own act at that fence
/// is accepted.
pub async fn refuses_every_fenced_act_on_a_holding_another_principal_claimed(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let r = run("a");
    let l = take(&store, &r, claim_now(&bound("w1", "a"), 60_000)).await;
    let f = l.fence;
    let park = parked("p", 1, 1, None);
    as_actor("a", async {
        write(&store, &r, &park, Some(f)).await;
    })
    .await;
    let no_fields = Map::new;
    as_actor("b", async {
        let s = &store;
        expect_not_yours(
            s.write_checkpoint(&r, &checkpoint("x", 2), Some(f)).await,
            f,
            true,
            "write_checkpoint",
        );
        expect_not_yours(
            s.append_events(&r, &[event("x", json!({}))], Some(f)).await,
            f,
            true,
            "append_events",
        );
        expect_not_yours(
            s.write_run_record(&r, &no_fields(), Some(f)).await,
            f,
            true,
            "write_run_record",
        );
        expect_not_yours(
            s.write_messages(&r, &[], 0, Some(f)).await,
            f,
            true,
            "write_messages",
        );
        expect_not_yours(
            s.write_report(&r, "x", Some(f)).await,
            f,
            true,
            "write_report",
        );
        expect_not_yours(
            s.append_audit(&r, &[NewAuditEvent::new("b", "x", "ok")], Some(f))
                .await,
            f,
            true,
            "append_audit",
        );
        expect_not_yours(
            s.resolve_park(
                &r,
                &park.id,
                ParkResolution::Answer(json!("b says yes")),
                Timestamp::now(),
                Some(f),
            )
            .await,
            f,
            true,
            "resolve_park",
        );
        expect_not_yours(
            s.prune_checkpoints(&r, 0, Some(f)).await,
            f,
            true,
            "prune_checkpoints",
        );
        expect_not_yours(
            s.commit_step(&r, f, &a_step("b")).await,
            f,
            true,
            "commit_step",
        );
        let next = NextClaim {
            scope: listing(),
            filter: ClaimNextFilter::default(),
            options: claim_now(&bound("w9", "b"), 60_000),
        };
        expect_not_yours(
            s.commit_step_and_claim_next(&r, f, &a_step("b2"), &next)
                .await,
            f,
            true,
            "commit_step_and_claim_next",
        );
        expect_not_yours(s.snooze(&r, f, Timestamp::now()).await, f, true, "snooze");
        expect_not_yours(
            s.finish(&r, f, &Outcome::failed("hijacked")).await,
            f,
            true,
            "finish",
        );
        expect_not_yours(s.release(&r, f).await, f, true, "release");
        expect_not_yours(
            s.fail_attempt(
                &r,
                f,
                &runkeep::AttemptError::new("error", "hijacked"),
                None,
            )
            .await,
            f,
            true,
            "fail_attempt",
        );
    })
    .await;

    // Nothing changed: still a's live holding, one checkpoint (the park,
    // unanswered), no events, no record, report or audit, still active.
    let top = store
        .lease(&r, store.now())
        .await
        .expect("lease")
        .expect("held");
    assert_eq!((top.fence, top.expired), (f, false), "{top:?}");
    assert_eq!(acting::bound_to(&top.holder), Some("a"), "{top:?}");
    let cps = store.list_checkpoints(&r).await.expect("list");
    assert_eq!(cps.len(), 1, "a refused act left a checkpoint: {cps:?}");
    assert!(cps[0]
        .pending
        .as_ref()
        .is_some_and(|p| p.resolved_at.is_none()));
    assert_eq!(event_count(&store, &r).await, 0);
    assert!(store.read_run_record(&r).await.expect("record").is_none());
    assert_eq!(store.read_report(&r).await.expect("report"), None);
    assert!(store.read_audit(&r, 0).await.expect("audit").is_empty());
    assert!(!store
        .lifecycle(&r)
        .await
        .expect("lifecycle")
        .status
        .is_finished());
    // No run was claimed by the refused hand-over.
    let page = store
        .list_runs(&listing(), &Default::default())
        .await
        .expect("listing");
    assert_eq!(page.entries.len(), 1, "{:?}", ids(&page));

    // The holder's own act at the same fence goes through.
    as_actor("a", async {
        store
            .commit_step(&r, f, &a_step("a"))
            .await
            .expect("the holder's own step");
        assert!(store.release(&r, f).await.expect("the holder's release"));
    })
    .await;
    assert_eq!(event_count(&store, &r).await, 1);
}

/// The hijack the check-then-write server allowed: `b` sends the fence
/// above the top (the next one, readable by anyone) before `a` claims it;
/// after the claim lands, the same act is `a`'s holding and refused.
pub async fn refuses_a_fence_issued_to_another_principal_after_the_act_was_prepared(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let r = run("a");
    store
        .enqueue(&r, &checkpoint("start", 0), &Default::default())
        .await
        .expect("enqueue");
    let next = store
        .lease(&r, store.now())
        .await
        .expect("lease")
        .map_or(Fence::new(1).expect("fence"), |l| {
            l.fence.next(&r.run_id).expect("fence")
        });
    let early = as_actor("b", store.finish(&r, next, &Outcome::failed("hijacked"))).await;
    assert!(
        matches!(early, Err(Error::InvalidInput { .. })),
        "a fence never issued: {early:?}"
    );
    let l = as_actor("a", async {
        take(&store, &r, claim_now(&bound("w1", "a"), 60_000)).await
    })
    .await;
    assert_eq!(l.fence, next);
    expect_not_yours(
        as_actor("b", store.finish(&r, next, &Outcome::failed("hijacked"))).await,
        next,
        true,
        "finish at the fence just issued to a",
    );
    expect_not_yours(
        as_actor(
            "b",
            store.append_events(&r, &[event("x", json!({}))], Some(next)),
        )
        .await,
        next,
        true,
        "append_events at the fence just issued to a",
    );
    assert_eq!(event_count(&store, &r).await, 0);
    let done = as_actor("a", store.finish(&r, next, &Outcome::completed(None)))
        .await
        .expect("the holder finishes");
    assert_eq!(done.status, runkeep::RunStatus::Completed);
}

/// An unfenced write made for a principal is refused while a lease is on
/// top, live or expired, whoever claimed it (stamped with that holding's
/// fence it would pass for its work; one principal may be a fleet of
/// workers); accepted once the run is released. Acting for no one, the
/// fence rule alone judges.
pub async fn refuses_an_unfenced_write_for_a_principal_while_a_lease_is_on_top(
    store: Arc<dyn RunStore>,
    env: CaseEnv,
) {
    let r = run("a");
    let l = take(&store, &r, claim_now(&bound("w1", "a"), 1_000)).await;
    let s = &store;
    expect_not_yours(
        as_actor("b", s.write_checkpoint(&r, &checkpoint("x", 1), None)).await,
        l.fence,
        false,
        "unfenced write under another's live lease",
    );
    expect_not_yours(
        as_actor("a", s.write_checkpoint(&r, &checkpoint("x", 1), None)).await,
        l.fence,
        false,
        "unfenced write under its own principal's live lease",
    );
    env.clock().advance(1_500);
    let lapsed = store
        .lease(&r, store.now())
        .await
        .expect("lease")
        .expect("top");
    assert!(lapsed.expired, "the lease should have expired: {lapsed:?}");
    for who in ["a", "b"] {
        as_actor(who, async {
            expect_not_yours(
                s.write_checkpoint(&r, &checkpoint("x", 1), None).await,
                l.fence,
                false,
                "write_checkpoint under an expired lease",
            );
            expect_not_yours(
                s.append_events(&r, &[event("x", json!({}))], None).await,
                l.fence,
                false,
                "append_events under an expired lease",
            );
            expect_not_yours(
                s.write_report(&r, "x", None).await,
                l.fence,
                false,
                "write_report under an expired lease",
            );
            expect_not_yours(
                s.write_run_record(&r, &Map::new(), None).await,
                l.fence,
                false,
                "write_run_record under an expired lease",
            );
            expect_not_yours(
                s.append_audit(&r, &[NewAuditEvent::new(who, "x", "ok")], None)
                    .await,
                l.fence,
                false,
                "append_audit under an expired lease",
            );
        })
        .await;
    }
    assert!(store.list_checkpoints(&r).await.expect("list").is_empty());
    assert_eq!(event_count(&store, &r).await, 0);
    assert_eq!(store.read_report(&r).await.expect("report"), None);
    assert!(store.read_run_record(&r).await.expect("record").is_none());
    assert!(store.read_audit(&r, 0).await.expect("audit").is_empty());
    // b takes the lapsed run over: it writes with its fence, and unfenced
    // once it released the run.
    let lb = as_actor("b", async {
        take(&store, &r, claim_now(&bound("w2", "b"), 60_000)).await
    })
    .await;
    let cp = as_actor(
        "b",
        s.write_checkpoint(&r, &checkpoint("y", 2), Some(lb.fence)),
    )
    .await
    .expect("b's fenced write under its own holding");
    assert_eq!(cp.fence, Some(lb.fence));
    assert!(as_actor("b", s.release(&r, lb.fence))
        .await
        .expect("release"));
    as_actor("b", s.write_report(&r, "after the release", None))
        .await
        .expect("an unfenced write to a released run");
    // Acting for no one, the fence rule alone judges (incremental adoption).
    take(&store, &r, claim_now("w3", 60_000)).await;
    write(&store, &r, &checkpoint("z", 3), None).await;
}
