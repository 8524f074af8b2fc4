//! runkeep's directory backend: fenced leases, checkpoints and run evidence
//! in a plain directory, correct across processes.
//!
//! [`FsStore`] implements [`runkeep::CheckpointStore`] and
//! [`runkeep::EvidenceStore`] over one session's `runs/` directory, laid out
//! as the reference design lays it out (so the reference can still read it)
//! plus a few additive, ignorable files under each run's `.runkeep/`.
//! [`FsRootStore`] holds many tenants in one directory, one such session
//! per `ROOT/<tenant>/<project>/<session>/runs/` (isolation by path,
//! listings and `claim_next` over a project or tenant).
//!
//! # Why it looks like this
//!
//! - **The fence is the file name.** A holding is `claims/<fence>.json`,
//!   published by hard `link` from a body that is already whole: the kernel
//!   picks exactly one winner per number, and no reader ever sees the name
//!   without its body. There is no lock file that could go stale and need a
//!   breaker. A volume without hard links is refused when the store opens.
//! - **Every write of a run is fenced**, and the check is made under a
//!   kernel-released advisory lock on the run (exclusive for writes, shared
//!   for claims), so a takeover cannot slip between "check the fence" and
//!   "publish". Waits for that lock are bounded, so a stopped process cannot
//!   wedge a run; what remains of the window is documented in
//!   `docs/design/directory/lease-and-fencing.md`.
//! - **Reads have no side effects.** Listing, event reads, checkpoint reads
//!   and the doctor's scan create and modify nothing.
//! - **Listing costs O(page) file reads**: each run keeps a digest (latest
//!   checkpoint, count, run start, parks) checked for freshness against its
//!   checkpoints directory, so a row never parses a checkpoint; a damaged run
//!   is a flagged row, never a failed page.
//! - **Durability is explicit** ([`Durability`]).
//! - **Private by default**: every file it creates is mode [`FILE_MODE`]
//!   (0600) and every directory [`DIR_MODE`] (0700), whatever the umask
//!   allows beyond that: run data is whatever an agent saw. Every process
//!   of a store runs as one user; other users read it through `runkeep
//!   serve` and a reader token. (A directory made before this was the
//!   rule keeps its mode; `chmod -R go-rwx` makes it private.)
//!
//! ```no_run
//! use runkeep::{CheckpointStore, ClaimOptions, Holder, Ttl};
//! use runkeep_fs::{Attribution, FsOptions, FsStore};
//!
//! # async fn demo(run: runkeep::RunScope, cp: runkeep::Checkpoint) -> runkeep::Result<()> {
//! let store = FsStore::open(
//!     "/var/lib/agents/projects/prj_a/sessions/ses_a/runs",
//!     FsOptions {
//!         attribution: Some(Attribution {
//!             tenant_id: run.tenant_id.clone(),
//!             project_id: run.project_id.clone(),
//!             session_id: run.session_id.clone(),
//!         }),
//!         ..Default::default()
//!     },
//! )?;
//! let opts = ClaimOptions::new(Holder::unique("worker"), Ttl::from_millis(30_000)?);
//! if let Some(lease) = store.claim(&run, &opts).await?.lease() {
//!     store.write_checkpoint(&run, &cp, Some(lease.fence)).await?;
//!     store.release(&run, lease.fence).await?;
//! }
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

// The crate reads top-down. The stores on top only delegate: `FsStore`
// (one session, `fs_store.rs`) and `FsRootStore` (many, `root/`). Below
// them the jobs, each taking the store's state (`Inner`) as a parameter.
// Below those the state and guards (`inner.rs`), the fenced-write
// skeleton, and the foundations every module imports from: options,
// system calls behind the fault points, the run lock, the test hooks. See
// docs/design/directory/code-layout.md.

// The stores.
mod fs_store;
mod root;

// The jobs.
mod checkpoints;
mod claims;
mod dedupe;
mod diagnose;
mod documents;
mod failures;
mod index;
mod keys;
mod listing;
mod opening;
mod queue;
mod retention;
mod run_state;
mod schedules;
mod steps;
mod transcript;
mod watching;

// The state, the write skeleton and the foundations.
mod blocking;
mod fenced_write;
mod hard_links;
mod inner;
mod lock;
mod options;
mod sys;
mod testing_hooks;

#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod testing;

pub use diagnose::Diagnosis;
pub use fs_store::FsStore;
pub use hard_links::{
    is_no_hard_link_errno, probe_hard_links, HardLinkProbeError, HardLinks, NO_HARD_LINK_ERRNOS,
};
pub use index::IndexOutlook;
pub use listing::{is_listed_run_name, LISTED_RUN_PREFIX};
pub use options::{Attribution, Durability, FsOptions};
pub use root::{
    FsRootOptions, FsRootStore, MAX_WATCHED_SESSIONS, ROOT_LAYOUT_VERSION, ROOT_MARKER,
    SESSION_RUNS_DIR,
};
pub use sys::{DIR_MODE, FILE_MODE};
