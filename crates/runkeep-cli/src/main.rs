//! `runkeep`: the operator command for runkeep stores.
//!
//! Operators see and steer the work queue without writing code: which runs
//! are parked, who holds what, what a run did, and whether the store is
//! healthy (`runkeep doctor`). See the crate README for the command
//! reference, a session transcript and the exit codes.
//!
//! Every failure is one `error: …` line (and usually a `hint: …`) on stderr
//! and a documented exit code ([`error::Exit`]); bad input never panics, and
//! a panic (a bug) exits 70 without a backtrace.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

mod cli;
mod commands;
mod context;
mod doctor;
mod duration;
mod error;
mod output;
mod scope;
mod soak;
mod store;

use cli::{Cli, Command};
use context::Ctx;
use error::{CliError, CliResult, Exit};
use output::{Color, Style};

/// Test-only (the `testing` feature): makes every command panic, to prove
/// a bug exits 70 with one line and no backtrace.
#[cfg(feature = "testing")]
const TEST_PANIC_ENV: &str = "RUNKEEP_TEST_PANIC";

/// Runs the chosen subcommand. Adding one: a variant in [`Command`] and an
/// arm here.
async fn dispatch(cli: Cli) -> CliResult<Exit> {
    #[cfg(feature = "testing")]
    if std::env::var_os(TEST_PANIC_ENV).is_some() {
        panic!("deliberate panic ({TEST_PANIC_ENV} is set)");
    }
    let ctx = Ctx::new(cli.global)?;
    match cli.command {
        Command::Runs(args) => commands::runs::run(&ctx, args).await,
        Command::Show(args) => commands::show::run(&ctx, args).await,
        Command::Checkpoints(args) => commands::checkpoints::run(&ctx, args).await,
        Command::Events(args) => commands::events::run(&ctx, args).await,
        Command::Claim(args) => commands::lease::claim(&ctx, args).await,
        Command::Release(args) => commands::lease::release(&ctx, args).await,
        Command::Enqueue(args) => commands::lifecycle::enqueue(&ctx, args).await,
        Command::Finish(args) => commands::lifecycle::finish(&ctx, args).await,
        Command::Cancel(args) => commands::lifecycle::cancel(&ctx, args).await,
        Command::Reopen(args) => commands::lifecycle::reopen(&ctx, args).await,
        Command::Priority(args) => commands::lifecycle::set_priority(&ctx, args).await,
        Command::Prune(args) => commands::prune::run(&ctx, args).await,
        Command::Park(command) => commands::park::run(&ctx, command).await,
        Command::Seed(args) => commands::seed::run(&ctx, args).await,
        Command::Migrate(args) => commands::migrate::run(&ctx, args).await,
        Command::Doctor(args) => doctor::run(&ctx, args).await,
        Command::Soak(args) => soak::run(&ctx, args).await,
        Command::SoakWorker(args) => soak::run_worker(&ctx, args).await,
        Command::Serve(args) => commands::serve::run(&ctx, args).await,
        Command::Token(command) => commands::token::run(&ctx, command).await,
        Command::Schedule(command) => commands::schedule::run(&ctx, command).await,
    }
}

fn report(err: &CliError) {
    if err.message.is_empty() {
        return;
    }
    let style = Style::stderr();
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(
        stderr,
        "{} {}",
        style.paint("error:", Color::Red),
        err.message
    );
    if let Some(hint) = &err.hint {
        let _ = writeln!(stderr, "{} {hint}", style.paint("hint:", Color::Yellow));
    }
}

/// clap's usage error in runkeep's shape: `error: <one line>` and a hint
/// (clap's own tip, or the usage line).
fn usage_error(rendered: &str) -> CliError {
    let mut lines = rendered.lines();
    let mut cause = lines
        .next()
        .unwrap_or("")
        .trim_start_matches("error:")
        .trim()
        .to_string();
    let mut hint = None;
    let mut in_cause = true;
    for line in lines {
        let text = line.trim();
        if text.is_empty() {
            in_cause = false;
        } else if let Some(tip) = text.strip_prefix("tip:") {
            hint.get_or_insert_with(|| tip.trim().to_string());
        } else if let Some(usage) = text.strip_prefix("Usage:") {
            hint.get_or_insert_with(|| format!("usage: {}; see --help", usage.trim()));
        } else if in_cause {
            cause.push(' ');
            cause.push_str(text);
        }
    }
    CliError::usage(cause)
        .hint(hint.unwrap_or_else(|| "run the command with --help to see what it accepts".into()))
}

/// Panics are bugs: one line on stderr, no backtrace, exit 70. Doctor check
/// threads are exempt: the doctor records their panic as the check's result.
fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        if std::thread::current()
            .name()
            .is_some_and(|n| n.starts_with(doctor::CHECK_THREAD_PREFIX))
        {
            return;
        }
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic".to_string());
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        report(
            &CliError::internal(format!("internal error: {what}{at}"))
                .hint("this is a bug in runkeep; please report it with the command you ran"),
        );
    }));
}

fn init_logging() {
    // Off unless asked for: RUNKEEP_LOG=debug (tracing-subscriber env filter syntax).
    let filter = tracing_subscriber::EnvFilter::try_from_env("RUNKEEP_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn main() -> ExitCode {
    install_panic_hook();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // clap exits 2 on a usage error; runkeep's usage code is 64
            // (2 means "doctor checked nothing").
            if !e.use_stderr() {
                let _ = e.print(); // --help, --version
                return ExitCode::SUCCESS;
            }
            if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                let _ = e.print(); // `runkeep` alone: the help, as a usage error
                return ExitCode::from(Exit::Usage.code());
            }
            report(&usage_error(&e.render().to_string()));
            return ExitCode::from(Exit::Usage.code());
        }
    };
    init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            report(&CliError::internal(format!(
                "cannot start the async runtime: {e}"
            )));
            return ExitCode::from(Exit::Internal.code());
        }
    };
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        runtime.block_on(dispatch(cli))
    }));
    // Do not wait for work nobody awaits any more (a doctor check that timed out).
    runtime.shutdown_background();
    let exit = match outcome {
        Ok(Ok(exit)) => exit,
        Ok(Err(err)) => {
            report(&err);
            err.exit
        }
        Err(_) => Exit::Internal,
    };
    ExitCode::from(exit.code())
}
