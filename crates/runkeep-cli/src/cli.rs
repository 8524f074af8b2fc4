//! The command line: global options, the subcommands, shared arguments.
//!
//! Adding a subcommand is one variant in [`Command`] and one arm in
//! `main::dispatch` (plus its `mod` line).

use std::str::FromStr;

use clap::{Args, Parser, Subcommand};
use runkeep::RunId;

use crate::commands;
use crate::doctor;
use crate::store::{DurabilityArg, StoreAddress};

const AFTER_HELP: &str = "\
Exit codes:
  0   done (doctor: healthy; warn and skipped allowed)
  1   the operation was refused or failed (unknown run, held, conflict, fenced out,
      damaged data, I/O error); doctor: a check failed
  2   doctor: no check ran
  64  bad command line (unknown flag, bad id, bad duration, bad scope)
  69  the store or a doctor check did not answer (doctor: a check is inconclusive)
  70  internal error (a bug in runkeep)
  78  the store cannot be opened as configured (missing directory, not a
      directory, permission denied; a PostgreSQL schema never migrated, older
      or newer than this binary: run `runkeep migrate`)";

/// `runkeep`: see and steer durable agent runs.
#[derive(Parser, Debug)]
#[command(
    name = "runkeep",
    version,
    about = "See and steer durable agent runs: listing, parks, leases, transcripts, health.",
    after_help = AFTER_HELP,
    propagate_version = true
)]
pub struct Cli {
    /// Options every command takes.
    #[command(flatten)]
    pub global: GlobalArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Options every command takes.
#[derive(Args, Debug, Clone)]
pub struct GlobalArgs {
    /// Where the runs live: root:PATH (a directory of many tenants:
    /// `PATH/<tenant>/<project>/<session>/runs`), fs:PATH (one session's runs/
    /// directory, the reference's layout), memory: (empty, in-process) or
    /// postgres://USER:PASSWORD@HOST:PORT/DATABASE?schema=NAME (password and schema optional;
    /// postgresql:// too; the password is never printed), or http://HOST:PORT
    /// (a `runkeep serve` API; its token from --token / RUNKEEP_TOKEN;
    /// http://A,http://B for several servers in front of one store: a
    /// request that could not be sent, or a read whose answer was lost,
    /// goes to the next one).
    #[arg(
        long,
        env = "RUNKEEP_STORE",
        // `--help` would print the variable's value: it may hold a password.
        hide_env_values = true,
        default_value = "root:./runkeep-data",
        value_parser = StoreAddress::from_str,
        global = true
    )]
    pub store: StoreAddress,

    /// PostgreSQL schema of a postgres:// store (default `runkeep`); the same as ?schema=NAME in the URL.
    #[arg(long, env = "RUNKEEP_PG_SCHEMA", global = true, value_name = "SCHEMA")]
    pub pg_schema: Option<String>,

    /// Most pooled connections of a postgres:// store (the LISTEN connection is one more); at least 1. Default: 2; `doctor`: 4; `serve`: its --max-concurrent, up to 16; `soak-worker`: its --concurrency + 1.
    #[arg(
        long,
        env = "RUNKEEP_PG_POOL_SIZE",
        global = true,
        value_name = "N",
        value_parser = crate::store::parse_pg_pool_size
    )]
    pub pg_pool_size: Option<usize>,

    /// A URL straight to PostgreSQL, for when --store names a connection pooler in transaction mode (pgbouncer): pooled connections then keep no session state, and LISTEN and migrations connect here. The pooled role needs runkeep's settings as its defaults; runkeep refuses to start and prints the ALTER ROLE statements when it lacks them.
    #[arg(
        long,
        env = "RUNKEEP_PG_DIRECT_URL",
        hide_env_values = true,
        global = true,
        value_name = "URL",
        value_parser = crate::store::parse_pg_direct_url
    )]
    pub pg_direct_url: Option<String>,

    /// Bearer token of an http:// store (a `runkeep serve` API); never printed. Prefer the environment variable: `ps` shows command lines.
    #[arg(
        long,
        env = "RUNKEEP_TOKEN",
        hide_env_values = true,
        global = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,

    /// Tenant id.
    #[arg(long, env = "RUNKEEP_TENANT", default_value = "default", global = true)]
    pub tenant: String,

    /// Project id; '' clears it (a listing then covers the whole tenant).
    #[arg(
        long,
        env = "RUNKEEP_PROJECT",
        default_value = "default",
        global = true
    )]
    pub project: String,

    /// Session id; '' clears it (a listing then covers the whole project).
    #[arg(
        long,
        env = "RUNKEEP_SESSION",
        default_value = "default",
        global = true
    )]
    pub session: String,

    /// How much a write survives (fs store).
    #[arg(
        long,
        env = "RUNKEEP_DURABILITY",
        value_enum,
        default_value_t = DurabilityArg::ProcessCrash,
        global = true
    )]
    pub durability: DurabilityArg,

    /// Machine-readable output on stdout (JSON document or JSON lines, per command).
    #[arg(long, global = true)]
    pub json: bool,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// List runs with durable state (the work queue).
    Runs(commands::runs::RunsArgs),
    /// One run: scope, latest checkpoint, park, lease, counts.
    Show(commands::show::ShowArgs),
    /// A run's checkpoints, oldest first (total order: fence, time, id).
    Checkpoints(commands::checkpoints::CheckpointsArgs),
    /// A run's event transcript; --follow tails it until Ctrl-C.
    Events(commands::events::EventsArgs),
    /// Claim (or renew) a run's lease.
    Claim(commands::lease::ClaimArgs),
    /// Release a run's lease held at a fence.
    Release(commands::lease::ReleaseArgs),
    /// Create a runnable run (first checkpoint holds the input; optional not-before time and attempt limit).
    Enqueue(commands::lifecycle::EnqueueArgs),
    /// Finish the run held at a fence: completed, failed or cancelled.
    Finish(commands::lifecycle::FinishArgs),
    /// Cancel a run, claimed or not: finished as cancelled; its worker is refused and stops the step.
    Cancel(commands::lifecycle::CancelArgs),
    /// Make a finished run active and claimable again.
    Reopen(commands::lifecycle::ReopenArgs),
    /// Set an active run's priority: workers take the highest first.
    Priority(commands::lifecycle::PriorityArgs),
    /// Delete all but the newest checkpoints (never an unanswered park).
    Prune(commands::prune::PruneArgs),
    /// Parks: runs waiting on a human decision.
    #[command(subcommand)]
    Park(commands::park::ParkCommand),
    /// Write a few demo runs (parked, expired, claimed, …) into an empty session.
    #[command(alias = "demo")]
    Seed(commands::seed::SeedArgs),
    /// Create or upgrade a PostgreSQL store's tables (idempotent); prints the schema version.
    Migrate(crate::commands::migrate::MigrateArgs),
    /// Check the store's health.
    Doctor(doctor::DoctorArgs),
    /// Prove the guarantees under crashes: worker processes killed and stalled at random, then an audit.
    Soak(crate::soak::SoakArgs),
    /// Serve the store over HTTP: the JSON API under /v1, /healthz, /readyz, /metrics, /openapi.json.
    Serve(commands::serve::ServeArgs),
    /// Bearer tokens of `runkeep serve`: create (the secret is shown once), list, revoke.
    #[command(subcommand)]
    Token(commands::token::TokenCommand),
    /// Recurring schedules: a cron that enqueues one run per tick; `schedule run` is the scheduler.
    #[command(subcommand)]
    Schedule(commands::schedule::ScheduleCommand),
    /// One worker process of a soak (internal).
    #[command(hide = true)]
    SoakWorker(crate::soak::SoakWorkerArgs),
}

/// The run a per-run command addresses.
#[derive(Args, Debug, Clone)]
pub struct RunArg {
    /// The run id.
    #[arg(value_name = "RUN", value_parser = parse_id::<RunId>)]
    pub run: RunId,
    /// The parent run, when RUN is a sub-run.
    #[arg(long, value_name = "PARENT_RUN", value_parser = parse_id::<RunId>)]
    pub parent: Option<RunId>,
}

/// Parses any core value with a validating `FromStr` (ids, fences, park
/// states, orders), keeping the core's message.
pub fn parse_id<T: FromStr<Err = runkeep::Error>>(s: &str) -> Result<T, String> {
    s.parse().map_err(|e: runkeep::Error| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }
}
