//! The listing: scope isolation, addressable rows, filters, orders, paging.

use std::collections::HashSet;
use std::sync::Arc;

use runkeep::{ListOptions, ListOrder, ListingScope, ParkState, RunScope, RunStore};

use crate::support::*;

/// A listing for a tenant the store does not hold is an empty page.
pub async fn answers_nothing_for_a_tenant_it_does_not_hold(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    write(&store, &run("a"), &checkpoint("1", 0), None).await;
    let page = list(
        &store,
        &ListingScope::tenant(other_tenant()),
        Default::default(),
        0,
    )
    .await;
    assert!(page.entries.is_empty() && page.cursor.is_none(), "{page:?}");
}

/// Likewise for a project.
pub async fn answers_nothing_for_a_project_it_does_not_hold(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    write(&store, &run("a"), &checkpoint("1", 0), None).await;
    let page = list(
        &store,
        &ListingScope::project(tenant(), other_project()),
        Default::default(),
        0,
    )
    .await;
    assert!(page.entries.is_empty(), "{page:?}");
    let page = list(
        &store,
        &ListingScope::project(tenant(), project()),
        Default::default(),
        0,
    )
    .await;
    assert_eq!(ids(&page), ["run_conformance_a"]);
}

/// Narrowing below the tenant works.
pub async fn narrows_the_listing_to_a_session(store: Arc<dyn RunStore>, _env: CaseEnv) {
    write(&store, &run("a"), &checkpoint("1", 0), None).await;
    let other = ListingScope::session(
        tenant(),
        project(),
        runkeep::SessionId::new("ses_conformance_other").expect("id"),
    );
    assert!(list(&store, &other, Default::default(), 0)
        .await
        .entries
        .is_empty());
    assert_eq!(
        ids(&list(&store, &listing(), Default::default(), 0).await),
        ["run_conformance_a"]
    );
    assert_eq!(
        ids(&list(
            &store,
            &ListingScope::tenant(tenant()),
            Default::default(),
            0
        )
        .await),
        ["run_conformance_a"]
    );
}

/// Rows carry the full scope and the run's figures.
pub async fn rebuilds_an_addressable_row_for_every_run_it_holds(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    write(
        &store,
        &run("b"),
        &checkpoint("b1", 5).with_run_created_at(at(-5)),
        None,
    )
    .await;
    write(&store, &run("a"), &checkpoint("a1", 1), None).await;
    write(&store, &run("a"), &checkpoint("a2", 2), None).await;
    let page = list(&store, &listing(), Default::default(), 0).await;
    assert_eq!(ids(&page), ["run_conformance_a", "run_conformance_b"]);
    let a = &page.entries[0];
    assert_eq!(a.scope, run("a"));
    assert_eq!(a.checkpoint_count, 2);
    assert_eq!(a.latest_checkpoint_id, Some(checkpoint("a2", 0).id));
    assert_eq!(a.latest_checkpoint_at, Some(at(2)));
    assert_eq!(a.run_created_at, None);
    assert_eq!(a.park, None);
    assert_eq!(a.claim, None);
    assert_eq!(a.damaged, None);
    assert_eq!(page.entries[1].run_created_at, Some(at(-5)));
    // The row is addressable: it reads back the run's checkpoints unchanged.
    assert_eq!(
        store
            .list_checkpoints(&page.entries[0].scope)
            .await
            .expect("list")
            .len(),
        2
    );
}

/// A store bound to one tenant refuses a foreign tenant's writes; a
/// multi-tenant store keeps them apart. Either way no row leaks.
pub async fn keeps_one_tenants_runs_out_of_another_tenants_listing(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    write(&store, &run("a"), &checkpoint("1", 0), None).await;
    let z = RunScope::new(
        other_tenant(),
        project(),
        session(),
        "run_conformance_z".parse().expect("id"),
    );
    match store.write_checkpoint(&z, &checkpoint("2", 0), None).await {
        Ok(_) => {
            let theirs = list(
                &store,
                &ListingScope::tenant(other_tenant()),
                Default::default(),
                0,
            )
            .await;
            assert_eq!(ids(&theirs), ["run_conformance_z"]);
        }
        Err(runkeep::Error::InvalidInput { .. }) => {
            let theirs = list(
                &store,
                &ListingScope::tenant(other_tenant()),
                Default::default(),
                0,
            )
            .await;
            assert!(theirs.entries.is_empty());
        }
        Err(e) => panic!("a foreign tenant's write failed with neither success nor a refusal: {e}"),
    }
    let ours = list(
        &store,
        &ListingScope::tenant(tenant()),
        Default::default(),
        0,
    )
    .await;
    assert_eq!(ids(&ours), ["run_conformance_a"]);
}

/// An expired claim reads as unheld; a live one as held.
pub async fn shows_the_queue_reader_which_runs_nobody_holds(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    for r in ["a", "b", "c"] {
        write(&store, &run(r), &checkpoint(r, 0), None).await;
    }
    take(&store, &run("a"), claim_opts("w1", 60_000, 0)).await;
    take(&store, &run("b"), claim_opts("w1", 1_000, 0)).await;
    let free = list(
        &store,
        &listing(),
        ListOptions {
            claimed: Some(false),
            ..Default::default()
        },
        2_000,
    )
    .await;
    assert_eq!(ids(&free), ["run_conformance_b", "run_conformance_c"]);
    let held = list(
        &store,
        &listing(),
        ListOptions {
            claimed: Some(true),
            ..Default::default()
        },
        2_000,
    )
    .await;
    assert_eq!(ids(&held), ["run_conformance_a"]);
    let claim = held.entries[0].claim.clone().expect("claim");
    assert_eq!((claim.holder.as_str(), claim.expired), ("w1", false));
    let b = &free.entries[0]
        .claim
        .clone()
        .expect("expired claim still shown");
    assert!(b.expired);
}

/// After a clean release every backend shows the tombstone
/// (holder "", the tombstone's fence, expiry 0, expired) — never a live claim
/// and never "never claimed".
pub async fn shows_a_released_run_as_a_tombstone_not_a_live_claim(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let a = run("a");
    write(&store, &a, &checkpoint("1", 0), None).await;
    let l = take(&store, &a, claim_opts("w1", 60_000, 0)).await;
    store.release(&a, l.fence).await.expect("release");
    let page = list(
        &store,
        &listing(),
        ListOptions {
            claimed: Some(false),
            ..Default::default()
        },
        1,
    )
    .await;
    let c = page.entries[0].claim.clone().expect("tombstone summary");
    assert_eq!(
        (
            c.holder.as_str(),
            c.fence.get(),
            c.expires_at.as_millis(),
            c.expired
        ),
        ("", l.fence.get() + 1, 0, true)
    );
}

/// The park filter keeps only the named states; never-parked runs drop out.
pub async fn filters_the_listing_by_park_state(store: Arc<dyn RunStore>, _env: CaseEnv) {
    write(&store, &run("a"), &parked("a", 0, 0, None), None).await;
    write(&store, &run("b"), &parked("b", 0, 0, Some(10)), None).await;
    write(&store, &run("c"), &checkpoint("c", 0), None).await;
    let out = list(
        &store,
        &listing(),
        ListOptions {
            park: Some(vec![ParkState::Outstanding]),
            ..Default::default()
        },
        20,
    )
    .await;
    assert_eq!(ids(&out), ["run_conformance_a"]);
    let both = list(
        &store,
        &listing(),
        ListOptions {
            park: Some(vec![ParkState::Expired, ParkState::Outstanding]),
            ..Default::default()
        },
        20,
    )
    .await;
    assert_eq!(ids(&both), ["run_conformance_a", "run_conformance_b"]);
    let early = list(
        &store,
        &listing(),
        ListOptions {
            park: Some(vec![ParkState::Expired]),
            ..Default::default()
        },
        5,
    )
    .await;
    assert!(
        early.entries.is_empty(),
        "the page's clock must decide expiry"
    );
    let empty = store
        .list_runs(
            &listing(),
            &ListOptions {
                park: Some(vec![]),
                ..Default::default()
            },
        )
        .await;
    assert!(
        matches!(empty, Err(runkeep::Error::InvalidInput { .. })),
        "{empty:?}"
    );
}

async fn seed_runs(store: &Arc<dyn RunStore>, n: usize) -> Vec<String> {
    let mut names = Vec::new();
    for i in 0..n {
        let name = format!("r{:02}", (i * 7) % n);
        let created = if i % 3 == 0 {
            None
        } else {
            Some(at(1_000 - (i as i64) * 10))
        };
        let mut cp = checkpoint(&name, 0);
        if let Some(c) = created {
            cp = cp.with_run_created_at(c);
        }
        write(store, &run(&name), &cp, None).await;
        names.push(format!("run_conformance_{name}"));
    }
    names.sort();
    names
}

/// Walking with small pages returns every row exactly once, in order, in
/// both orders.
pub async fn walks_every_row_exactly_once_in_both_orders(store: Arc<dyn RunStore>, _env: CaseEnv) {
    let names = seed_runs(&store, 11).await;
    for order in [ListOrder::RunId, ListOrder::CreatedAt] {
        let rows = walk(
            &store,
            &listing(),
            ListOptions {
                order,
                limit: Some(3),
                ..Default::default()
            },
            0,
        )
        .await;
        let got: Vec<String> = rows.iter().map(|r| r.scope.run_id.to_string()).collect();
        let unique: HashSet<&String> = got.iter().collect();
        assert_eq!(
            unique.len(),
            got.len(),
            "{order:?}: a row repeated: {got:?}"
        );
        let mut sorted = got.clone();
        sorted.sort();
        assert_eq!(sorted, names, "{order:?}: rows lost");
        let keys: Vec<_> = rows.iter().map(|r| r.key(order)).collect();
        assert!(
            keys.windows(2).all(|w| w[0] < w[1]),
            "{order:?}: not in order"
        );
    }
}

/// A run that checkpoints again between pages is neither lost nor
/// repeated.
pub async fn keeps_paging_stable_when_a_run_checkpoints_between_pages(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let names = seed_runs(&store, 6).await;
    for order in [ListOrder::RunId, ListOrder::CreatedAt] {
        let opts = ListOptions {
            order,
            limit: Some(2),
            ..Default::default()
        };
        let first = list(&store, &listing(), opts.clone(), 0).await;
        for n in &names {
            let scope = run(n.trim_start_matches("run_conformance_"));
            let mut cp = checkpoint(
                &format!("again_{n}_{order:?}").replace("run_conformance_", ""),
                500,
            );
            if let Some(r) = store.list_checkpoints(&scope).await.expect("list")[0].run_created_at {
                cp = cp.with_run_created_at(r);
            }
            write(&store, &scope, &cp, None).await;
        }
        let mut got: Vec<String> = ids(&first);
        got.extend(
            walk(
                &store,
                &listing(),
                ListOptions {
                    cursor: first.cursor.clone(),
                    ..opts
                },
                0,
            )
            .await
            .iter()
            .map(|r| r.scope.run_id.to_string()),
        );
        got.sort();
        assert_eq!(got, names, "{order:?}");
    }
}

/// The exhausting page has no cursor; an exactly-full page with rows
/// remaining has one.
pub async fn carries_a_cursor_only_while_rows_remain(store: Arc<dyn RunStore>, _env: CaseEnv) {
    for r in ["a", "b", "c", "d"] {
        write(&store, &run(r), &checkpoint(r, 0), None).await;
    }
    let p1 = list(
        &store,
        &listing(),
        ListOptions {
            limit: Some(2),
            ..Default::default()
        },
        0,
    )
    .await;
    assert_eq!(ids(&p1), ["run_conformance_a", "run_conformance_b"]);
    assert!(
        p1.cursor.is_some(),
        "a full page with rows remaining carried no cursor"
    );
    let p2 = list(
        &store,
        &listing(),
        ListOptions {
            limit: Some(2),
            cursor: p1.cursor,
            ..Default::default()
        },
        0,
    )
    .await;
    assert_eq!(ids(&p2), ["run_conformance_c", "run_conformance_d"]);
    assert!(p2.cursor.is_none(), "the exhausting page carried a cursor");
    let all = list(
        &store,
        &listing(),
        ListOptions {
            limit: Some(4),
            ..Default::default()
        },
        0,
    )
    .await;
    assert!(all.cursor.is_none());
}

/// Limit 0 returns one row and paging continues one at a time.
pub async fn treats_limit_zero_as_one(store: Arc<dyn RunStore>, _env: CaseEnv) {
    for r in ["a", "b"] {
        write(&store, &run(r), &checkpoint(r, 0), None).await;
    }
    let rows = walk(
        &store,
        &listing(),
        ListOptions {
            limit: Some(0),
            ..Default::default()
        },
        0,
    )
    .await;
    assert_eq!(rows.len(), 2);
    let first = list(
        &store,
        &listing(),
        ListOptions {
            limit: Some(0),
            ..Default::default()
        },
        0,
    )
    .await;
    assert_eq!(first.entries.len(), 1);
}

/// Unrecorded start sorts first; a recorded 0 after it, also across a
/// page boundary.
pub async fn puts_unrecorded_start_first_and_recorded_zero_after(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    write(&store, &run("z"), &checkpoint("z", 0), None).await;
    write(
        &store,
        &run("a"),
        &checkpoint("a", 0).with_run_created_at(runkeep::Timestamp::EPOCH),
        None,
    )
    .await;
    let opts = ListOptions {
        order: ListOrder::CreatedAt,
        limit: Some(1),
        ..Default::default()
    };
    let rows = walk(&store, &listing(), opts, 0).await;
    let got: Vec<String> = rows.iter().map(|r| r.scope.run_id.to_string()).collect();
    assert_eq!(got, ["run_conformance_z", "run_conformance_a"]);
    assert_eq!(rows[1].run_created_at, Some(runkeep::Timestamp::EPOCH));
    assert_eq!(rows[0].run_created_at, None);
}

/// Run start is the minimum and pruning the oldest does not move it.
pub async fn keeps_run_start_when_the_oldest_checkpoint_is_pruned(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    let a = run("a");
    for i in 0..3 {
        write(
            &store,
            &a,
            &checkpoint(&format!("{i}"), i).with_run_created_at(at(-50)),
            None,
        )
        .await;
    }
    store.prune_checkpoints(&a, 1, None).await.expect("prune");
    let page = list(&store, &listing(), Default::default(), 0).await;
    assert_eq!(page.entries[0].run_created_at, Some(at(-50)));
    assert_eq!(page.entries[0].checkpoint_count, 1);
}

/// A cursor is bound to its order; forged text is refused.
pub async fn refuses_a_cursor_from_another_order_or_a_forged_one(
    store: Arc<dyn RunStore>,
    _env: CaseEnv,
) {
    for r in ["a", "b"] {
        write(&store, &run(r), &checkpoint(r, 0), None).await;
    }
    let p = list(
        &store,
        &listing(),
        ListOptions {
            limit: Some(1),
            ..Default::default()
        },
        0,
    )
    .await;
    let c = p.cursor.expect("cursor");
    let other = store
        .list_runs(
            &listing(),
            &ListOptions {
                order: ListOrder::CreatedAt,
                cursor: Some(c),
                ..Default::default()
            },
        )
        .await;
    assert!(
        matches!(other, Err(runkeep::Error::InvalidInput { .. })),
        "{other:?}"
    );
    for forged in [
        "run_conformance_a",
        "::run_conformance_a",
        "0:0:run_conformance_a",
        "",
    ] {
        let r = store
            .list_runs(
                &listing(),
                &ListOptions {
                    cursor: Some(forged.into()),
                    ..Default::default()
                },
            )
            .await;
        assert!(
            matches!(r, Err(runkeep::Error::InvalidInput { .. })),
            "{forged:?} accepted: {r:?}"
        );
    }
}

/// Children and grandchildren are listed with their parents.
pub async fn lists_sub_runs_with_their_parent(store: Arc<dyn RunStore>, _env: CaseEnv) {
    let a = run("a");
    let b = run("b").with_parent(a.run_id.clone());
    let c = run("c").with_parent(b.run_id.clone());
    write(&store, &a, &checkpoint("a", 0), None).await;
    write(&store, &b, &checkpoint("b", 0), None).await;
    write(&store, &c, &checkpoint("c", 0), None).await;
    let page = list(&store, &listing(), Default::default(), 0).await;
    let got: Vec<(String, Option<String>)> = page
        .entries
        .iter()
        .map(|r| {
            (
                r.scope.run_id.to_string(),
                r.scope.parent_run_id.as_ref().map(|p| p.to_string()),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("run_conformance_a".to_string(), None),
            (
                "run_conformance_b".to_string(),
                Some("run_conformance_a".to_string())
            ),
            (
                "run_conformance_c".to_string(),
                Some("run_conformance_b".to_string())
            ),
        ]
    );
    assert_eq!(
        store
            .list_checkpoints(&page.entries[2].scope)
            .await
            .expect("list")
            .len(),
        1
    );
}
