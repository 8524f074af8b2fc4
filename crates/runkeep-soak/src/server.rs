//! The soak over HTTP: the workers drive the store through the HTTP API of
//! a `runkeep serve` the soak starts itself, and the chaos also kills that
//! server (`kill -9`) and starts it again on the same port and backing
//! store while the workers go on.
//!
//! - **The server** is the `runkeep` binary as a child process (`runkeep
//!   serve --listen 127.0.0.1:0`, the port it bound read from its `--json`
//!   `listening` line; every restart binds that same port). Its backing
//!   store is the soak's own fresh store (a directory root by default, or
//!   the PostgreSQL schema of `--store postgres://…`), handed over like a
//!   worker's: a PostgreSQL URL in the environment, never on a command
//!   line ([`ServeCommand`] says how).
//! - **The workers** get `--store http://127.0.0.1:PORT` and a worker token
//!   (created in the soak's own token file, in their environment as
//!   `RUNKEEP_TOKEN`, never on a command line), and a request timeout of
//!   their lease TTL, so a vanished server is an error, never a hang.
//! - **The audit** reads the backing store directly, never through the
//!   server, so a server bug cannot hide a violation.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use rand::seq::SliceRandom;
use rand::Rng;

use crate::BackendChaos;

/// How long a (re)started server may take to print its address.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// How many times a restart tries to bind the port again (the port may
/// still be held for a moment after the kill).
const BIND_ATTEMPTS: u32 = 20;

/// The label the server's kills are counted under in the backend chaos.
pub const KILL_LABEL: &str = "server kill -9s";

/// The label the server's stalls are counted under in the backend chaos.
pub const STALL_LABEL: &str =
    "server stalls (SIGSTOP past the lease TTL: connections open, nothing answered)";

/// How to start `runkeep serve` over the soak's backing store: the binary,
/// and what goes before `serve` on its command line or in its environment
/// (the store address, the scope). A secret (a PostgreSQL URL with a
/// password) goes in `env`, never in `args`: `ps` shows command lines.
#[derive(Clone)]
pub struct ServeCommand {
    /// The `runkeep` binary.
    pub exe: PathBuf,
    /// The global options, before `serve` (`--store`, `--tenant`, …).
    pub args: Vec<String>,
    /// Variables to set (e.g. `RUNKEEP_STORE` holding a secret URL).
    pub env: Vec<(String, String)>,
    /// Variables to remove from the inherited environment.
    pub env_remove: Vec<String>,
    /// The backing store as printed (no secret).
    pub shown: String,
}

impl std::fmt::Debug for ServeCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeCommand")
            .field("exe", &self.exe)
            .field("backing", &self.shown)
            .finish_non_exhaustive()
    }
}

/// The soak's own `runkeep serve`.
pub struct Server {
    /// The prefix of its logs (`server`, `server1`, …).
    name: String,
    command: ServeCommand,
    tokens: PathBuf,
    log_dir: PathBuf,
    child: Mutex<Option<Child>>,
    listen: Mutex<SocketAddr>,
    starts: AtomicU64,
    restarts: AtomicU64,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("backing", &self.command.shown)
            .field("listen", &self.address())
            .finish_non_exhaustive()
    }
}

impl Server {
    /// Starts `command` on a free port of 127.0.0.1, with its tokens in
    /// [`Server::tokens_file`] of `soak_dir` and its logs in `soak_dir`
    /// (`server-N.stdout`, `server-N.stderr`).
    pub fn start(command: ServeCommand, soak_dir: &Path) -> Result<Self, String> {
        Self::start_named(command, soak_dir, "server")
    }

    /// [`Server::start`] with its logs named `NAME-N.stdout` and
    /// `NAME-N.stderr` (one name per server when several share the soak's
    /// directory).
    pub fn start_named(command: ServeCommand, soak_dir: &Path, name: &str) -> Result<Self, String> {
        let server = Self {
            name: name.to_string(),
            command,
            tokens: Self::tokens_file(soak_dir),
            log_dir: soak_dir.to_path_buf(),
            child: Mutex::new(None),
            listen: Mutex::new(SocketAddr::from(([127, 0, 0, 1], 0))),
            starts: AtomicU64::new(0),
            restarts: AtomicU64::new(0),
        };
        server.launch()?;
        Ok(server)
    }

    /// The server's token file in `soak_dir`: a worker token created in it
    /// before the start means the server prints no operator token of its
    /// own.
    pub fn tokens_file(soak_dir: &Path) -> PathBuf {
        soak_dir.join("tokens.json")
    }

    /// The address it listens on.
    pub fn address(&self) -> SocketAddr {
        *self.listen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.address())
    }

    /// Times the server was started again after a kill.
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    fn command(&self, listen: SocketAddr) -> Command {
        let c = &self.command;
        let mut cmd = Command::new(&c.exe);
        for (k, v) in &c.env {
            cmd.env(k, v);
        }
        for k in &c.env_remove {
            cmd.env_remove(k);
        }
        cmd.env_remove("RUNKEEP_TOKEN")
            .args(&c.args)
            .args(["--json", "serve", "--listen", &listen.to_string()])
            .arg("--tokens")
            .arg(&self.tokens)
            .args(["--shutdown-grace", "2s"]);
        cmd
    }

    /// Starts the server on the last address (port 0 the first time),
    /// waits for its `listening` line, and retries a bind that fails.
    fn launch(&self) -> Result<SocketAddr, String> {
        let listen = self.address();
        let mut last = String::new();
        for attempt in 0..BIND_ATTEMPTS {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(100 * u64::from(attempt.min(5))));
            }
            match self.launch_once(listen) {
                Ok(bound) => return Ok(bound),
                Err(e) => last = e,
            }
            if listen.port() == 0 {
                break;
            }
        }
        Err(last)
    }

    fn launch_once(&self, listen: SocketAddr) -> Result<SocketAddr, String> {
        let n = self.starts.fetch_add(1, Ordering::Relaxed);
        let name = &self.name;
        let stdout_log = self.log_dir.join(format!("{name}-{n}.stdout"));
        let stderr_log = std::fs::File::create(self.log_dir.join(format!("{name}-{n}.stderr")))
            .map_err(|e| format!("cannot create the server's log: {e}"))?;
        let mut child = self
            .command(listen)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr_log)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.command.exe.display()))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| "the server's stdout is not a pipe".to_string())?;
        let (tx, rx) = mpsc::channel::<SocketAddr>();
        // Reads the `listening` line, then copies the rest to the log until
        // the server exits (so it never blocks on a full pipe).
        std::thread::spawn(move || {
            let mut log = std::fs::File::create(stdout_log).ok();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(f) = log.as_mut() {
                    let _ = writeln!(f, "{line}");
                }
                let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
                if v["event"] == "listening" {
                    if let Some(a) = v["address"]
                        .as_str()
                        .and_then(|a| a.strip_prefix("http://"))
                        .and_then(|a| a.parse().ok())
                    {
                        let _ = tx.send(a);
                    }
                }
            }
        });
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match rx.recv_timeout(Duration::from_millis(20)) {
                Ok(bound) => {
                    *self.listen.lock().unwrap_or_else(|p| p.into_inner()) = bound;
                    *self.child.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);
                    return Ok(bound);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {}
            }
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "runkeep serve on {listen} exited ({status}) before listening; see {}",
                    self.log_dir.join(format!("{name}-{n}.stderr")).display()
                ));
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "runkeep serve on {listen} did not listen within {}s",
                    START_TIMEOUT.as_secs()
                ));
            }
        }
    }

    /// `kill -9` (nothing released, requests in flight cut), reaped.
    fn kill(&self) -> bool {
        let child = self.child.lock().unwrap_or_else(|p| p.into_inner()).take();
        match child {
            Some(mut c) => {
                let _ = c.kill();
                let _ = c.wait();
                true
            }
            None => false,
        }
    }

    /// Sends `sig` to the running server; false when there is none.
    fn signal(&self, sig: rustix::process::Signal) -> bool {
        let g = self.child.lock().unwrap_or_else(|p| p.into_inner());
        let Some(pid) = g
            .as_ref()
            .and_then(|c| rustix::process::Pid::from_raw(c.id() as i32))
        else {
            return false;
        };
        rustix::process::kill_process(pid, sig).is_ok()
    }

    fn is_running(&self) -> bool {
        let mut g = self.child.lock().unwrap_or_else(|p| p.into_inner());
        match g.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Stops the server (SIGTERM, then SIGKILL after a grace).
    pub fn stop(&self) {
        let child = self.child.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(mut c) = child {
            if let Some(pid) = rustix::process::Pid::from_raw(c.id() as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::Term);
            }
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if matches!(c.try_wait(), Ok(Some(_))) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The HTTP soak's chaos, paced on its own schedule
/// ([`BackendChaos::every`]), on one server at a time (several servers in
/// front of one store: each killed once per round of kills, in a random
/// order, a stall on one drawn at random, while the others go on serving): two strikes in three kill it and start it again; every third
/// stalls it (SIGSTOP for 1.3–2 × the lease
/// TTL, then SIGCONT): the server has not vanished, it just stops
/// answering, so the workers' requests hang until their request timeout,
/// and on SIGCONT it serves what queued up meanwhile (stale fences
/// included).
#[derive(Debug)]
pub struct ServerChaos {
    servers: Vec<Arc<Server>>,
    every: Duration,
    /// How long the server stays down: a random pause in this range.
    down: (Duration, Duration),
    /// The lease TTL (a stall lasts 1.3–2 × it).
    ttl: Duration,
    /// Strikes so far: every third one stalls, the others kill (counted,
    /// not drawn, so a short soak cannot draw stalls only).
    strikes: AtomicU64,
    /// The servers still to strike this round, by index.
    order: Mutex<Vec<usize>>,
}

impl ServerChaos {
    /// Strikes one of `servers` every `every` (jittered), down for `down`
    /// each restart.
    ///
    /// # Panics
    /// With no server.
    pub fn new(
        servers: Vec<Arc<Server>>,
        every: Duration,
        down: (Duration, Duration),
        ttl: Duration,
    ) -> Self {
        assert!(!servers.is_empty(), "ServerChaos needs a server");
        Self {
            servers,
            every,
            down,
            ttl,
            strikes: AtomicU64::new(0),
            order: Mutex::new(Vec::new()),
        }
    }

    /// The server the next kill strikes: each once per round of kills, in
    /// an order drawn at random each round (so every server is killed, none
    /// twice before the others).
    fn pick(&self) -> Arc<Server> {
        let mut order = self.order.lock().unwrap_or_else(|p| p.into_inner());
        if order.is_empty() {
            order.extend(0..self.servers.len());
            order.shuffle(&mut rand::thread_rng());
        }
        let i = order.pop().unwrap_or(0);
        self.servers[i].clone()
    }

    async fn stall(&self, server: &Server) -> Option<String> {
        let d = crate::stall_past_ttl(self.ttl);
        if !server.signal(rustix::process::Signal::Stop) {
            return None;
        }
        tokio::time::sleep(d).await;
        server.signal(rustix::process::Signal::Cont);
        Some(STALL_LABEL.to_string())
    }

    async fn restart(&self, server: Arc<Server>) -> Result<Option<String>, String> {
        let killed = server.kill();
        let (lo, hi) = self.down;
        let pause = if hi > lo {
            rand::thread_rng().gen_range(lo..hi)
        } else {
            lo
        };
        // Down: the workers' requests are refused (or were cut in flight).
        tokio::time::sleep(pause).await;
        let again = server.clone();
        tokio::task::spawn_blocking(move || again.launch())
            .await
            .map_err(|e| format!("the restart task failed: {e}"))?
            .map_err(|e| format!("runkeep serve could not be started again after a kill: {e}"))?;
        if killed {
            server.restarts.fetch_add(1, Ordering::Relaxed);
            Ok(Some(KILL_LABEL.to_string()))
        } else {
            // A server that had not come back from the last strike came
            // back now: nothing was killed this time.
            Ok(None)
        }
    }
}

impl BackendChaos for ServerChaos {
    fn strike(
        &self,
    ) -> Pin<Box<dyn std::future::Future<Output = Result<Option<String>, String>> + Send + '_>>
    {
        Box::pin(async move {
            if self.strikes.fetch_add(1, Ordering::Relaxed) % 3 == 2 {
                let i = rand::thread_rng().gen_range(0..self.servers.len());
                if let Some(label) = self.stall(&self.servers[i]).await {
                    return Ok(Some(label));
                }
            }
            self.restart(self.pick()).await
        })
    }

    fn heal(&self) -> Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            for server in &self.servers {
                server.signal(rustix::process::Signal::Cont);
                if !server.is_running() {
                    let server = server.clone();
                    let _ = tokio::task::spawn_blocking(move || server.launch()).await;
                }
            }
        })
    }

    fn every(&self) -> Option<Duration> {
        Some(self.every)
    }
}
