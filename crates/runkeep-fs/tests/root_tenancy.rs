//! A root of many sessions (`FsRootStore`): tenant isolation by path, a
//! session directory that stays a plain `FsStore` (and the reference's
//! layout), listings and `claim_next` across sessions against the
//! reference model, symlinks, and the root/session confusion refusals.

use std::path::Path;
use std::sync::Arc;

use proptest::prelude::*;
use runkeep::{
    Checkpoint, CheckpointId, CheckpointStore, ClaimNextFilter, ClaimOptions, ClaimOutcome,
    EnqueueOptions, Error, EvidenceStore, Holder, ListOptions, ListOrder, ListingScope,
    ManualClock, MemoryStore, NewEvent, Outcome, ParkState, PendingDecision, ProjectId, RunId,
    RunPage, RunRow, RunScope, RunStore, SessionId, TenantId, Timestamp, Ttl, WatchTopic,
};
use runkeep_fs::{Attribution, FsOptions, FsRootOptions, FsRootStore, FsStore, ROOT_MARKER};
use serde_json::{json, Map};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn t(s: &str) -> TenantId {
    TenantId::new(s).unwrap()
}
fn p(s: &str) -> ProjectId {
    ProjectId::new(s).unwrap()
}
fn s(x: &str) -> SessionId {
    SessionId::new(x).unwrap()
}
fn scope(tenant: &str, project: &str, session: &str, run: &str) -> RunScope {
    RunScope::new(t(tenant), p(project), s(session), RunId::new(run).unwrap())
}
fn at(ms: i64) -> Timestamp {
    Timestamp::from_millis(1_000_000 + ms).unwrap()
}
fn cp(id: &str, created: i64) -> Checkpoint {
    Checkpoint::new(CheckpointId::new(id).unwrap(), at(created), Map::new())
}
fn claim(holder: &str, ttl: u64) -> ClaimOptions {
    ClaimOptions::new(Holder::new(holder).unwrap(), Ttl::from_millis(ttl).unwrap())
}
fn ev(kind: &str) -> NewEvent {
    NewEvent::new(kind, Map::new())
}
fn root(dir: &Path) -> FsRootStore {
    FsRootStore::open(dir, FsRootOptions::default()).unwrap()
}

async fn walk(
    store: &dyn RunStore,
    scope: &ListingScope,
    options: ListOptions,
) -> (Vec<RunRow>, usize) {
    let mut rows = Vec::new();
    let mut cursor = None;
    let mut pages = 0;
    loop {
        let page: RunPage = store
            .list_runs(
                scope,
                &ListOptions {
                    cursor: cursor.take(),
                    ..options.clone()
                },
            )
            .await
            .unwrap();
        pages += 1;
        rows.extend(page.entries);
        match page.cursor {
            Some(c) => cursor = Some(c),
            None => return (rows, pages),
        }
    }
}

fn names(rows: &[RunRow]) -> Vec<String> {
    rows.iter()
        .map(|r| {
            format!(
                "{}/{}/{}/{}",
                r.scope.tenant_id, r.scope.project_id, r.scope.session_id, r.scope.run_id
            )
        })
        .collect()
}

/// Two tenants write the same project, session, run and checkpoint ids
/// through one root: each sees only its own runs, claims them apart, and
/// the runs live in two directories. Mutation tried: routing every scope to
/// `ROOT/<project>/<session>` (dropping the tenant level) — both tenants
/// then read one checkpoint and the second claim is `Held`; this test
/// fails on the first listing.
#[test]
fn two_tenants_with_the_same_ids_see_only_their_own_runs() {
    rt().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let store = root(dir.path());
        let a = scope("tnt_a", "prj_x", "ses_x", "run_same");
        let b = scope("tnt_b", "prj_x", "ses_x", "run_same");
        let mut cp_a = cp("cp_same", 1);
        cp_a.state.insert("owner".into(), json!("a"));
        let mut cp_b = cp("cp_same", 2);
        cp_b.state.insert("owner".into(), json!("b"));
        store.write_checkpoint(&a, &cp_a, None).await.unwrap();
        store.write_checkpoint(&b, &cp_b, None).await.unwrap();
        for (tenant, own) in [("tnt_a", &a), ("tnt_b", &b)] {
            for listing in [
                ListingScope::tenant(t(tenant)),
                ListingScope::project(t(tenant), p("prj_x")),
                ListingScope::session(t(tenant), p("prj_x"), s("ses_x")),
            ] {
                let (rows, _) = walk(&store, &listing, ListOptions::default()).await;
                assert_eq!(rows.len(), 1, "{listing}: {rows:?}");
                assert_eq!(&rows[0].scope, own);
            }
        }
        let id = CheckpointId::new("cp_same").unwrap();
        let read_a = store.read_checkpoint(&a, &id).await.unwrap().unwrap();
        let read_b = store.read_checkpoint(&b, &id).await.unwrap().unwrap();
        assert_eq!(read_a.state["owner"], json!("a"));
        assert_eq!(read_b.state["owner"], json!("b"));
        // Claims are apart: each tenant's run gets its own first fence.
        let la = store.claim(&a, &claim("w_a", 60_000)).await.unwrap();
        let lb = store.claim(&b, &claim("w_b", 60_000)).await.unwrap();
        assert_eq!(la.lease().unwrap().fence.get(), 1);
        assert_eq!(lb.lease().unwrap().fence.get(), 1);
        store
            .append_events(&a, &[ev("only_a")], None)
            .await
            .unwrap();
        let ev_b = store.read_events(&b, &Default::default()).await.unwrap();
        assert!(ev_b.events.is_empty(), "{ev_b:?}");
        // Isolation is by path: two directories.
        assert!(store.run_dir(&a).starts_with(dir.path().join("tnt_a")));
        assert!(store.run_dir(&b).starts_with(dir.path().join("tnt_b")));
        assert!(store.run_dir(&a).join("checkpoints/cp_same.json").is_file());
        assert!(store.run_dir(&b).join("checkpoints/cp_same.json").is_file());
        // A tenant the root does not hold lists nothing.
        let (none, _) = walk(
            &store,
            &ListingScope::tenant(t("tnt_c")),
            ListOptions::default(),
        )
        .await;
        assert!(none.is_empty());
    });
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

/// A session under a root is exactly a session directory of the
/// reference: `ROOT/<tenant>/<project>/<session>/runs/<run>/…`, openable as
/// a plain `FsStore` on its `runs/`; and a `runs/` the reference wrote,
/// dropped into a root, is served through the root with the same rows the
/// plain store gives.
#[test]
fn a_session_under_a_root_is_a_plain_session_directory_both_ways() {
    rt().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let store = root(dir.path());
        let run = scope("tnt_a", "prj_x", "ses_x", "run_abc");
        store
            .write_checkpoint(&run, &cp("cp_1", 1), None)
            .await
            .unwrap();
        store
            .append_events(&run, &[ev("step")], None)
            .await
            .unwrap();
        let session_dir = store.session_dir(&t("tnt_a"), &p("prj_x"), &s("ses_x"));
        assert_eq!(session_dir, dir.path().join("tnt_a/prj_x/ses_x"));
        let entries: Vec<String> = std::fs::read_dir(&session_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(entries, ["runs"], "a session directory holds runs/ only");
        let runs = session_dir.join("runs");
        assert_eq!(store.runs_dir(&run), runs);
        assert!(runs.join("run_abc/checkpoints/cp_1.json").is_file());
        assert!(runs.join("run_abc/transcript.jsonl").is_file());
        let plain = FsStore::open(
            &runs,
            FsOptions {
                attribution: Some(Attribution {
                    tenant_id: t("tnt_a"),
                    project_id: p("prj_x"),
                    session_id: s("ses_x"),
                }),
                ..Default::default()
            },
        )
        .unwrap();
        let listing = ListingScope::session(t("tnt_a"), p("prj_x"), s("ses_x"));
        let (via_root, _) = walk(&store, &listing, ListOptions::default()).await;
        let (via_plain, _) = walk(&plain, &listing, ListOptions::default()).await;
        assert_eq!(via_root, via_plain);
        assert_eq!(
            plain
                .read_events(&run, &Default::default())
                .await
                .unwrap()
                .events
                .len(),
            1
        );

        // The reference's own runs/ (the interop fixture), dropped into a root.
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/reference");
        let answers: serde_json::Value =
            serde_json::from_slice(&std::fs::read(fixture.join("answers.json")).unwrap()).unwrap();
        let attribution = &answers["attribution"];
        let (tn, pn, sn) = (
            t(attribution["tenantId"].as_str().unwrap()),
            p(attribution["projectId"].as_str().unwrap()),
            s(attribution["sessionId"].as_str().unwrap()),
        );
        let dir2 = tempfile::tempdir().unwrap();
        let root2 = root(dir2.path());
        let runs2 = root2.session_dir(&tn, &pn, &sn).join("runs");
        copy_tree(&fixture.join("runs"), &runs2);
        let copy = tempfile::tempdir().unwrap();
        copy_tree(&fixture.join("runs"), copy.path());
        let plain2 = FsStore::open(
            copy.path(),
            FsOptions {
                attribution: Some(Attribution {
                    tenant_id: tn.clone(),
                    project_id: pn.clone(),
                    session_id: sn.clone(),
                }),
                read_only: true,
                ..Default::default()
            },
        )
        .unwrap();
        let now = Some(Timestamp::from_millis(answers["now"].as_i64().unwrap()).unwrap());
        for order in [ListOrder::RunId, ListOrder::CreatedAt] {
            let o = ListOptions {
                order,
                now,
                limit: Some(2),
                ..Default::default()
            };
            let (a, _) = walk(&root2, &ListingScope::tenant(tn.clone()), o.clone()).await;
            let (b, _) = walk(
                &plain2,
                &ListingScope::session(tn.clone(), pn.clone(), sn.clone()),
                o,
            )
            .await;
            assert!(!a.is_empty());
            assert_eq!(a, b, "{order:?}");
        }
    });
}

/// The operations of the cross-session model test.
#[derive(Clone, Debug)]
enum Op {
    /// Writes a checkpoint (`created`, optional run start, optional park).
    Write {
        at: u8,
        run: u8,
        cp: u8,
        created: i64,
        start: Option<i64>,
        park: bool,
    },
    /// Claims with a short or long ttl.
    Claim { at: u8, run: u8, long: bool },
    /// Finishes the run under its current lease (if held).
    Finish { at: u8, run: u8 },
    /// `claim_next` over a prefix.
    Next { prefix: u8, park: bool, order: bool },
    /// Moves the clock.
    Advance(i64),
    /// Enqueues with a priority and maybe a concurrency key (limit 1).
    Enqueue {
        at: u8,
        run: u8,
        prio: i64,
        key: Option<u8>,
    },
    /// An operator sets a run's priority.
    Priority { at: u8, run: u8, prio: i64 },
}

/// Eight sessions over two tenants, two projects each; run ids recur in
/// every session, so the merge meets ties.
fn session_of(i: u8) -> (String, String, String) {
    let i = i % 8;
    (
        format!("tnt_{}", i / 4),
        format!("prj_{}", (i / 2) % 2),
        format!("ses_{}", i % 2),
    )
}
fn run_of(at: u8, run: u8) -> RunScope {
    let (tn, pn, sn) = session_of(at);
    scope(&tn, &pn, &sn, &format!("run_{}", run % 3))
}
fn prefix_of(i: u8) -> ListingScope {
    match i % 5 {
        0 => ListingScope::tenant(t("tnt_0")),
        1 => ListingScope::tenant(t("tnt_1")),
        2 => ListingScope::project(t("tnt_0"), p("prj_1")),
        3 => ListingScope::project(t("tnt_1"), p("prj_0")),
        _ => ListingScope::session(t("tnt_0"), p("prj_0"), s("ses_1")),
    }
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (any::<u8>(), any::<u8>(), 0u8..3, -50i64..50, proptest::option::of(-50i64..50), any::<bool>())
            .prop_map(|(at, run, cp, created, start, park)| Op::Write { at, run, cp, created, start, park }),
        3 => (any::<u8>(), any::<u8>(), any::<bool>()).prop_map(|(at, run, long)| Op::Claim { at, run, long }),
        1 => (any::<u8>(), any::<u8>()).prop_map(|(at, run)| Op::Finish { at, run }),
        2 => (any::<u8>(), any::<bool>(), any::<bool>()).prop_map(|(prefix, park, order)| Op::Next { prefix, park, order }),
        1 => (1i64..3_000).prop_map(Op::Advance),
        2 => (any::<u8>(), any::<u8>(), -2i64..3, proptest::option::of(0u8..2))
            .prop_map(|(at, run, prio, key)| Op::Enqueue { at, run, prio, key }),
        1 => (any::<u8>(), any::<u8>(), -2i64..3).prop_map(|(at, run, prio)| Op::Priority { at, run, prio }),
    ]
}

fn checkpoint_of(op: &Op) -> Checkpoint {
    let Op::Write {
        cp: id,
        created,
        start,
        park,
        ..
    } = op
    else {
        unreachable!()
    };
    let mut c = cp(&format!("cp_{id}"), *created);
    if let Some(st) = start {
        c = c.with_run_created_at(at(*st));
    }
    if *park {
        c = c.with_pending(PendingDecision::new("review", Map::new(), at(*created)));
    }
    c
}

/// Everything the two stores answer for the listings: every prefix, both
/// orders, pages of 1, 2 and 5, with and without filters.
async fn listings(store: &dyn RunStore) -> Vec<(String, Vec<RunRow>)> {
    let mut out = Vec::new();
    for i in 0..5 {
        let scope = prefix_of(i);
        for order in [ListOrder::RunId, ListOrder::CreatedAt, ListOrder::Priority] {
            for limit in [1, 2, 5] {
                for (fname, claimed, park) in [
                    ("all", None, None),
                    ("unclaimed", Some(false), None),
                    ("parked", None, Some(vec![ParkState::Outstanding])),
                ] {
                    let (rows, _) = walk(
                        store,
                        &scope,
                        ListOptions {
                            order,
                            limit: Some(limit),
                            claimed,
                            park,
                            ..Default::default()
                        },
                    )
                    .await;
                    out.push((format!("{scope} {order:?} limit {limit} {fname}"), rows));
                }
            }
        }
    }
    out
}

fn run_model(ops: &[Op]) -> std::result::Result<(), TestCaseError> {
    rt().block_on(async {
        let clock = ManualClock::new(at(0));
        let dir = tempfile::tempdir().unwrap();
        let fs = FsRootStore::open(
            dir.path(),
            FsRootOptions {
                clock: Some(Arc::new(clock.clone())),
                ..Default::default()
            },
        )
        .unwrap();
        let mem = MemoryStore::with_clock(Arc::new(clock.clone()));
        let stores: [&dyn RunStore; 2] = [&fs, &mem];
        let mut leases: std::collections::HashMap<RunScope, runkeep::Fence> = Default::default();
        for (n, op) in ops.iter().enumerate() {
            match op {
                Op::Write { at: a, run, .. } => {
                    let sc = run_of(*a, *run);
                    let c = checkpoint_of(op);
                    let r: Vec<_> = futures(stores.map(|st| {
                        let (sc, c) = (sc.clone(), c.clone());
                        async move {
                            st.write_checkpoint(&sc, &c, None)
                                .await
                                .map(|_| ())
                                .map_err(|e| e.to_string())
                        }
                    }))
                    .await;
                    prop_assert_eq!(&r[0], &r[1], "op {} {:?}", n, op);
                }
                Op::Claim { at: a, run, long } => {
                    let sc = run_of(*a, *run);
                    let ttl = if *long { 60_000 } else { 1_000 };
                    let mut got = Vec::new();
                    for st in stores {
                        got.push(
                            st.claim(&sc, &claim("w", ttl))
                                .await
                                .map_err(|e| e.to_string()),
                        );
                    }
                    prop_assert_eq!(&got[0], &got[1], "op {} {:?}", n, op);
                    if let Ok(ClaimOutcome::Acquired(l)) = &got[0] {
                        leases.insert(sc, l.fence);
                    }
                }
                Op::Finish { at: a, run } => {
                    let sc = run_of(*a, *run);
                    if let Some(f) = leases.get(&sc) {
                        let mut got = Vec::new();
                        for st in stores {
                            got.push(
                                st.finish(&sc, *f, &Outcome::completed(None))
                                    .await
                                    .map(|l| l.status)
                                    .map_err(|e| {
                                        format!("{e:?}")
                                            .split_whitespace()
                                            .next()
                                            .unwrap_or("")
                                            .to_string()
                                    }),
                            );
                        }
                        prop_assert_eq!(&got[0], &got[1], "op {} {:?}", n, op);
                    }
                }
                Op::Next {
                    prefix,
                    park,
                    order,
                } => {
                    let filter = ClaimNextFilter {
                        park: park.then(|| vec![ParkState::Outstanding]),
                        order: if *order {
                            ListOrder::CreatedAt
                        } else {
                            ListOrder::RunId
                        },
                    };
                    let mut got = Vec::new();
                    for st in stores {
                        got.push(
                            st.claim_next(&prefix_of(*prefix), &filter, &claim("q", 60_000))
                                .await
                                .map(|o| o.map(|(sc, l)| (sc, l.fence)))
                                .map_err(|e| e.to_string()),
                        );
                    }
                    prop_assert_eq!(&got[0], &got[1], "op {} {:?}", n, op);
                    if let Ok(Some((sc, f))) = &got[0] {
                        leases.insert(sc.clone(), *f);
                    }
                }
                Op::Advance(ms) => clock.advance(*ms),
                Op::Enqueue {
                    at: a,
                    run,
                    prio,
                    key,
                } => {
                    let sc = run_of(*a, *run);
                    let options = runkeep::EnqueueOptions {
                        priority: runkeep::scheduling::Priority::new(*prio).unwrap(),
                        concurrency: key.map(|k| {
                            runkeep::scheduling::Concurrency::new(format!("k{k}"), 1).unwrap()
                        }),
                        ..Default::default()
                    };
                    let mut got = Vec::new();
                    for st in stores {
                        got.push(
                            st.enqueue(&sc, &cp("cp_e", 0), &options)
                                .await
                                .map(|_| ())
                                .map_err(|e| kind(&e)),
                        );
                    }
                    prop_assert_eq!(&got[0], &got[1], "op {} {:?}", n, op);
                }
                Op::Priority { at: a, run, prio } => {
                    let sc = run_of(*a, *run);
                    let p = runkeep::scheduling::Priority::new(*prio).unwrap();
                    let mut got = Vec::new();
                    for st in stores {
                        got.push(
                            st.set_priority(&sc, p)
                                .await
                                .map(|l| l.priority)
                                .map_err(|e| kind(&e)),
                        );
                    }
                    prop_assert_eq!(&got[0], &got[1], "op {} {:?}", n, op);
                }
            }
        }
        for i in 0..8u8 {
            let (tn, pn, sn) = session_of(i);
            let session = ListingScope::session(t(&tn), p(&pn), s(&sn));
            for k in ["k0", "k1"] {
                let a = fs.key_holdings(&session, k).await.unwrap();
                let b = mem.key_holdings(&session, k).await.unwrap();
                prop_assert_eq!(&a, &b, "key_holdings {} {}", session, k);
            }
        }
        let a = listings(&fs).await;
        let b = listings(&mem).await;
        for ((what, got), (_, want)) in a.iter().zip(b.iter()) {
            prop_assert_eq!(names(got), names(want), "{}", what);
            prop_assert_eq!(got, want, "{}", what);
        }
        Ok(())
    })
}

/// An error's variant (the two stores word their messages differently).
fn kind(e: &Error) -> String {
    format!("{e:?}")
        .split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or("")
        .to_string()
}

async fn futures<F: std::future::Future>(fs: [F; 2]) -> Vec<F::Output> {
    let mut out = Vec::new();
    for f in fs {
        out.push(f.await);
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, max_shrink_iters: 200, ..ProptestConfig::default() })]

    /// Listings over tenants, projects and sessions (every order, pages of
    /// 1, 2 and 5, filters) and `claim_next` over prefixes answer exactly
    /// what the reference model answers, on runs whose ids recur in every
    /// session. Mutations tried: the merge ordered by row key without the
    /// project/session tie-break (sessions in directory order) — fails on
    /// the first case with a tie; `claim_next` trying sessions one after
    /// another (first session's first claimable run) — fails on a prefix
    /// whose first claimable run is in a later session.
    #[test]
    fn listings_and_claim_next_across_sessions_agree_with_the_reference_model(
        ops in proptest::collection::vec(op(), 4..28)
    ) {
        run_model(&ops)?;
    }
}

/// A page reads at most `limit + 1` rows of each session, never a
/// session's whole listing. Mutation tried: asking each session for
/// `MAX_LIMIT` rows — fails (150 rows fetched for a page of 5).
#[test]
fn a_page_pages_through_each_session_with_the_limit() {
    rt().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let store = root(dir.path());
        for sess in ["ses_0", "ses_1", "ses_2"] {
            for i in 0..50 {
                store
                    .write_checkpoint(
                        &scope("tnt_a", "prj_x", sess, &format!("run_{i:03}")),
                        &cp("cp_1", 0),
                        None,
                    )
                    .await
                    .unwrap();
            }
        }
        let before = store.testing().rows_fetched();
        let page = store
            .list_runs(
                &ListingScope::tenant(t("tnt_a")),
                &ListOptions {
                    limit: Some(5),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        let fetched = store.testing().rows_fetched() - before;
        assert_eq!(
            names(&page.entries),
            [
                "tnt_a/prj_x/ses_0/run_000",
                "tnt_a/prj_x/ses_1/run_000",
                "tnt_a/prj_x/ses_2/run_000",
                "tnt_a/prj_x/ses_0/run_001",
                "tnt_a/prj_x/ses_1/run_001"
            ]
        );
        assert!(page.cursor.is_some());
        assert!(
            fetched <= 3 * 6,
            "a page of 5 read {fetched} rows from 3 sessions"
        );
        // The whole walk, in pages of 7, sees every run once.
        let (rows, pages) = walk(
            &store,
            &ListingScope::tenant(t("tnt_a")),
            ListOptions {
                limit: Some(7),
                ..Default::default()
            },
        )
        .await;
        assert_eq!(rows.len(), 150);
        assert_eq!(pages, 22);
        let mut seen = names(&rows);
        seen.dedup();
        assert_eq!(seen.len(), 150);
    });
}

/// `claim_next` over a tenant takes runs across sessions in the listing's
/// order (the first claimable run of the whole tenant, not of the first
/// session), and two callers never get one run.
#[test]
fn claim_next_over_a_tenant_takes_the_first_run_of_the_whole_prefix() {
    rt().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let store = root(dir.path());
        for (sess, run) in [
            ("ses_a", "run_c"),
            ("ses_a", "run_d"),
            ("ses_b", "run_a"),
            ("ses_b", "run_e"),
        ] {
            store
                .enqueue(
                    &scope("tnt_a", "prj_x", sess, run),
                    &cp("cp_1", 0),
                    &EnqueueOptions::default(),
                )
                .await
                .unwrap();
        }
        // A third session whose first 35 runs are deferred: claim_next
        // reads its candidates a few at a time and must read on past them.
        let later = Some(Timestamp::now().offset(3_600_000));
        for i in 0..40 {
            let options = EnqueueOptions {
                available_at: if i < 35 { later } else { None },
                ..Default::default()
            };
            store
                .enqueue(
                    &scope("tnt_a", "prj_x", "ses_c", &format!("run_g{i:02}")),
                    &cp("cp_1", 0),
                    &options,
                )
                .await
                .unwrap();
        }
        let tenant = ListingScope::tenant(t("tnt_a"));
        let mut order = Vec::new();
        while let Some((sc, _)) = store
            .claim_next(&tenant, &ClaimNextFilter::default(), &claim("w", 60_000))
            .await
            .unwrap()
        {
            order.push(format!("{}/{}", sc.session_id, sc.run_id));
        }
        let first: Vec<&str> = order.iter().take(5).map(String::as_str).collect();
        assert_eq!(
            first,
            [
                "ses_b/run_a",
                "ses_a/run_c",
                "ses_a/run_d",
                "ses_b/run_e",
                "ses_c/run_g35"
            ]
        );
        assert_eq!(order.len(), 4 + 5, "{order:?}");
    });
}

/// A tenant, project, session or `runs` directory that is a symbolic link
/// is never followed: per-run calls are refused (`Unsupported`, naming the
/// link), listings skip it, the doctor's scan reports it, and nothing is
/// written through it.
#[test]
fn a_symlinked_session_is_refused_skipped_and_reported() {
    rt().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let store = root(dir.path());
        store
            .write_checkpoint(
                &scope("tnt_a", "prj_x", "ses_ok", "run_a"),
                &cp("cp_1", 0),
                None,
            )
            .await
            .unwrap();
        std::fs::create_dir_all(outside.path().join("runs/run_b/checkpoints")).unwrap();
        let project_dir = dir.path().join("tnt_a/prj_x");
        std::os::unix::fs::symlink(outside.path(), project_dir.join("ses_link")).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("tnt_l")).unwrap();
        for run in [
            scope("tnt_a", "prj_x", "ses_link", "run_b"),
            scope("tnt_l", "prj_x", "ses_x", "run_b"),
        ] {
            let w = store.write_checkpoint(&run, &cp("cp_2", 0), None).await;
            match w {
                Err(Error::Unsupported { message }) => {
                    assert!(message.contains("symbolic link"), "{message}")
                }
                other => panic!("a write through a link: {other:?}"),
            }
            assert!(matches!(
                store
                    .read_checkpoint(&run, &CheckpointId::new("cp_2").unwrap())
                    .await,
                Err(Error::Unsupported { .. })
            ));
            assert!(matches!(
                store.claim(&run, &claim("w", 1_000)).await,
                Err(Error::Unsupported { .. })
            ));
        }
        assert!(!outside
            .path()
            .join("runs/run_b/checkpoints/cp_2.json")
            .exists());
        assert!(
            std::fs::read_dir(outside.path().join("runs/run_b/checkpoints"))
                .unwrap()
                .next()
                .is_none()
        );
        let (rows, _) = walk(
            &store,
            &ListingScope::tenant(t("tnt_a")),
            ListOptions::default(),
        )
        .await;
        assert_eq!(names(&rows), ["tnt_a/prj_x/ses_ok/run_a"]);
        let d = store
            .diagnose(&ListingScope::tenant(t("tnt_a")), at(0))
            .unwrap();
        assert_eq!(d.runs_scanned, 1);
        assert_eq!(d.unreadable.len(), 1, "{d:?}");
        assert!(d.unreadable[0].0.ends_with("ses_link"));
        let d = store
            .diagnose(&ListingScope::tenant(t("tnt_l")), at(0))
            .unwrap();
        assert_eq!(d.unreadable.len(), 1, "{d:?}");
    });
}

/// A session directory opened as a root, a session's `runs/` opened as a
/// root, and a root opened as one session are each refused, naming the
/// address form to use; a read-only root creates nothing and refuses
/// writes.
#[test]
fn roots_and_sessions_are_not_mistaken_for_each_other() {
    rt().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let store = root(dir.path());
        let run = scope("tnt_a", "prj_x", "ses_x", "run_a");
        store
            .write_checkpoint(&run, &cp("cp_1", 0), None)
            .await
            .unwrap();
        assert!(dir.path().join(ROOT_MARKER).is_file());
        // The root, opened as one session.
        let e = FsStore::open(dir.path(), FsOptions::default()).unwrap_err();
        assert!(matches!(e, Error::InvalidInput { .. }), "{e}");
        assert!(e.to_string().contains("root:"), "{e}");
        let e = FsStore::open(
            dir.path(),
            FsOptions {
                read_only: true,
                ..Default::default()
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("root:"), "{e}");
        // A session directory (holds runs/), opened as a root.
        let session_dir = dir.path().join("tnt_a/prj_x/ses_x");
        let e = FsRootStore::open(&session_dir, FsRootOptions::default()).unwrap_err();
        assert!(matches!(e, Error::InvalidInput { .. }), "{e}");
        assert!(
            e.to_string()
                .contains(&format!("fs:{}/runs", session_dir.display())),
            "{e}"
        );
        // A session's runs/ (holds run_*), opened as a root.
        let runs = session_dir.join("runs");
        let e = FsRootStore::open(&runs, FsRootOptions::default()).unwrap_err();
        assert!(
            e.to_string().contains(&format!("fs:{}", runs.display())),
            "{e}"
        );
        // Neither refusal wrote a marker.
        assert!(!session_dir.join(ROOT_MARKER).exists());
        assert!(!runs.join(ROOT_MARKER).exists());
        // Read-only: a missing root is NotFound, an unmarked one refused,
        // and a marked one refuses writes and creates nothing.
        let missing = dir.path().join("nope");
        assert!(matches!(
            FsRootStore::open(
                &missing,
                FsRootOptions {
                    read_only: true,
                    ..Default::default()
                }
            ),
            Err(Error::NotFound { .. })
        ));
        assert!(!missing.exists());
        let unmarked = tempfile::tempdir().unwrap();
        assert!(FsRootStore::open(
            unmarked.path(),
            FsRootOptions {
                read_only: true,
                ..Default::default()
            }
        )
        .is_err());
        assert!(!unmarked.path().join(ROOT_MARKER).exists());
        let ro = FsRootStore::open(
            dir.path(),
            FsRootOptions {
                read_only: true,
                ..Default::default()
            },
        )
        .unwrap();
        let other = scope("tnt_b", "prj_x", "ses_x", "run_a");
        assert!(matches!(
            ro.write_checkpoint(&other, &cp("cp_1", 0), None).await,
            Err(Error::Unsupported { .. })
        ));
        assert!(matches!(
            ro.write_checkpoint(&run, &cp("cp_2", 0), None).await,
            Err(Error::Unsupported { .. })
        ));
        assert!(!dir.path().join("tnt_b").exists());
        assert_eq!(ro.list_checkpoints(&run).await.unwrap().len(), 1);
    });
}

/// Reads of a session that does not exist answer "absent" and create
/// nothing; a refused write into a new session leaves no directory behind.
/// Mutation tried: `tidy` a no-op — the refused release and the refused
/// fenced write leave `tnt_n/…/runs` behind and the test fails.
#[test]
fn reads_and_refused_writes_of_a_new_session_leave_nothing() {
    rt().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let store = root(dir.path());
        let run = scope("tnt_n", "prj_x", "ses_x", "run_a");
        assert!(store.list_checkpoints(&run).await.unwrap().is_empty());
        assert!(store.lease(&run, at(0)).await.unwrap().is_none());
        assert!(store
            .read_events(&run, &Default::default())
            .await
            .unwrap()
            .events
            .is_empty());
        assert_eq!(
            store.lifecycle(&run).await.unwrap(),
            runkeep::Lifecycle::default()
        );
        assert!(!store
            .release(&run, runkeep::Fence::new(3).unwrap())
            .await
            .unwrap());
        let refused = store
            .write_checkpoint(&run, &cp("cp_1", 0), Some(runkeep::Fence::new(3).unwrap()))
            .await;
        assert!(
            matches!(refused, Err(Error::InvalidInput { .. })),
            "{refused:?}"
        );
        assert!(matches!(
            store.reopen(&run).await,
            Err(Error::NotFound { .. })
        ));
        assert!(
            !dir.path().join("tnt_n").exists(),
            "a directory was left behind"
        );
        // A write that lands creates the session.
        store
            .write_checkpoint(&run, &cp("cp_1", 0), None)
            .await
            .unwrap();
        assert!(store.runs_dir(&run).join("run_a").is_dir());
    });
}

/// A `Runnable` watch over a tenant wakes after an enqueue into a session
/// that did not exist when it was made, and after a release in one that
/// did; an `Events` watch on a run of a session not yet created wakes
/// after the first append.
#[test]
fn prefix_watches_wake_for_new_and_existing_sessions() {
    rt().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let store = root(dir.path());
        let bound = std::time::Duration::from_secs(30);
        let existing = scope("tnt_a", "prj_x", "ses_x", "run_a");
        store
            .write_checkpoint(&existing, &cp("cp_1", 0), None)
            .await
            .unwrap();
        let topic = WatchTopic::Runnable(ListingScope::tenant(t("tnt_a")));
        let mut w = store.watch(&topic);
        assert!(!w.is_polling());
        // Let the watch take its first look at the prefix.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        store
            .enqueue(
                &scope("tnt_a", "prj_y", "ses_new", "run_b"),
                &cp("cp_1", 0),
                &EnqueueOptions::default(),
            )
            .await
            .unwrap();
        tokio::time::timeout(bound, w.changed())
            .await
            .expect("woke after an enqueue in a new session");
        let lease = store
            .claim(&existing, &claim("w", 60_000))
            .await
            .unwrap()
            .lease()
            .unwrap();
        let mut w = store.watch(&topic);
        store.release(&existing, lease.fence).await.unwrap();
        tokio::time::timeout(bound, w.changed())
            .await
            .expect("woke after a release");
        let fresh = scope("tnt_a", "prj_z", "ses_z", "run_c");
        let mut w = store.watch(&WatchTopic::Events(fresh.clone()));
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        store
            .append_events(&fresh, &[ev("step")], None)
            .await
            .unwrap();
        tokio::time::timeout(bound, w.changed())
            .await
            .expect("woke after an append");
    });
}

/// Two `claim_next` callers (two stores on one root, as two processes) are
/// made to race for the same first run of a tenant: each records the
/// candidate it is about to claim and waits for the other before claiming.
/// Both saw the same run (the race happened); the lease gives it to one,
/// and the other moves on to the next run of the merged order, never the
/// same run. Mutation tried: giving up on a `Held` candidate (`return
/// Ok(None)`) — the loser gets nothing and the test fails.
#[test]
fn two_claimers_racing_for_one_run_get_two_runs() {
    rt().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let seed = root(dir.path());
        for (sess, run) in [("ses_a", "run_b"), ("ses_b", "run_a"), ("ses_a", "run_c")] {
            seed.enqueue(
                &scope("tnt_a", "prj_x", sess, run),
                &cp("cp_1", 0),
                &EnqueueOptions::default(),
            )
            .await
            .unwrap();
        }
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let claimers: Vec<_> = (0..2)
            .map(|i| {
                let store = root(dir.path());
                store
                    .testing()
                    .pause_first_claim(barrier.clone(), seen.clone());
                tokio::spawn(async move {
                    store
                        .claim_next(
                            &ListingScope::tenant(t("tnt_a")),
                            &ClaimNextFilter::default(),
                            &claim(&format!("w{i}"), 60_000),
                        )
                        .await
                        .unwrap()
                        .map(|(sc, l)| (format!("{}/{}", sc.session_id, sc.run_id), l.fence.get()))
                })
            })
            .collect();
        let mut got = Vec::new();
        for c in claimers {
            got.push(c.await.unwrap());
        }
        let seen: Vec<String> = seen
            .lock()
            .unwrap()
            .iter()
            .map(|sc| format!("{}/{}", sc.session_id, sc.run_id))
            .collect();
        assert_eq!(
            seen,
            ["ses_b/run_a", "ses_b/run_a"],
            "both raced for one run"
        );
        got.sort();
        assert_eq!(
            got,
            [
                Some(("ses_a/run_b".to_string(), 1)),
                Some(("ses_b/run_a".to_string(), 1))
            ]
        );
    });
}

/// A session whose directory vanished under a store that had it cached
/// (tidied away by another process's refused call, or removed by hand) is
/// recreated by the next write, and reads meanwhile answer "absent".
#[test]
fn a_cached_session_whose_directory_vanished_is_recreated_by_the_next_write() {
    rt().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let store = root(dir.path());
        let first = scope("tnt_a", "prj_x", "ses_x", "run_a");
        store
            .write_checkpoint(&first, &cp("cp_1", 0), None)
            .await
            .unwrap();
        std::fs::remove_dir_all(dir.path().join("tnt_a")).unwrap();
        assert!(store.list_checkpoints(&first).await.unwrap().is_empty());
        let second = scope("tnt_a", "prj_x", "ses_x", "run_b");
        store
            .write_checkpoint(&second, &cp("cp_1", 0), None)
            .await
            .unwrap();
        let (rows, _) = walk(
            &store,
            &ListingScope::tenant(t("tnt_a")),
            ListOptions::default(),
        )
        .await;
        assert_eq!(names(&rows), ["tnt_a/prj_x/ses_x/run_b"]);
    });
}

/// `claim_next` over a tenant takes the highest priority of every session
/// first (then the filter's order), and a concurrency key at its limit in
/// one session does not hold back the same key's runs in another (keys are
/// counted per session). Mutation tried: merging the sessions by the
/// listing key instead of the claim key — the order check fails.
#[test]
fn claim_next_over_a_tenant_merges_by_priority_and_counts_keys_per_session() {
    rt().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let store = root(dir.path());
        let enq = |sess: &'static str, run: &'static str, prio: i64, key: bool| {
            let store = &store;
            async move {
                let options = EnqueueOptions {
                    priority: runkeep::scheduling::Priority::new(prio).unwrap(),
                    concurrency: key
                        .then(|| runkeep::scheduling::Concurrency::new("k", 1).unwrap()),
                    ..Default::default()
                };
                store
                    .enqueue(
                        &scope("tnt_a", "prj_x", sess, run),
                        &cp("cp_1", 0),
                        &options,
                    )
                    .await
                    .unwrap();
            }
        };
        enq("ses_0", "run_a", 0, false).await;
        enq("ses_0", "run_b", 3, true).await;
        enq("ses_0", "run_c", 3, true).await;
        enq("ses_1", "run_a", 1, false).await;
        enq("ses_1", "run_d", 3, true).await;
        enq("ses_1", "run_e", 2, false).await;
        let tenant = ListingScope::tenant(t("tnt_a"));
        for order in [ListOrder::RunId, ListOrder::CreatedAt] {
            let mut taken = Vec::new();
            while let Some((sc, _)) = store
                .claim_next(
                    &tenant,
                    &ClaimNextFilter {
                        order,
                        ..Default::default()
                    },
                    &claim(&format!("w{order:?}"), 60_000),
                )
                .await
                .unwrap()
            {
                taken.push(format!("{}/{}", sc.session_id, sc.run_id));
            }
            assert_eq!(
                taken,
                [
                    "ses_0/run_b",
                    // run_c waits: ses_0's key k is at its limit.
                    "ses_1/run_d",
                    "ses_1/run_e",
                    "ses_1/run_a",
                    "ses_0/run_a",
                ],
                "{order:?}"
            );
            // Free everything for the next order.
            for (sess, run) in [
                ("ses_0", "run_a"),
                ("ses_0", "run_b"),
                ("ses_1", "run_a"),
                ("ses_1", "run_d"),
                ("ses_1", "run_e"),
            ] {
                let sc = scope("tnt_a", "prj_x", sess, run);
                let l = store.lease(&sc, store.now()).await.unwrap().unwrap();
                assert!(store.release(&sc, l.fence).await.unwrap());
            }
        }
    });
}

/// `claim_next` over a tenant reads none of the queued runs of a key held
/// at its limit: each session's page of candidates skips them from its
/// index unread. Mutation tried: no skip in the session's candidate page —
/// the queued runs are read (the assertion fails).
#[test]
fn claim_next_over_a_tenant_reads_no_run_of_a_key_at_its_limit() {
    rt().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let store = root(dir.path());
        let big: Vec<RunScope> = (0..60)
            .map(|i| scope("tnt_a", "prj_x", "ses_0", &format!("run_a{i:03}")))
            .collect();
        let free: Vec<RunScope> = (0..6)
            .map(|i| scope("tnt_a", "prj_x", "ses_1", &format!("run_z{i:03}")))
            .collect();
        let keyed = EnqueueOptions {
            concurrency: Some(runkeep::scheduling::Concurrency::new("big", 1).unwrap()),
            ..Default::default()
        };
        for sc in &big {
            store.enqueue(sc, &cp("cp_1", 0), &keyed).await.unwrap();
        }
        for sc in &free {
            store
                .enqueue(sc, &cp("cp_1", 0), &EnqueueOptions::default())
                .await
                .unwrap();
        }
        assert!(store
            .claim(&big[0], &claim("w", 600_000))
            .await
            .unwrap()
            .lease()
            .is_some());
        for sc in [&big[0], &free[0]] {
            store
                .session_store(sc)
                .unwrap()
                .unwrap()
                .testing()
                .wait_index()
                .unwrap();
        }
        let tenant = ListingScope::tenant(t("tnt_a"));
        let reads = |runs: &[RunScope]| -> Vec<u64> {
            runs.iter()
                .map(|sc| runkeep_fs::testing::checkpoint_dir_listings(store.run_dir(sc)))
                .collect()
        };
        let queued = &big[1..];
        for _ in 0..4 {
            let before = reads(queued);
            let (got, _) = store
                .claim_next(&tenant, &ClaimNextFilter::default(), &claim("w", 600_000))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(got.session_id.as_str(), "ses_1", "{got:?}");
            let after = reads(queued);
            let read = before.iter().zip(&after).filter(|(b, a)| a > b).count();
            assert_eq!(
                read, 0,
                "claim_next read {read} queued runs of the key at its limit"
            );
        }
    });
}
