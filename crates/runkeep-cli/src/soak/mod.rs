//! `runkeep soak`: proves runkeep's guarantees on this machine while worker
//! processes die. The engine (chaos, the correct worker, the effect sink,
//! the audit, the PostgreSQL and HTTP chaos) is the `runkeep-soak` crate;
//! this module reads the arguments, opens the store, says how to re-execute
//! this binary as the worker processes (`runkeep soak-worker`) and as the
//! server of `--over-http`, and prints the report.
//!
//! Any violation exits 1. A soak that merely runs out of time (`--timeout`)
//! with no violation exits 75: it proved nothing wrong, and it did not
//! finish proving anything either. Settings that cannot make progress are
//! refused up front (exit 64).
//!
//! On the memory store (one process), workers are threads with their own
//! runtime: a kill drops the runtime without releasing, a stall blocks the
//! thread at its next step.

use std::path::PathBuf;
use std::process::Command as Process;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use runkeep::Ttl;
use runkeep_server::auth::Role;
use runkeep_server::tokens::TokenFile;
use runkeep_soak::failover::{FailoverChaos, Pair};
use runkeep_soak::pg::{self, PgWorkers};
use runkeep_soak::server::{ServeCommand, Server, ServerChaos};
use runkeep_soak::worker::WorkerConfig;
use runkeep_soak::{Launcher, SoakOptions, Target, Verdict};

use crate::context::Ctx;
use crate::duration::{parse_duration, parse_ttl};
use crate::error::{CliError, CliResult, Exit};
use crate::output::{emit, emit_json};
use crate::store::{open_store_as, DurabilityArg, OpenMode, PoolDemand, StoreAddress};

/// `runkeep soak` options.
#[derive(Args, Debug, Clone)]
pub struct SoakArgs {
    /// Runs to enqueue.
    #[arg(long, default_value_t = 64)]
    pub runs: u64,
    /// Steps per run.
    #[arg(long, default_value_t = 40)]
    pub steps: u64,
    /// Worker processes.
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// Runs each worker steps at once.
    #[arg(long, default_value_t = 2)]
    pub concurrency: usize,
    /// Simulated work per step.
    #[arg(long, default_value = "80ms", value_parser = parse_duration)]
    pub step_time: Duration,
    /// Lease TTL of the workers.
    #[arg(long, default_value = "1500ms", value_parser = parse_ttl)]
    pub ttl: Ttl,
    /// Mean time between chaos actions (kill -9 or stall).
    #[arg(long, default_value = "800ms", value_parser = parse_duration)]
    pub chaos_every: Duration,
    /// No chaos at all (a baseline).
    #[arg(long)]
    pub no_chaos: bool,
    /// Give up (a timeout, exit 75) after this long.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Also enqueue N poison runs: their step crashes the worker every time;
    /// each must end dead-lettered after --max-attempts while every other
    /// run completes.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub poison: u64,
    /// Also enqueue N raising runs: their step returns an error every time;
    /// each must end dead-lettered after --max-attempts failed attempts,
    /// its errors kept, with no step committed.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub poison_raise: u64,
    /// The attempt limit the poison runs are enqueued with.
    #[arg(long, default_value_t = runkeep_soak::DEFAULT_POISON_MAX_ATTEMPTS)]
    pub max_attempts: u32,
    /// Where to create the fresh store and the soak's logs (default: a new
    /// temporary directory, removed afterwards unless --keep or a violation).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Keep the soak directory.
    #[arg(long)]
    pub keep: bool,
    /// Drive the workers through the HTTP API: the soak starts its own
    /// `runkeep serve` over --store (a fresh directory root by default, or
    /// a fresh schema of a postgres:// store), gives the workers
    /// --store http://127.0.0.1:PORT and a worker token, and kills the
    /// server (kill -9) and starts it again on the same port as part of the
    /// chaos. The audit reads the backing store directly.
    #[arg(long)]
    pub over_http: bool,
    /// With --over-http: mean time between server restarts (each a kill -9,
    /// a pause of a fifth to half the lease TTL, a start on the same port).
    #[arg(long, default_value = "3s", value_parser = parse_duration, requires = "over_http")]
    pub server_restart_every: Duration,
    /// With --over-http: how many `runkeep serve` processes in front of the one store (1 to 8); worker N starts on server N mod this and is given the others to fail over to (--store http://A,http://B,…); the chaos kills one server at a time (each once per round of kills, in a random order) and stalls one drawn at random, while the others go on serving.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=8), requires = "over_http")]
    pub servers: u16,
    /// With --servers N > 1: give each worker its own server only, not
    /// the others to fail over to (a worker whose server is down then
    /// waits for it; for comparing the lost leases with and without
    /// failover).
    #[arg(long, hide = true, requires = "over_http")]
    pub no_failover: bool,
    /// The backend's chaos besides the workers' kill -9 and stalls:
    /// `default` (on PostgreSQL: terminated connections and partitions) or
    /// `failover` (a PostgreSQL pair made by scripts/pg-pair.sh, named by
    /// --pair: its primary is killed with kill -9 mid-transaction and its
    /// standby promoted, once).
    #[arg(long, value_enum, default_value_t = ChaosKind::Default)]
    pub chaos: ChaosKind,
    /// With --chaos failover: the pair's directory, where
    /// `scripts/pg-pair.sh up DIR sync|async` wrote pair.env. --store
    /// defaults to the pair's multi-host URL.
    #[arg(long, value_name = "DIR")]
    pub pair: Option<PathBuf>,
    /// With --chaos failover: when the failover strikes (this, jittered by
    /// ×0.5–1.5, after the workers start).
    #[arg(long, default_value = "4s", value_parser = parse_duration)]
    pub failover_after: Duration,
    /// Chaos stalls workers only (no kills); for tests of the stall path.
    #[arg(long, hide = true)]
    pub stall_only: bool,
}

/// `--chaos`: the backend's chaos.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ChaosKind {
    /// The backend's usual chaos.
    Default,
    /// A PostgreSQL failover (needs --pair).
    Failover,
}

impl SoakArgs {
    fn options(&self) -> SoakOptions {
        SoakOptions {
            runs: self.runs,
            steps: self.steps,
            workers: self.workers,
            concurrency: self.concurrency,
            step_time: self.step_time,
            ttl: self.ttl,
            chaos_every: self.chaos_every,
            no_chaos: self.no_chaos,
            stall_only: self.stall_only,
            timeout: self.timeout,
            poison: self.poison,
            poison_raise: self.poison_raise,
            max_attempts: self.max_attempts,
        }
    }
}

/// `runkeep soak-worker` (internal): one worker process of a soak.
#[derive(Args, Debug, Clone)]
pub struct SoakWorkerArgs {
    /// The soak's directory.
    #[arg(long)]
    pub soak_dir: PathBuf,
    /// Steps per run.
    #[arg(long)]
    pub steps: u64,
    /// Lease TTL.
    #[arg(long, value_parser = parse_ttl)]
    pub ttl: Ttl,
    /// Work per step.
    #[arg(long, value_parser = parse_duration)]
    pub step_time: Duration,
    /// Runs stepped at once.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// Label.
    #[arg(long)]
    pub label: String,
    /// How long to keep trying to open the store while it does not answer
    /// (a server restarting; a standby being promoted, so that no server is
    /// writable yet) before giving up.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub open_wait: Duration,
}

fn store_given_explicitly() -> bool {
    std::env::var_os("RUNKEEP_STORE").is_some()
        || std::env::args().any(|a| a == "--store" || a.starts_with("--store="))
}

/// This binary, which the soak starts as its workers and its server.
fn this_binary() -> CliResult<PathBuf> {
    std::env::current_exe().map_err(|e| CliError::internal(format!("cannot find this binary: {e}")))
}

/// The global options a child process (a worker, the server) runs with:
/// the scope and durability of this soak.
fn scope_args(ctx: &Ctx) -> Vec<String> {
    let g = &ctx.global;
    vec![
        "--tenant".into(),
        g.tenant.clone(),
        "--project".into(),
        g.project.clone(),
        "--session".into(),
        g.session.clone(),
        "--durability".into(),
        match g.durability {
            DurabilityArg::ProcessCrash => "process-crash",
            DurabilityArg::PowerLoss => "power-loss",
        }
        .into(),
    ]
}

/// How the soak starts `runkeep serve` over `backing`: a PostgreSQL URL
/// (it may carry a password) in the environment, never on the command
/// line.
fn serve_command(ctx: &Ctx, backing: &StoreAddress) -> CliResult<ServeCommand> {
    let mut command = ServeCommand {
        exe: this_binary()?,
        args: Vec::new(),
        env: Vec::new(),
        env_remove: Vec::new(),
        shown: backing.to_string(),
    };
    match backing {
        StoreAddress::Postgres(pg) => {
            command
                .env
                .push(("RUNKEEP_STORE".into(), pg.original().to_string()));
            command.env_remove.push("RUNKEEP_PG_SCHEMA".into());
        }
        other => command.args.extend(["--store".into(), other.to_string()]),
    }
    // The server runs with the soak's scope; its durability is its own
    // default, as before.
    command.args.extend(scope_args(ctx).into_iter().take(6));
    Ok(command)
}

/// A worker token for `tenant` in the server's token file (created before
/// the server reads the file, so the server prints no operator token of
/// its own).
fn worker_token(soak_dir: &std::path::Path, tenant: &runkeep::TenantId) -> CliResult<String> {
    let created = TokenFile::new(Server::tokens_file(soak_dir))
        .create(tenant, Role::Worker, Some("soak workers"))
        .map_err(crate::commands::token::token_error)?;
    Ok(created.secret().to_string())
}

/// `http://ADDR` of the soak's server with `token`.
fn http_address(server: &Server, token: &str) -> CliResult<StoreAddress> {
    match server.url().parse::<StoreAddress>() {
        Ok(StoreAddress::Http(h)) => Ok(StoreAddress::Http(h.with_token(token))),
        Ok(_) | Err(_) => Err(CliError::internal(
            "the server's address is not an http:// store address",
        )),
    }
}

/// The command line of one worker process: this binary, the same store and
/// scope, `soak-worker`. A PostgreSQL URL goes in the worker's environment
/// (`RUNKEEP_STORE`), never on its command line (`ps` shows that to every
/// user; the URL may carry a password).
fn worker_command(
    ctx: &Ctx,
    addresses: &[StoreAddress],
    failover: bool,
    pg_workers: Option<Arc<PgWorkers>>,
) -> CliResult<Launcher> {
    let exe = this_binary()?;
    let scope = scope_args(ctx);
    let token = match addresses.first() {
        Some(StoreAddress::Http(h)) => h.token().map(str::to_string),
        _ => None,
    };
    let addresses: Vec<String> = addresses.iter().map(ToString::to_string).collect();
    if addresses.is_empty() {
        return Err(CliError::internal("a soak's workers need a store address"));
    }
    Ok(Launcher::Processes(Arc::new(move |cfg: &WorkerConfig| {
        // Worker N starts on address N mod their number (several servers:
        // the workers spread over them; the label is `wN`, and reading it
        // as a plain number once put every worker on the first server).
        // It is given the others after its own, and fails over to them
        // when its server does not answer, unless `failover` is off.
        let first = cfg.index().unwrap_or(0) % addresses.len();
        let address = if failover {
            (0..addresses.len())
                .map(|i| addresses[(first + i) % addresses.len()].as_str())
                .collect::<Vec<_>>()
                .join(",")
        } else {
            addresses[first].clone()
        };
        let mut cmd = Process::new(&exe);
        match &pg_workers {
            Some(w) => {
                let (url, refused) = w.worker_url();
                if let Some(e) = refused {
                    crate::output::warn(&format!(
                        "soak: cannot start a proxy for worker {} ({e}); it connects directly and cannot be partitioned",
                        cfg.label
                    ));
                }
                // The runtime's outcome-unknown resolutions are logged,
                // for the report's read-back tally.
                cmd.env("RUNKEEP_STORE", url)
                    .env_remove("RUNKEEP_PG_SCHEMA")
                    .env("RUNKEEP_LOG", "warn,runkeep_worker=info");
            }
            None => {
                cmd.arg("--store").arg(&address);
            }
        }
        // An http:// store's token: environment only (`ps` shows command
        // lines).
        match &token {
            // Over HTTP the runtime's outcome-unknown resolutions are
            // logged, for the report's read-back tally.
            Some(t) => cmd
                .env("RUNKEEP_TOKEN", t)
                .env("RUNKEEP_LOG", "warn,runkeep_worker=info"),
            None => cmd.env_remove("RUNKEEP_TOKEN"),
        };
        cmd.args(&scope).args(cfg.process_args());
        cmd
    })))
}

/// `runkeep soak`.
pub async fn run(ctx: &Ctx, args: SoakArgs) -> CliResult<Exit> {
    let options = args.options();
    runkeep_soak::check_progress(&options).map_err(|r| {
        let e = CliError::usage(r.message);
        match r.hint {
            Some(h) => e.hint(h),
            None => e,
        }
    })?;
    let (dir, tmp) = match &args.dir {
        Some(d) => {
            std::fs::create_dir_all(d)
                .map_err(|e| CliError::config(format!("cannot create {}: {e}", d.display())))?;
            (d.clone(), None)
        }
        None => {
            let t = tempfile::Builder::new()
                .prefix("runkeep-soak-")
                .tempdir()
                .map_err(|e| {
                    CliError::config(format!("cannot create a temporary directory: {e}"))
                })?;
            (t.path().to_path_buf(), Some(t))
        }
    };
    let pair = failover_pair(&args)?;
    let address = if store_given_explicitly() {
        ctx.global.store.clone()
    } else if let Some(pair) = &pair {
        pair.url.parse::<StoreAddress>().map_err(|e| {
            CliError::config(format!(
                "the pair's URL {} is not a store address: {e}",
                pair.url
            ))
        })?
    } else if args.over_http {
        // The server's natural backing: a root of tenants.
        StoreAddress::Root(dir.join("root"))
    } else {
        StoreAddress::Fs(dir.join("runs"))
    };
    match &address {
        StoreAddress::Http(h) => {
            return Err(CliError::usage(format!(
                "the soak does not run against a server it did not start ({}): it kills and restarts the server as part of the chaos, and audits the store behind it directly",
                h.url()
            ))
            .hint("use --over-http with --store naming the backing store (root:PATH, the default a fresh directory, or postgres://…); the soak starts runkeep serve over it"));
        }
        StoreAddress::Memory if args.over_http => {
            return Err(CliError::usage(
                "--over-http needs a store the server process and the soak can both open: memory: lives in one process",
            )
            .hint("leave --store out (a fresh directory root) or pass root:PATH or postgres://…"));
        }
        StoreAddress::Postgres(_) => {}
        other if pair.is_some() => {
            return Err(CliError::usage(format!(
                "--chaos failover fails a PostgreSQL pair over: --store {other} is not postgres://"
            ))
            .hint(
                "leave --store out (the pair's URL) or pass the pair's multi-host postgres:// URL",
            ));
        }
        _ => {}
    }
    // PostgreSQL: a fresh schema per soak (dropped afterwards unless --keep
    // or a violation), whatever schema the address names.
    let fresh_schema = match &address {
        StoreAddress::Postgres(_) => Some(pg::fresh_schema()),
        _ => None,
    };
    let address = match (&address, &fresh_schema) {
        (StoreAddress::Postgres(a), Some(schema)) => StoreAddress::Postgres(a.with_schema(schema)),
        _ => address,
    };
    let soak_dir = runkeep_soak::soak_dir(&dir);
    std::fs::create_dir_all(&soak_dir)
        .map_err(|e| CliError::config(format!("cannot create {}: {e}", soak_dir.display())))?;
    let opened = open_store_as(
        &address,
        &ctx.scope,
        &ctx.store_options(PoolDemand::Command),
        OpenMode::Create,
    )
    .await?;
    let pg_workers = match (&address, &fresh_schema) {
        // Over HTTP the workers reach PostgreSQL only through the server.
        _ if args.over_http => None,
        (StoreAddress::Postgres(a), Some(schema)) => {
            let app = pg::worker_application_name(schema);
            let url = a.with_application_name(&app).original().to_string();
            Some(Arc::new(PgWorkers::new(url, app)))
        }
        _ => None,
    };
    let failover = match (&pair, opened.postgres(), &pg_workers) {
        (Some(pair), Some((store, _)), Some(w)) => {
            if let Err(e) = check_served_by(store, pair).await {
                // Refused: the fresh schema made for this soak goes too.
                if let Some(schema) = &fresh_schema {
                    let _ = pg::drop_schema(store, schema).await;
                }
                return Err(e);
            }
            Some(Arc::new(FailoverChaos::new(
                pair.clone(),
                w.app().to_string(),
                args.failover_after,
            )))
        }
        // Refused above: a pair comes with a postgres:// store whose
        // workers connect directly.
        (Some(_), _, _) => {
            return Err(CliError::internal(
                "--chaos failover: no PostgreSQL store or workers to fail over",
            ))
        }
        _ => None,
    };
    let backend_chaos: Option<Arc<dyn runkeep_soak::BackendChaos>> =
        match (opened.postgres(), &pg_workers, &failover) {
            (_, _, Some(f)) => Some(f.clone() as Arc<dyn runkeep_soak::BackendChaos>),
            (Some((store, _)), Some(w), None) if !args.no_chaos => {
                Some(Arc::new(w.chaos(store.clone(), args.ttl.as_duration())))
            }
            _ => None,
        };
    // Over HTTP: the soak's own server, a worker token, the workers on
    // http://…, the server's restarts as the backend's chaos.
    // `--servers N`: N servers in front of the one backing store, all
    // reading one token file.
    let server = if args.over_http {
        let token = worker_token(&soak_dir, &ctx.scope.tenant)?;
        let mut servers = Vec::new();
        let mut addresses = Vec::new();
        for i in 0..args.servers {
            let name = if args.servers == 1 {
                "server".to_string()
            } else {
                format!("server{i}")
            };
            let server = Arc::new(
                Server::start_named(serve_command(ctx, &address)?, &soak_dir, &name).map_err(
                    |e| {
                        CliError::failed(format!(
                            "soak --over-http: cannot start runkeep serve: {e}"
                        ))
                    },
                )?,
            );
            addresses.push(http_address(&server, &token)?);
            servers.push(server);
        }
        Some((servers, addresses))
    } else {
        None
    };
    let backend_chaos = match &server {
        Some((servers, _)) if !args.no_chaos => {
            let ttl = args.ttl.as_duration();
            Some(Arc::new(ServerChaos::new(
                servers.clone(),
                args.server_restart_every,
                (ttl / 5, ttl / 2),
                ttl,
            )) as Arc<dyn runkeep_soak::BackendChaos>)
        }
        Some(_) => None,
        None => backend_chaos,
    };
    let target = Target {
        // The audit reads the backing store directly, never through the
        // server, so a server bug cannot hide a violation.
        store: opened.store.clone(),
        address: match &server {
            Some((_, http)) if http.len() == 1 => {
                format!("{} (runkeep serve over {address})", http[0])
            }
            Some((_, http)) => format!(
                "{} ({} runkeep serve processes over {address})",
                http.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
                http.len()
            ),
            None => address.to_string(),
        },
        session: ctx.scope.listing()?,
        soak_dir,
        backend_chaos,
    };
    let launcher = match &server {
        Some((_, http)) => worker_command(ctx, http, !args.no_failover, None)?,
        None if matches!(address, StoreAddress::Memory) => {
            Launcher::Threads(runkeep_soak::worker::correct())
        }
        None => worker_command(
            ctx,
            std::slice::from_ref(&address),
            false,
            pg_workers.clone(),
        )?,
    };
    let (runs, poison) = runkeep_soak::seed(target.store.as_ref(), &target.session, &options)
        .await
        .map_err(|e| {
            let unsupported = e.kind() == "unsupported";
            let err = CliError::from(e);
            if unsupported {
                err.hint("this store does not implement contract v2 (enqueue, finish, the atomic step) yet; the soak needs it")
            } else {
                err
            }
        })?;

    let bar = if ctx.json() || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        indicatif::ProgressBar::hidden()
    } else {
        let b = indicatif::ProgressBar::new(runs.len() as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} soak {bar:30} {pos}/{len} runs done  {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    };
    let progress = |done: u64, total: u64, msg: &str| {
        bar.set_length(total);
        bar.set_position(done);
        bar.set_message(msg.to_string());
    };
    let mut report = runkeep_soak::drive(&options, &target, &launcher, &runs, &poison, &progress)
        .await
        .map_err(CliError::internal)?;
    bar.finish_and_clear();
    if let Some((servers, _)) = &server {
        for server in servers {
            server.stop();
        }
        report.server_restarts = Some(servers.iter().map(|s| s.restarts()).sum());
        report.read_backs = Some(runkeep_soak::ReadBacks::from_worker_logs(&target.soak_dir));
    }
    if pg_workers.is_some() {
        report.read_backs = Some(runkeep_soak::ReadBacks::from_worker_logs(&target.soak_dir));
    }
    report.failover = failover.as_ref().and_then(|f| f.record());
    let keep = args.keep || report.verdict() != Verdict::Pass || args.dir.is_some();
    if keep {
        if let Some(t) = tmp {
            let path = t.keep();
            report.kept_dir = Some(path.display().to_string());
        } else {
            report.kept_dir = Some(dir.display().to_string());
        }
    }
    if let (Some((store, _)), Some(schema)) = (opened.postgres(), &fresh_schema) {
        if keep {
            crate::output::note(&format!(
                "kept PostgreSQL schema {schema} (drop it with: DROP SCHEMA {schema} CASCADE)"
            ));
        } else if let Err(e) = pg::drop_schema(store, schema).await {
            crate::output::warn(&format!("could not drop the soak's schema {schema}: {e}"));
        }
    }
    let exit = match report.verdict() {
        Verdict::Pass => Exit::Ok,
        Verdict::Fail => Exit::Failed,
        Verdict::Incomplete => Exit::Incomplete,
    };
    let printed = if ctx.json() {
        emit_json(&report)
    } else {
        // `println!` would panic on a closed stdout; everything goes through
        // one `emit`, which reports a closed pipe as such.
        emit(&report.render())
    };
    match printed {
        // A reader that went away does not change the verdict.
        Err(e) if e.is_closed_pipe() => {}
        Err(e) => return Err(e),
        Ok(()) => {}
    }
    if failover.is_some() && report.failover.is_none() {
        // Nothing was failed over: the soak proved nothing about failover.
        return Err(CliError::failed(format!(
            "--chaos failover: the primary was never failed over ({})",
            if report.backend_chaos_errors.is_empty() {
                "the drain finished first".to_string()
            } else {
                report.backend_chaos_errors.join("; ")
            }
        ))
        .hint("give it more --runs or --steps, or an earlier --failover-after; a pair is failed over once: make a fresh one with scripts/pg-pair.sh"));
    }
    Ok(exit)
}

/// The pair `--chaos failover` fails over, read from `--pair`; `None`
/// for the default chaos. Refuses what cannot fail over.
fn failover_pair(args: &SoakArgs) -> CliResult<Option<Pair>> {
    if args.chaos != ChaosKind::Failover {
        if args.pair.is_some() {
            return Err(CliError::usage("--pair is only read with --chaos failover"));
        }
        return Ok(None);
    }
    if args.no_chaos {
        return Err(CliError::usage(
            "--chaos failover and --no-chaos contradict each other",
        ));
    }
    if args.over_http {
        return Err(CliError::usage(
            "--chaos failover drives workers that reach PostgreSQL directly; --over-http puts a server between them",
        )
        .hint("leave out --over-http"));
    }
    let Some(dir) = &args.pair else {
        return Err(CliError::usage(
            "--chaos failover needs --pair DIR: the primary/standby pair to fail over",
        )
        .hint("make one with: scripts/pg-pair.sh up DIR sync (or async), then pass --pair DIR"));
    };
    Pair::read(dir)
        .map(Some)
        .map_err(|e| CliError::config(e.to_string()))
}

/// Refuses a store that the pair's primary does not serve: the failover
/// would kill a server the workers do not use.
async fn check_served_by(store: &runkeep_postgres::PgStore, pair: &Pair) -> CliResult<()> {
    let c = store.pool().get().await.map_err(|e| {
        CliError::new(
            Exit::Unavailable,
            format!("--chaos failover: no connection: {e}"),
        )
    })?;
    let port: Option<i32> = c
        .query_one("SELECT inet_server_port()", &[])
        .await
        .map_err(|e| CliError::failed(format!("--chaos failover: inet_server_port(): {e}")))?
        .get(0);
    if port != Some(i32::from(pair.primary_port)) {
        return Err(CliError::config(format!(
            "--chaos failover: the store is served from port {}, not by the pair's primary (127.0.0.1:{}) in {}",
            port.map_or_else(|| "none (a Unix socket)".to_string(), |p| p.to_string()),
            pair.primary_port,
            pair.dir.display()
        ))
        .hint("leave --store out (the pair's URL) or pass the pair's multi-host URL; a pair that failed over already is spent: make a fresh one with scripts/pg-pair.sh"));
    }
    Ok(())
}

/// `runkeep soak-worker`.
pub async fn run_worker(ctx: &Ctx, args: SoakWorkerArgs) -> CliResult<Exit> {
    let options = ctx
        .store_options(PoolDemand::SoakWorker {
            concurrency: args.concurrency,
        })
        .with_http_request_timeout(http_request_timeout(&ctx.global.store, args.ttl));
    // SIGTERM / SIGINT stop the worker gracefully from the start, also
    // while it still waits for a writable server.
    let shutdown = tokio_util::sync::CancellationToken::new();
    runkeep_worker::cancel_on_signal(shutdown.clone());
    let opened = tokio::select! {
        opened = open_waiting(ctx, &options, args.open_wait) => opened?,
        () = shutdown.cancelled() => {
            crate::output::note("stopped before the store answered");
            return Ok(Exit::Ok);
        }
    };
    let listing = ctx.scope.listing()?;
    // Which server it works through, first (the soak's test checks the
    // workers were spread over every server): the URL, never the token.
    if let StoreAddress::Http(h) = &ctx.global.store {
        crate::output::note(&format!(
            "soak worker {}: through {} first",
            args.label,
            h.urls().first().map_or("", String::as_str)
        ));
    }
    let cfg = WorkerConfig::process(
        args.soak_dir,
        args.steps,
        args.ttl,
        args.step_time,
        args.concurrency,
        args.label,
    );
    let report = runkeep_soak::worker::work(opened.store, listing, cfg, shutdown)
        .await
        .map_err(CliError::failed)?;
    crate::output::note(&format!("{report:?}"));
    Ok(Exit::Ok)
}

/// The request timeout of a soak worker over HTTP. One server: the lease
/// TTL (at least 1 s), so a server that vanished is an error within it,
/// never a hang (the lease keeper gives the run up at the TTL anyway).
/// Several servers: a quarter of the TTL, so a renewal sent to a server
/// that stopped answering (SIGSTOP: connected, nothing answered) times out
/// and is sent again to the next server within the renewal's window (sent
/// at a third of the TTL, given up a tenth before its end); with the TTL
/// as the timeout, every lease held through a stalled server was lost.
fn http_request_timeout(store: &StoreAddress, ttl: Ttl) -> Duration {
    let ttl = ttl.as_duration();
    match store {
        StoreAddress::Http(h) if h.urls().len() > 1 => (ttl / 4).max(Duration::from_millis(100)),
        _ => ttl.max(Duration::from_secs(1)),
    }
}

/// Opens a worker's store, trying again while it does not answer (exit
/// 69: a server restarting; during a failover, no server writable yet,
/// "database does not allow writes") for up to `wait`, then gives up
/// saying so.
async fn open_waiting(
    ctx: &Ctx,
    options: &crate::store::StoreOptions,
    wait: Duration,
) -> CliResult<crate::store::OpenedStore> {
    let started = std::time::Instant::now();
    let mut pause = Duration::from_millis(50);
    let mut tries = 0u32;
    loop {
        tries += 1;
        match ctx.open(OpenMode::Existing, options).await {
            Err(e) if e.exit == Exit::Unavailable && started.elapsed() < wait => {
                if tries == 1 {
                    crate::output::note(&format!(
                        "the store does not answer yet; trying again for up to {}: {}",
                        runkeep_soak::human_duration(wait),
                        e.message
                    ));
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            Err(e) if e.exit == Exit::Unavailable => {
                return Err(e
                    .context(format!(
                        "gave up after {tries} tries over {}",
                        runkeep_soak::human_duration(wait)
                    ))
                    .hint("no server of the store's URL accepted writes in time: check that a primary runs (after a failover, that the standby was promoted), or give the worker a longer --open-wait"));
            }
            r => return r,
        }
    }
}
