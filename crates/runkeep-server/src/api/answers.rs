//! What answers may cost the server, together.
//!
//! The reads whose answer can be large — a checkpoint (up to the contract's
//! 64 MiB state), a checkpoint listing with states, a page of events —
//! are charged to one [`AnswerBudget`] of memory, in KiB, for as long as the
//! answer is held: from before the store is read until the last byte of it
//! has been handed to the connection. An answer that finds no room within
//! [`ANSWER_BUDGET_WAIT`] is refused 503 `overloaded` (with `Retry-After`),
//! having read nothing.
//!
//! - **Shares.** Every tenant has a share of the budget ([`AnswerBudget::share_kib`],
//!   half of it): one tenant's readers cannot take all of it, so another
//!   tenant's answers are still served while they wait. An answer is
//!   charged to its tenant's share and to the whole budget.
//! - **Before the read.** How large a checkpoint is is only known once it is
//!   read, and reading it already costs the memory; so a read is charged
//!   before the store is asked: [`READ_FACTOR`] × the last answer's size
//!   for the same run (the state parsed, the file or rows it came from and
//!   the answer's bytes), or, for a run whose answers have not been seen
//!   since the server started, the dearest answer ([`DEAREST_KIB`], capped at
//!   the share). Most runs' checkpoints are small: the first read learns
//!   that and the charge comes back at once.
//! - **After the read.** The answer is serialized once, into bytes (on the
//!   blocking pool), the parsed value dropped, and the charge lowered (or
//!   raised, when the run's checkpoint grew) to the bytes; they are handed
//!   to the connection with the charge attached ([`ChargedBytes`]), so the
//!   charge is given back when the connection has written them.
//! - **Pages** of events are streamed in chunks (see `events.rs`), each
//!   charged the same way while it is in flight.
//! - **Processor time.** Reading and serializing a large answer is heavy
//!   work on the blocking pool; one tenant does at most
//!   [`AnswerBudget::heavy_per_tenant`] of it at once (half the cores), so
//!   its readers cannot take every core from the other tenants' requests.
//!   Heavy: an answer charged 1 MiB or more before its read, and every
//!   event chunk after a page's first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::problem::{Problem, ProblemType};

/// How long an answer waits for room in the [`AnswerBudget`].
pub const ANSWER_BUDGET_WAIT: Duration = Duration::from_secs(5);

/// The default budget, bytes (`ServerConfig::answer_budget`).
pub const DEFAULT_ANSWER_BUDGET: usize = 512 * 1024 * 1024;

/// What a read is charged before it is made, per byte of the run's last
/// answer: the parsed value, what it was read from, and the answer's bytes.
pub const READ_FACTOR: u32 = 3;

/// The charge of a read whose size is not known yet: three times the
/// contract's largest checkpoint (64 MiB), capped at the share.
pub const DEAREST_KIB: u32 = 3 * 64 * 1024;

/// What makes a read heavy work (module docs), KiB charged before it.
pub const HEAVY_KIB: u32 = 1024;

/// The least any charged answer is charged, KiB.
pub const MIN_KIB: u32 = 16;

/// Runs whose last answer size is remembered; beyond it the memory is
/// forgotten (reads are then charged as unknown again).
const REMEMBERED_RUNS: usize = 100_000;

pub(crate) fn kib(bytes: usize) -> u32 {
    u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX / 4)
}

/// The memory answers in flight may take together (module docs).
#[derive(Clone, Debug)]
pub struct AnswerBudget(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    total: Arc<Semaphore>,
    total_kib: u32,
    share_kib: u32,
    tenants: Mutex<HashMap<String, Arc<Semaphore>>>,
    last: Mutex<HashMap<String, u32>>,
    heavy: Mutex<HashMap<String, Arc<Semaphore>>>,
    heavy_per_tenant: usize,
}

impl AnswerBudget {
    /// A budget of `bytes` (at least 1 MiB); each tenant's share is half.
    pub fn new(bytes: usize) -> Self {
        let total_kib = kib(bytes).max(1024);
        Self(Arc::new(Inner {
            total: Arc::new(Semaphore::new(total_kib as usize)),
            total_kib,
            share_kib: total_kib / 2,
            tenants: Mutex::new(HashMap::new()),
            last: Mutex::new(HashMap::new()),
            heavy: Mutex::new(HashMap::new()),
            heavy_per_tenant: std::thread::available_parallelism()
                .map_or(1, |n| n.get() / 2)
                .max(1),
        }))
    }

    /// The whole budget, KiB.
    pub fn total_kib(&self) -> u32 {
        self.0.total_kib
    }

    /// One tenant's share, KiB: the most its answers hold at once.
    pub fn share_kib(&self) -> u32 {
        self.0.share_kib
    }

    /// What the whole budget has free now, KiB (tests, metrics).
    pub fn free_kib(&self) -> usize {
        self.0.total.available_permits()
    }

    fn tenant(&self, tenant: &str) -> Arc<Semaphore> {
        let mut t = self.0.tenants.lock().unwrap_or_else(|p| p.into_inner());
        t.entry(tenant.to_string())
            .or_insert_with(|| Arc::new(Semaphore::new(self.0.share_kib as usize)))
            .clone()
    }

    /// How much heavy answer work one tenant does at once (module docs).
    pub fn heavy_per_tenant(&self) -> usize {
        self.0.heavy_per_tenant
    }

    /// Waits for a turn at heavy work for `tenant` (module docs); the turn
    /// ends when the permit is dropped. `None` when the work is light.
    pub async fn heavy(&self, tenant: &str, kib: u32) -> Option<OwnedSemaphorePermit> {
        if kib < HEAVY_KIB {
            return None;
        }
        let sem = {
            let mut h = self.0.heavy.lock().unwrap_or_else(|p| p.into_inner());
            h.entry(tenant.to_string())
                .or_insert_with(|| Arc::new(Semaphore::new(self.0.heavy_per_tenant)))
                .clone()
        };
        sem.acquire_owned().await.ok()
    }

    /// Charges `kib` to `tenant`'s share and to the whole budget, waiting
    /// at most [`ANSWER_BUDGET_WAIT`]; 503 `overloaded` without room.
    pub async fn charge(&self, tenant: &str, kib: u32) -> Result<Held, Problem> {
        let mut held = Held {
            budget: self.clone(),
            share: self.tenant(tenant),
            kib: 0,
        };
        held.raise_to(kib).await?;
        Ok(held)
    }

    /// What a read of `key`'s answer is charged before it is made (module
    /// docs): [`READ_FACTOR`] × its last size, or [`DEAREST_KIB`].
    pub fn before_read(&self, key: &str) -> u32 {
        let last = self.0.last.lock().unwrap_or_else(|p| p.into_inner());
        match last.get(key) {
            Some(k) => k.saturating_mul(READ_FACTOR).max(MIN_KIB),
            None => DEAREST_KIB,
        }
    }

    /// Remembers the size of `key`'s last answer.
    pub fn learn(&self, key: &str, bytes: usize) {
        let mut last = self.0.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.len() >= REMEMBERED_RUNS && !last.contains_key(key) {
            last.clear();
        }
        last.insert(key.to_string(), kib(bytes));
    }
}

/// A charge held: given back when dropped.
#[derive(Debug)]
pub struct Held {
    budget: AnswerBudget,
    share: Arc<Semaphore>,
    kib: u32,
}

fn overloaded() -> Problem {
    Problem::new(
        ProblemType::Overloaded,
        "answers in flight already take this server's memory budget for answers (or this tenant's share of it); nothing was read, retry later",
    )
}

impl Held {
    /// What is held, KiB.
    pub fn kib(&self) -> u32 {
        self.kib
    }

    /// Raises the charge to `kib` (capped at the share; at least
    /// [`MIN_KIB`]), waiting at most [`ANSWER_BUDGET_WAIT`].
    pub async fn raise_to(&mut self, kib: u32) -> Result<(), Problem> {
        let want = kib.max(MIN_KIB).min(self.budget.0.share_kib);
        let more = want.saturating_sub(self.kib);
        if more == 0 {
            return Ok(());
        }
        let got = tokio::time::timeout(ANSWER_BUDGET_WAIT, async {
            let a = self.share.acquire_many(more).await.ok()?;
            let b = self.budget.0.total.acquire_many(more).await.ok()?;
            a.forget();
            b.forget();
            Some(())
        })
        .await;
        match got {
            Ok(Some(())) => {
                self.kib += more;
                Ok(())
            }
            _ => Err(overloaded()),
        }
    }

    /// Lowers the charge to `kib` (at least [`MIN_KIB`]), giving back the
    /// rest at once.
    pub fn lower_to(&mut self, kib: u32) {
        let keep = kib.max(MIN_KIB).min(self.kib);
        let back = self.kib - keep;
        if back > 0 {
            self.share.add_permits(back as usize);
            self.budget.0.total.add_permits(back as usize);
            self.kib = keep;
        }
    }

    /// Sets the charge to what `bytes` of answer cost: lowered at once,
    /// raised waiting as [`Held::raise_to`] does.
    pub async fn set_bytes(&mut self, bytes: usize) -> Result<(), Problem> {
        let k = kib(bytes);
        if k <= self.kib {
            self.lower_to(k);
            Ok(())
        } else {
            self.raise_to(k).await
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.kib > 0 {
            self.share.add_permits(self.kib as usize);
            self.budget.0.total.add_permits(self.kib as usize);
        }
    }
}

/// An answer's bytes with their charge: the charge is given back when the
/// connection drops the bytes (written, or the connection gone).
#[derive(Debug)]
pub struct ChargedBytes {
    bytes: Vec<u8>,
    _held: Option<Held>,
}

impl ChargedBytes {
    /// `bytes`, holding `held` until they are dropped.
    pub fn new(bytes: Vec<u8>, held: Option<Held>) -> Self {
        Self { bytes, _held: held }
    }

    /// As `Bytes` for a response body (no copy).
    pub fn into_bytes(self) -> bytes::Bytes {
        bytes::Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for ChargedBytes {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_tenant_holds_at_most_its_share_and_gets_it_back() {
        let b = AnswerBudget::new(4 << 20);
        let share = b.share_kib();
        let held = b.charge("a", share).await.unwrap();
        assert_eq!(b.free_kib(), (b.total_kib() - share) as usize);
        // The same tenant finds no room (after the wait); another does.
        let refused = b.charge("a", 64).await;
        assert_eq!(
            refused.unwrap_err().kind(),
            Some(crate::problem::ProblemType::Overloaded)
        );
        let other = b.charge("b", 64).await.unwrap();
        drop(held);
        drop(other);
        assert_eq!(b.free_kib(), b.total_kib() as usize);
    }

    #[tokio::test]
    async fn a_charge_is_lowered_and_given_back_with_its_bytes() {
        let b = AnswerBudget::new(4 << 20);
        let mut held = b.charge("a", 1024).await.unwrap();
        held.set_bytes(100 * 1024).await.unwrap();
        assert_eq!(held.kib(), 100);
        let bytes = ChargedBytes::new(vec![1; 10], Some(held)).into_bytes();
        assert_eq!(b.free_kib(), (b.total_kib() - 100) as usize);
        drop(bytes);
        assert_eq!(b.free_kib(), b.total_kib() as usize);
    }

    #[test]
    fn an_unknown_read_is_charged_the_dearest_and_a_known_one_its_size() {
        let b = AnswerBudget::new(1 << 30);
        assert_eq!(b.before_read("r"), DEAREST_KIB);
        b.learn("r", 10 * 1024);
        assert_eq!(b.before_read("r"), 30);
    }
}
