//! Helpers shared by the integration tests: scopes, stores, and worker
//! processes (the test binary re-entered as a separate OS process).
#![allow(
    dead_code,
    reason = "each test binary uses a different part of these shared helpers"
)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use runkeep::{
    Checkpoint, CheckpointId, ClaimOptions, Holder, ProjectId, RunId, RunScope, SessionId,
    TenantId, Timestamp, Ttl,
};
use runkeep_fs::{Attribution, FsOptions, FsStore};
use serde_json::{json, Map};

pub const WORKER_ENV: &str = "RUNKEEP_FS_WORKER";
/// The name of the entry point every process-test file defines.
pub const WORKER_TEST: &str = "worker_process_entry";

pub fn tenant() -> TenantId {
    TenantId::new("tnt_fs").unwrap()
}
pub fn project() -> ProjectId {
    ProjectId::new("prj_fs").unwrap()
}
pub fn session() -> SessionId {
    SessionId::new("ses_fs").unwrap()
}
pub fn attribution() -> Attribution {
    Attribution {
        tenant_id: tenant(),
        project_id: project(),
        session_id: session(),
    }
}
pub fn scope(run: &str) -> RunScope {
    RunScope::new(tenant(), project(), session(), RunId::new(run).unwrap())
}
pub fn child_scope(run: &str, parent: &str) -> RunScope {
    scope(run).with_parent(RunId::new(parent).unwrap())
}

pub fn open(base: &Path) -> FsStore {
    FsStore::open(
        base,
        FsOptions {
            attribution: Some(attribution()),
            ..Default::default()
        },
    )
    .expect("open the store")
}

/// A store with the prune grace period `grace` (`Duration::ZERO`: pruning
/// by count alone, as before the grace period existed).
pub fn open_with_grace(base: &Path, grace: Duration) -> FsStore {
    FsStore::open(
        base,
        FsOptions {
            attribution: Some(attribution()),
            prune_grace: grace,
            ..Default::default()
        },
    )
    .expect("open the store")
}

/// The prune grace period a worker was given in `PRUNE_GRACE_MS` (the
/// default when unset).
pub fn grace_from_env() -> Duration {
    std::env::var("PRUNE_GRACE_MS")
        .ok()
        .map(|v| Duration::from_millis(v.parse().expect("PRUNE_GRACE_MS: milliseconds")))
        .unwrap_or(FsOptions::DEFAULT_PRUNE_GRACE)
}

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

pub fn at(ms: i64) -> Timestamp {
    Timestamp::from_millis(ms).unwrap()
}

pub fn holder(name: &str) -> Holder {
    Holder::new(name).unwrap()
}

pub fn opts(name: &str, ttl_ms: u64, now_ms: i64) -> ClaimOptions {
    ClaimOptions::new(holder(name), Ttl::from_millis(ttl_ms).unwrap()).at(at(now_ms))
}

pub fn cp(id: &str, created_ms: i64) -> Checkpoint {
    let mut state = Map::new();
    state.insert("iteration".into(), json!(1));
    state.insert(
        "messages".into(),
        json!([{"role": "user", "content": "hi"}]),
    );
    Checkpoint::new(CheckpointId::new(id).unwrap(), at(created_ms), state)
}

pub fn now_ms() -> i64 {
    Timestamp::now().as_millis()
}

/// A temp directory traversable by other users (for `setpriv` tests).
pub fn tempdir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// Every path under `dir` with its size and modification time, for
/// "nothing was created or modified" checks.
pub fn tree(dir: &Path) -> BTreeMap<PathBuf, (u64, std::time::SystemTime)> {
    let mut out = BTreeMap::new();
    fn walk(d: &Path, out: &mut BTreeMap<PathBuf, (u64, std::time::SystemTime)>) {
        let Ok(rd) = std::fs::read_dir(d) else { return };
        for e in rd.flatten() {
            let p = e.path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            out.insert(p.clone(), (m.len(), m.modified().unwrap()));
            if m.is_dir() {
                walk(&p, out);
            }
        }
    }
    walk(dir, &mut out);
    out
}

/// True when running as root (mount tests).
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Runs a command, returning whether it succeeded (stderr captured).
pub fn sh(cmd: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!(
            "{cmd} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A worker process: this test binary re-entered at [`WORKER_TEST`] with a
/// role in [`WORKER_ENV`]. Lines it prints starting with `@@ ` are reports.
pub struct Worker {
    pub child: Child,
    pub stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    pub reports: Vec<String>,
}

pub fn spawn(role: &str, envs: &[(&str, String)]) -> Worker {
    spawn_as(role, envs, None)
}

/// Spawns a worker, optionally through a wrapper command (e.g. `setpriv`).
pub fn spawn_as(role: &str, envs: &[(&str, String)], wrapper: Option<&[&str]>) -> Worker {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = match wrapper {
        Some(w) => {
            let mut c = Command::new(w[0]);
            c.args(&w[1..]).arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    cmd.args([WORKER_TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(WORKER_ENV, role)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn worker");
    let stdout = child.stdout.take().unwrap();
    let stdin = child.stdin.take();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            // libtest may print "test <name> ... " on the same line first.
            if let Some(i) = line.find("@@ ") {
                if tx.send(line[i + 3..].to_string()).is_err() {
                    break;
                }
            }
        }
    });
    Worker {
        child,
        stdin,
        lines: rx,
        reports: Vec::new(),
    }
}

impl Worker {
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Waits for a report starting with `prefix`; every report seen is kept.
    pub fn expect(&mut self, prefix: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.reports.push(l.clone());
                    if l.starts_with(prefix) {
                        return l;
                    }
                }
                Err(_) => panic!(
                    "worker {} did not report {prefix:?} within {timeout:?}; reports so far: {:?}",
                    self.child.id(),
                    self.reports
                ),
            }
        }
    }

    pub fn send(&mut self, line: &str) {
        let s = self.stdin.as_mut().expect("stdin");
        writeln!(s, "{line}").unwrap();
        s.flush().unwrap();
    }

    /// Waits for exit and collects every remaining report.
    pub fn finish(mut self, timeout: Duration) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                while let Ok(l) = self.lines.recv_timeout(Duration::from_millis(200)) {
                    self.reports.push(l);
                }
                assert!(
                    status.success(),
                    "worker exited with {status}; reports: {:?}",
                    self.reports
                );
                return std::mem::take(&mut self.reports);
            }
            while let Ok(l) = self.lines.try_recv() {
                self.reports.push(l);
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "worker did not finish within {timeout:?}; reports: {:?}",
                    self.reports
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// SIGKILLs the worker and collects what it reported before dying.
    pub fn kill9(mut self) -> Vec<String> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        while let Ok(l) = self.lines.recv_timeout(Duration::from_millis(200)) {
            self.reports.push(l);
        }
        std::mem::take(&mut self.reports)
    }
}

/// A worker left behind by a failing test (stopped at a pause point, or
/// waiting on its stdin) is killed, so it cannot outlive the test binary and
/// keep the inherited stderr open (which would hang whatever reads it).
impl Drop for Worker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Sends a signal to a process.
pub fn signal(pid: i32, sig: rustix::process::Signal) {
    rustix::process::kill_process(rustix::process::Pid::from_raw(pid).unwrap(), sig).unwrap();
}

/// The state letter of a process (`T` when stopped).
pub fn proc_state(pid: i32) -> char {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    s.rsplit(')')
        .next()
        .and_then(|r| r.trim().chars().next())
        .unwrap_or('?')
}

/// Reports a line to the parent (from a worker).
pub fn report(line: impl AsRef<str>) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "@@ {}", line.as_ref()).unwrap();
    out.flush().unwrap();
}

/// Environment variable of a worker.
pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("worker needs {name}"))
}

/// Sleeps until the wall clock reaches `ms` (a start barrier).
pub fn sleep_until(ms: i64) {
    let d = ms - now_ms();
    if d > 0 {
        std::thread::sleep(Duration::from_millis(d as u64));
    }
}

/// Appends bytes to a log as a lock-less writer does (the reference: no
/// lock, no offset index).
pub fn raw_append(path: &Path, bytes: &[u8]) {
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .unwrap()
        .write_all(bytes)
        .unwrap();
}
