//! The peers (`--peers`): graphile-worker and pg-boss on Node, installed by
//! `npm ci` from the package.json and lockfile committed in `crates/runkeep-bench/peers/`
//! (built into this binary) into a directory under `target/`, and run by
//! `peers/peer.mjs`, one process per measurement.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;

use crate::stats::Sample;
use crate::work::Context;

const PACKAGE_JSON: &str = include_str!("../peers/package.json");
const PACKAGE_LOCK: &str = include_str!("../peers/package-lock.json");
const PEER_MJS: &str = include_str!("../peers/peer.mjs");

/// The default install directory (relative to the working directory).
pub const DEFAULT_DIR: &str = "target/bench-peers";

/// The peers measured: library, setting.
pub const PEERS: [(&str, &str); 4] = [
    ("graphile-worker", "default"),
    ("graphile-worker", "batched"),
    ("pg-boss", "default"),
    ("pg-boss", "batched"),
];

/// An installed peer harness.
#[derive(Clone, Debug)]
pub struct Peers {
    dir: PathBuf,
    /// `node --version`.
    pub node: String,
}

fn run(cmd: &mut Command, what: &str) -> Result<String, String> {
    let out = cmd.output().ctx(what)?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(8).collect();
        return Err(format!(
            "{what} failed ({}): {}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Writes `text` to `path` unless it already holds it; true when written.
fn put(path: &Path, text: &str) -> Result<bool, String> {
    if std::fs::read_to_string(path).is_ok_and(|t| t == text) {
        return Ok(false);
    }
    std::fs::write(path, text).ctx(&format!("write {}", path.display()))?;
    Ok(true)
}

/// The library versions the lockfile pins, for the record.
pub fn versions() -> serde_json::Value {
    let lock: serde_json::Value = serde_json::from_str(PACKAGE_LOCK).unwrap_or_default();
    let mut out = serde_json::Map::new();
    for name in ["graphile-worker", "pg-boss"] {
        if let Some(v) = lock
            .pointer(&format!("/packages/node_modules~1{name}/version"))
            .cloned()
        {
            out.insert(name.into(), v);
        }
    }
    serde_json::Value::Object(out)
}

impl Peers {
    /// Installs (or finds installed) the peers in `dir` (blocking).
    pub fn install(dir: &Path) -> Result<Self, String> {
        let node = run(Command::new("node").arg("--version"), "node --version")
            .map_err(|e| format!("{e} (--peers needs Node 20 or later and npm on PATH)"))?
            .trim()
            .to_string();
        std::fs::create_dir_all(dir).ctx(&format!("create {}", dir.display()))?;
        let changed = put(&dir.join("package.json"), PACKAGE_JSON)?
            | put(&dir.join("package-lock.json"), PACKAGE_LOCK)?;
        put(&dir.join("peer.mjs"), PEER_MJS)?;
        let installed = dir
            .join("node_modules/graphile-worker/package.json")
            .is_file()
            && dir.join("node_modules/pg-boss/package.json").is_file();
        if changed || !installed {
            run(
                Command::new("npm")
                    .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
                    .current_dir(dir),
                "npm ci (the peers)",
            )?;
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            node,
        })
    }

    /// One measurement (blocking): `jobs` jobs enqueued in `schema`, then
    /// taken and completed by `workers` workers. The jobs timed may be
    /// fewer (those done before the clock started are not counted), or none.
    pub fn measure(
        &self,
        url: &str,
        lib: &str,
        mode: &str,
        workers: usize,
        jobs: u64,
        schema: &str,
    ) -> Result<Sample, String> {
        #[derive(Deserialize)]
        struct Answer {
            jobs: f64,
            secs: f64,
        }
        let out = run(
            Command::new("node")
                .arg("peer.mjs")
                .args(["--lib", lib, "--mode", mode])
                .args(["--workers", &workers.to_string()])
                .args(["--jobs", &jobs.to_string()])
                .args(["--schema", schema])
                .env("BENCH_PG_URL", url)
                .current_dir(&self.dir),
            &format!("node peer.mjs --lib {lib} --mode {mode}"),
        )?;
        let line = out.lines().rev().find(|l| l.starts_with('{')).unwrap_or("");
        let a: Answer =
            serde_json::from_str(line).ctx(&format!("the answer of peer.mjs ({line:?})"))?;
        Ok(Sample {
            units: a.jobs,
            secs: a.secs,
            latencies_us: Vec::new(),
        })
    }
}
