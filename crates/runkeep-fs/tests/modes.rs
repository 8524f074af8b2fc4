//! Run data is private by default: every file the directory backend
//! creates is 0600 and every directory 0700, even under a umask that would
//! allow more (this test binary sets umask 0). Every case of the
//! conformance kit is run against a fresh single-session store and a fresh
//! root of many sessions (checkpoints, parks, events, documents, steps,
//! holdings, fenced-out refusals, the queue, the index, …); then every
//! entry they made is stat'ed.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use runkeep::RunStore;
use runkeep_conformance::{all_cases, outcome_of, support, CaseEnv};
use runkeep_fs::{
    Attribution, FsOptions, FsRootOptions, FsRootStore, FsStore, DIR_MODE, FILE_MODE,
};

/// Every entry under `dir` whose mode is not the private one, with its mode.
fn not_private(dir: &Path) -> (usize, Vec<String>) {
    let mut seen = 0;
    let mut wrong = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let mode = m.permissions().mode() & 0o7777;
            seen += 1;
            let want = if m.is_dir() { DIR_MODE } else { FILE_MODE };
            if mode != want {
                wrong.push(format!("{} {mode:o}", p.display()));
            }
            if m.is_dir() {
                stack.push(p);
            }
        }
    }
    (seen, wrong)
}

fn mode_of(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

async fn run_every_case(open: impl Fn(&Path) -> (Arc<dyn RunStore>, CaseEnv), top: &Path) {
    for (i, case) in all_cases().into_iter().enumerate() {
        let (store, env) = open(&top.join(format!("case{i:03}")));
        // Pass or fail, what it wrote is what is looked at (the kit's own
        // suites check the outcomes).
        let _ = outcome_of(case, store, env).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_file_is_0600_and_every_directory_0700_under_umask_0() {
    rustix::process::umask(rustix::fs::Mode::empty());
    assert_eq!((FILE_MODE, DIR_MODE), (0o600, 0o700));
    let dir = tempfile::tempdir().unwrap();

    // One session's runs/ directory, created by the store (with its parent).
    let sessions = dir.path().join("sessions");
    std::fs::create_dir(&sessions).unwrap();
    run_every_case(
        |at| {
            let clock = support::store_clock();
            let store = FsStore::open(
                at.join("runs"),
                FsOptions {
                    attribution: Some(Attribution {
                        tenant_id: support::tenant(),
                        project_id: support::project(),
                        session_id: support::session(),
                    }),
                    clock: Some(Arc::new(clock.clone())),
                    ..Default::default()
                },
            )
            .unwrap();
            let env = CaseEnv {
                contract_version: 3,
                clock: Some(clock),
            };
            (Arc::new(store) as Arc<dyn RunStore>, env)
        },
        &sessions,
    )
    .await;

    // A root of many sessions, created by the store.
    let roots = dir.path().join("roots");
    std::fs::create_dir(&roots).unwrap();
    run_every_case(
        |at| {
            let clock = support::store_clock();
            let store = FsRootStore::open(
                at.join("root"),
                FsRootOptions {
                    clock: Some(Arc::new(clock.clone())),
                    ..Default::default()
                },
            )
            .unwrap();
            let env = CaseEnv {
                contract_version: 3,
                clock: Some(clock),
            };
            (Arc::new(store) as Arc<dyn RunStore>, env)
        },
        &roots,
    )
    .await;

    for top in [&sessions, &roots] {
        let (seen, wrong) = not_private(top);
        // The per-case directories the store created (`caseNNN`, the
        // parents of its base) are among them.
        assert!(seen > 1000, "only {seen} entries under {}", top.display());
        assert!(
            wrong.is_empty(),
            "{} of {seen} entries are not private: {:?}",
            wrong.len(),
            &wrong[..wrong.len().min(20)]
        );
    }
    assert_eq!(mode_of(&sessions.join("case000/runs")), DIR_MODE);
    assert_eq!(mode_of(&roots.join("case000/root")), DIR_MODE);
}
