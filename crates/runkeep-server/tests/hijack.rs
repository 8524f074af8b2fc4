//! A second worker token of a tenant cannot take over the runs another
//! worker token holds (issue 26, item 1).
//!
//! The attack: any reader sees a run's next fence (`GET …/lease` + 1). A
//! second worker token sends an act under that fence *before* the honest
//! worker claims the run; if the holder were checked before the write and
//! not with it, the act would pass the check (a fence above the top is
//! "the store's to refuse") and reach the store after the claim made the
//! fence valid: the run hijacked.
//!
//! - [`each_fenced_act_sent_before_the_claim_is_refused_after_it`] *forces*
//!   that interleaving for every fenced act: a gate in front of the store
//!   holds the attacker's request at the store's door until the honest
//!   claim has landed, and asserts it did hold it there.
//! - `*_flood_*` runs the attack as a user would, on the directory root and
//!   on PostgreSQL, with two servers (each with its own store instance)
//!   in front of one store: an attacker flooding both the top fence and
//!   the next one while an honest worker drains the queue. Size:
//!   `RUNKEEP_HIJACK_RUNS` (default 50; the closing numbers of issue 26 are
//!   at 200). Every run must end completed by its honest worker, with no
//!   foreign event.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use runkeep::{
    Checkpoint, CheckpointId, CheckpointStore, ClaimNextFilter, ClaimOptions, ClaimOutcome,
    EnqueueOptions, Error, EvidenceStore, Fence, Handover, Holder, Lifecycle, NewEvent, NextClaim,
    Outcome, ParkResolution, PersistedEvent, Result, RunScope, RunStatus, RunStore, Step,
    StepCommit, StepReceipt, Timestamp, Ttl,
};
use runkeep_conformance::intercept::{Intercept, Intercepted};
use runkeep_conformance::{hijack, support};
use runkeep_server::client::{HttpStore, HttpStoreOptions};
use serde_json::{json, Map, Value};
use tokio::sync::Notify;

use common::{TestServer, WORKER_A, WORKER_A2};

fn worker(server: &TestServer, token: &str) -> HttpStore {
    HttpStore::new(
        server.url(),
        HttpStoreOptions {
            request_timeout: Duration::from_secs(30),
            ..Default::default()
        },
    )
    .unwrap()
    .with_token(support::tenant(), token)
}

fn claim_opts(holder: &str) -> ClaimOptions {
    ClaimOptions::new(
        Holder::new(holder).unwrap(),
        Ttl::from_millis(60_000).unwrap(),
    )
}

fn event(kind: &str) -> NewEvent {
    NewEvent::new(kind, Map::new())
}

// ---------------------------------------------------------------------------
// The forced interleaving.

/// The fenced acts a worker can make, each sent by the attacker.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Act {
    Finish,
    Snooze,
    Release,
    AppendEvents,
    CommitStep,
    HandOver,
    GroupCommit,
    WriteCheckpoint,
    ResolvePark,
    Prune,
    WriteRunRecord,
    FailAttempt,
}

const ACTS: [Act; 12] = [
    Act::Finish,
    Act::Snooze,
    Act::Release,
    Act::AppendEvents,
    Act::CommitStep,
    Act::HandOver,
    Act::GroupCommit,
    Act::WriteCheckpoint,
    Act::ResolvePark,
    Act::Prune,
    Act::WriteRunRecord,
    Act::FailAttempt,
];

/// Holds the first call of the armed act at the store's door until told
/// to go on, and says when it arrived there.
#[derive(Debug)]
struct Gate {
    inner: Arc<dyn RunStore>,
    armed: Mutex<Option<Act>>,
    arrived: Notify,
    go: Notify,
    held: AtomicBool,
}

impl Gate {
    async fn door(&self, act: Act) {
        let hold = {
            let mut armed = self.armed.lock().unwrap();
            if *armed == Some(act) {
                *armed = None;
                true
            } else {
                false
            }
        };
        if hold {
            self.held.store(true, Ordering::SeqCst);
            self.arrived.notify_one();
            self.go.notified().await;
        }
    }
}

#[async_trait]
impl Intercept for Gate {
    fn inner(&self) -> &dyn RunStore {
        self.inner.as_ref()
    }
    async fn finish(&self, s: &RunScope, f: Fence, o: &Outcome) -> Result<Lifecycle> {
        self.door(Act::Finish).await;
        self.inner.finish(s, f, o).await
    }
    async fn snooze(&self, s: &RunScope, f: Fence, until: Timestamp) -> Result<bool> {
        self.door(Act::Snooze).await;
        self.inner.snooze(s, f, until).await
    }
    async fn release(&self, s: &RunScope, f: Fence) -> Result<bool> {
        self.door(Act::Release).await;
        self.inner.release(s, f).await
    }
    async fn fail_attempt(
        &self,
        s: &RunScope,
        f: Fence,
        e: &runkeep::AttemptError,
        limit: Option<u32>,
    ) -> Result<Lifecycle> {
        self.door(Act::FailAttempt).await;
        self.inner.fail_attempt(s, f, e, limit).await
    }
    async fn append_events(
        &self,
        s: &RunScope,
        e: &[NewEvent],
        f: Option<Fence>,
    ) -> Result<Vec<PersistedEvent>> {
        self.door(Act::AppendEvents).await;
        self.inner.append_events(s, e, f).await
    }
    async fn commit_step(&self, s: &RunScope, f: Fence, step: &Step) -> Result<StepReceipt> {
        self.door(Act::CommitStep).await;
        self.inner.commit_step(s, f, step).await
    }
    async fn commit_step_and_claim_next(
        &self,
        s: &RunScope,
        f: Fence,
        step: &Step,
        next: &NextClaim,
    ) -> Result<Handover> {
        self.door(Act::HandOver).await;
        self.inner
            .commit_step_and_claim_next(s, f, step, next)
            .await
    }
    async fn commit_steps(&self, steps: &[StepCommit]) -> Result<Vec<Result<StepReceipt>>> {
        self.door(Act::GroupCommit).await;
        self.inner.commit_steps(steps).await
    }
    async fn write_checkpoint(
        &self,
        s: &RunScope,
        cp: &Checkpoint,
        f: Option<Fence>,
    ) -> Result<Checkpoint> {
        self.door(Act::WriteCheckpoint).await;
        self.inner.write_checkpoint(s, cp, f).await
    }
    async fn resolve_park(
        &self,
        s: &RunScope,
        id: &CheckpointId,
        r: ParkResolution,
        now: Timestamp,
        f: Option<Fence>,
    ) -> Result<Checkpoint> {
        self.door(Act::ResolvePark).await;
        self.inner.resolve_park(s, id, r, now, f).await
    }
    async fn prune_checkpoints(
        &self,
        s: &RunScope,
        keep: usize,
        f: Option<Fence>,
    ) -> Result<Vec<CheckpointId>> {
        self.door(Act::Prune).await;
        self.inner.prune_checkpoints(s, keep, f).await
    }
    async fn write_run_record(
        &self,
        s: &RunScope,
        r: &Map<String, Value>,
        f: Option<Fence>,
    ) -> Result<()> {
        self.door(Act::WriteRunRecord).await;
        self.inner.write_run_record(s, r, f).await
    }
}

fn attack_step() -> Step {
    Step {
        events: vec![event("attack")],
        finish: Some(Outcome::failed("hijacked")),
        ..Step::default()
    }
}

async fn attack(
    store: &HttpStore,
    act: Act,
    r: &RunScope,
    f: Fence,
    park: &CheckpointId,
) -> String {
    let far = Timestamp::from_millis(Timestamp::now().as_millis() + 3_600_000).unwrap();
    let result: Result<()> = match act {
        Act::Finish => store
            .finish(r, f, &Outcome::failed("hijacked"))
            .await
            .map(drop),
        Act::Snooze => store.snooze(r, f, far).await.map(drop),
        Act::Release => store.release(r, f).await.map(drop),
        Act::FailAttempt => store
            .fail_attempt(r, f, &runkeep::AttemptError::new("error", "hijacked"), None)
            .await
            .map(drop),
        Act::AppendEvents => store
            .append_events(r, &[event("attack")], Some(f))
            .await
            .map(drop),
        Act::CommitStep => store.commit_step(r, f, &attack_step()).await.map(drop),
        Act::HandOver => {
            let next = NextClaim {
                scope: support::listing(),
                filter: ClaimNextFilter::default(),
                options: claim_opts("attacker"),
            };
            store
                .commit_step_and_claim_next(r, f, &attack_step(), &next)
                .await
                .map(drop)
        }
        Act::GroupCommit => store
            .commit_steps(&[StepCommit {
                scope: r.clone(),
                fence: f,
                step: attack_step(),
            }])
            .await
            .and_then(|mut outcomes| outcomes.remove(0))
            .map(drop),
        Act::WriteCheckpoint => store
            .write_checkpoint(r, &support::checkpoint("attack", 50), Some(f))
            .await
            .map(drop),
        Act::ResolvePark => store
            .resolve_park(
                r,
                park,
                ParkResolution::Answer(json!("the attacker's answer")),
                Timestamp::now(),
                Some(f),
            )
            .await
            .map(drop),
        Act::Prune => store.prune_checkpoints(r, 0, Some(f)).await.map(drop),
        Act::WriteRunRecord => {
            let mut m = Map::new();
            m.insert("by".into(), json!("attacker"));
            store.write_run_record(r, &m, Some(f)).await
        }
    };
    match result {
        Err(Error::NotYourHolding {
            fence,
            fenced: true,
            ..
        }) if fence == f => "refused".into(),
        other => format!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_fenced_act_sent_before_the_claim_is_refused_after_it() {
    for act in ACTS {
        let backing: Arc<dyn RunStore> = Arc::new(runkeep::MemoryStore::new());
        let gate = Arc::new(Intercepted(Gate {
            inner: backing.clone(),
            armed: Mutex::new(None),
            arrived: Notify::new(),
            go: Notify::new(),
            held: AtomicBool::new(false),
        }));
        let server = TestServer::start(gate.clone());
        let honest = worker(&server, WORKER_A);
        let attacker = worker(&server, WORKER_A2);
        let r = support::run("victim");
        let park = support::parked("park", 1, 1, None);
        backing
            .enqueue(&r, &park, &EnqueueOptions::default())
            .await
            .unwrap();
        let checkpoints_before = backing.list_checkpoints(&r).await.unwrap().len();

        // The next fence, as any reader sees it.
        let next = match attacker.lease(&r, attacker.now()).await.unwrap() {
            Some(l) => l.fence.next(&r.run_id).unwrap(),
            None => Fence::new(1).unwrap(),
        };
        *gate.armed.lock().unwrap() = Some(act);
        let sent = {
            let (attacker, r, park_id) = (attacker.clone(), r.clone(), park.id.clone());
            tokio::spawn(async move { attack(&attacker, act, &r, next, &park_id).await })
        };
        tokio::time::timeout(Duration::from_secs(20), gate.arrived.notified())
            .await
            .unwrap_or_else(|_| {
                panic!("{act:?}: the attacker's request never reached the store's door")
            });
        // The honest claim lands while the attack waits at the door.
        let lease = match honest.claim(&r, &claim_opts("honest")).await.unwrap() {
            ClaimOutcome::Acquired(l) => l,
            other => panic!("{act:?}: the honest claim answered {other:?}"),
        };
        assert_eq!(
            lease.fence, next,
            "{act:?}: the attacker aimed at the wrong fence"
        );
        gate.go.notify_one();
        let outcome = sent.await.unwrap();
        assert!(
            gate.held.load(Ordering::SeqCst),
            "{act:?}: the interleaving did not happen"
        );
        assert_eq!(
            outcome, "refused",
            "{act:?}: the act under a fence issued to another token after it was sent must be refused NotYourHolding"
        );

        // Nothing of the attack is in the store; the honest worker holds on.
        let top = backing.lease(&r, backing.now()).await.unwrap().unwrap();
        assert_eq!((top.fence, top.expired), (next, false), "{act:?}: {top:?}");
        assert!(top.holder.starts_with("honest ~token:"), "{act:?}: {top:?}");
        let events = backing.read_events(&r, &Default::default()).await.unwrap();
        assert!(events.events.is_empty(), "{act:?}: {:?}", events.events);
        let cps = backing.list_checkpoints(&r).await.unwrap();
        assert_eq!(cps.len(), checkpoints_before, "{act:?}: {cps:?}");
        assert!(
            cps.iter()
                .any(|c| c.pending.as_ref().is_some_and(|p| p.resolved_at.is_none())),
            "{act:?}: the park was answered"
        );
        assert!(
            backing.read_run_record(&r).await.unwrap().is_none(),
            "{act:?}"
        );
        let l = backing.lifecycle(&r).await.unwrap();
        assert_eq!(l.status, RunStatus::Active, "{act:?}");
        // …and finishes its run itself.
        let done = Step {
            events: vec![event("work")],
            finish: Some(Outcome::completed(None)),
            ..Step::default()
        };
        honest
            .commit_step(&r, lease.fence, &done)
            .await
            .unwrap_or_else(|e| panic!("{act:?}: the honest step was refused: {e}"));
        drop(server);
    }
}

/// Item 5 of issue 26: a worker's unfenced write into another token's
/// lease that expired and was not claimed again would be stamped with
/// that lease's fence and pass for its holder's work: refused, like while
/// the lease is live. Taken over, the run takes the new holder's fenced
/// writes; released, unfenced ones again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfenced_write_into_another_tokens_lapsed_lease_is_refused() {
    let clock = support::store_clock();
    let backing: Arc<dyn RunStore> =
        Arc::new(runkeep::MemoryStore::with_clock(Arc::new(clock.clone())));
    let server = TestServer::start(backing.clone());
    let (w1, w2) = (worker(&server, WORKER_A), worker(&server, WORKER_A2));
    let r = support::run("lapsed");
    let short = ClaimOptions::new(Holder::new("w1").unwrap(), Ttl::from_millis(1_000).unwrap());
    let l1 = w1
        .claim(&r, &short)
        .await
        .unwrap()
        .lease()
        .expect("w1 holds");
    clock.advance(1_300);
    assert!(
        backing
            .lease(&r, backing.now())
            .await
            .unwrap()
            .unwrap()
            .expired
    );
    let refused = w2
        .write_checkpoint(&r, &support::checkpoint("w2", 1), None)
        .await;
    assert!(
        matches!(refused, Err(Error::NotYourHolding { fence, fenced: false, .. }) if fence == l1.fence),
        "{refused:?}"
    );
    let refused = w2.append_events(&r, &[event("w2")], None).await;
    assert!(
        matches!(refused, Err(Error::NotYourHolding { fenced: false, .. })),
        "{refused:?}"
    );
    assert!(backing.list_checkpoints(&r).await.unwrap().is_empty());
    assert!(backing
        .read_events(&r, &Default::default())
        .await
        .unwrap()
        .events
        .is_empty());
    let l2 = w2
        .claim(&r, &claim_opts("w2"))
        .await
        .unwrap()
        .lease()
        .expect("w2 takes over");
    let cp = w2
        .write_checkpoint(&r, &support::checkpoint("w2", 1), Some(l2.fence))
        .await
        .expect("w2's own holding");
    assert_eq!(cp.fence, Some(l2.fence));
    assert!(w2.release(&r, l2.fence).await.unwrap());
    w2.append_events(&r, &[event("w2")], None)
        .await
        .expect("an unfenced write to a released run");
}

// ---------------------------------------------------------------------------
// The flood, on real backends, through two servers.

/// Two servers over `a` and `b` (two instances of one store): the honest
/// worker on the first, the attacker on both.
async fn hijack_flood(label: &str, a: Arc<dyn RunStore>, b: Arc<dyn RunStore>) {
    let s1 = TestServer::start(a.clone());
    let s2 = TestServer::start(b);
    let attackers: Vec<Arc<dyn RunStore>> = vec![
        Arc::new(worker(&s1, WORKER_A2)),
        Arc::new(worker(&s2, WORKER_A2)),
    ];
    let report = hijack::flood_and_drain(
        a,
        Arc::new(worker(&s1, WORKER_A)),
        attackers,
        hijack::runs_wanted(50),
    )
    .await;
    eprintln!("{}", report.line(label));
    report.assert_clean(label);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn directory_root_flood_through_two_servers_hijacks_nothing() {
    use runkeep_fs::{FsRootOptions, FsRootStore};
    let dir = tempfile::tempdir().unwrap();
    let open = || -> Arc<dyn RunStore> {
        Arc::new(FsRootStore::open(dir.path().join("root"), FsRootOptions::default()).unwrap())
    };
    hijack_flood("directory root", open(), open()).await;
}

mod postgres {
    use super::*;
    use runkeep_postgres::{PgOptions, PgStore};

    /// A store connected on its own runtime (kept alive by the returned
    /// guard), as a second process would be.
    fn connect(url: &str, schema: &str) -> (Arc<dyn RunStore>, tokio::runtime::Runtime) {
        let (url, schema) = (url.to_string(), schema.to_string());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            let store = rt
                .block_on(PgStore::connect(
                    &url,
                    PgOptions {
                        schema,
                        pool_size: 4,
                        ..PgOptions::default()
                    },
                ))
                .expect("connect to PostgreSQL");
            (Arc::new(store) as Arc<dyn RunStore>, rt)
        })
        .join()
        .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn postgres_flood_through_two_servers_hijacks_nothing() {
        let url = std::env::var("RUNKEEP_TEST_POSTGRES_URL")
            .ok()
            .filter(|u| !u.is_empty())
            .expect("RUNKEEP_TEST_POSTGRES_URL is not set: run scripts/test.sh or set it to postgres://postgres@127.0.0.1:5432/test");
        let schema = format!("rkt_hijack_{}", std::process::id());
        let (a, rt_a) = connect(&url, &schema);
        let (b, rt_b) = connect(&url, &schema);
        hijack_flood("postgres", a, b).await;
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        let driver = tokio::spawn(conn);
        client
            .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
            .await
            .unwrap();
        drop(client);
        let _ = driver.await;
        rt_a.shutdown_background();
        rt_b.shutdown_background();
    }
}
