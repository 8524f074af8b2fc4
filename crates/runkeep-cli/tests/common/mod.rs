//! Helpers of the end-to-end tests: run the real `runkeep` binary against a
//! real temporary directory.

#![allow(
    dead_code,
    reason = "each test binary uses a different part of these shared helpers"
)]

pub mod servers;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use assert_cmd::Command;
use serde_json::Value;

/// A store directory that lives as long as the test.
pub struct Store {
    dir: tempfile::TempDir,
}

impl Store {
    /// An empty store directory.
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    /// A store seeded with the six demo runs (run_demo_001 … run_demo_006).
    pub fn seeded() -> Self {
        let s = Self::new();
        s.cmd(&["seed"]).assert().success();
        s
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `fs:<dir>`.
    pub fn address(&self) -> String {
        format!("fs:{}", self.path().display())
    }

    /// `runkeep --store fs:<dir> ARGS…`, with a clean environment.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = runkeep();
        c.arg("--store").arg(self.address()).args(args);
        c
    }

    /// Runs and parses stdout as one JSON document.
    pub fn json(&self, args: &[&str]) -> Value {
        let mut full = vec!["--json"];
        full.extend_from_slice(args);
        let out = self.cmd(&full).output().expect("run runkeep");
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout of {args:?} is not JSON ({e}); exit {:?}\nstdout: {}\nstderr: {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }

    /// A run's directory (root runs live at `<base>/<run id>`).
    pub fn run_dir(&self, run: &str) -> PathBuf {
        self.path().join(run)
    }
}

/// How long one `runkeep` command of these tests may run before it is
/// killed (a hung command fails its test instead of hanging the suite); a
/// test that runs something longer sets its own `timeout`.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// `runkeep` with no RUNKEEP_* variable from the caller's environment and no
/// colour, killed after [`COMMAND_TIMEOUT`].
pub fn runkeep() -> Command {
    let mut c = Command::cargo_bin("runkeep").expect("runkeep binary");
    clean_env(&mut c);
    c.timeout(COMMAND_TIMEOUT);
    c
}

/// Waits for `child` at most `timeout`; kills it and panics (naming `what`)
/// when it is still running by then.
pub fn wait_within(
    child: &mut std::process::Child,
    timeout: Duration,
    what: &str,
) -> std::process::ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not exit within {timeout:?}; killed it");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// [`std::process::Command::output`] bounded by `timeout` (stdout and stderr
/// are piped unless the caller set them).
pub fn output_within(
    cmd: &mut std::process::Command,
    timeout: Duration,
    what: &str,
) -> std::process::Output {
    use std::io::Read;
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("{what}: {e}"));
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let status = wait_within(&mut child, timeout, what);
    std::process::Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// True when the tests run as root (CI does).
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// `runkeep` as a user that file modes apply to. Root ignores modes, so as
/// root it runs through `setpriv` as `nobody` (util-linux); as anyone else
/// it runs as that user, whom a mode-000 directory they own also shuts out.
pub fn runkeep_unprivileged() -> Command {
    if !is_root() {
        return runkeep();
    }
    let mut c = Command::new("setpriv");
    c.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
        .arg(assert_cmd::cargo::cargo_bin("runkeep"));
    clean_env(&mut c);
    c.timeout(COMMAND_TIMEOUT);
    c
}

/// Makes `dir` traversable by other users (a temp dir is 0700), so an
/// unprivileged process can reach what is inside it.
pub fn share(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).expect("chmod 755");
}

/// Sets `path`'s mode (e.g. `0o000` to shut everyone but root out).
pub fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

fn clean_env(c: &mut Command) {
    for var in [
        "RUNKEEP_STORE",
        "RUNKEEP_TENANT",
        "RUNKEEP_PROJECT",
        "RUNKEEP_SESSION",
        "RUNKEEP_DURABILITY",
        "RUNKEEP_LOG",
        "RUNKEEP_DOCTOR_TEST_SLOW_CHECK_MS",
        "RUNKEEP_DOCTOR_TEST_FAULTY_CHECK",
        "RUNKEEP_TEST_PANIC",
        "RUNKEEP_PG_SCHEMA",
    ] {
        c.env_remove(var);
    }
    c.env("NO_COLOR", "1");
}

/// Stdout of a successful run, as text.
pub fn stdout(cmd: &mut Command) -> String {
    let out = cmd.assert().success().get_output().stdout.clone();
    String::from_utf8(out).expect("utf-8 stdout")
}
