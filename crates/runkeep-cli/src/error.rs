//! Exit codes and the one error type of the command.
//!
//! Every failure reaches `main` as a [`CliError`]: an [`Exit`] code, a one-line
//! cause and an optional hint, printed on stderr as `error: …` / `hint: …`.

use std::fmt;

/// The process exit codes (documented in the README).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Exit {
    /// 0: done; doctor: healthy (warn and skipped allowed).
    Ok,
    /// 1: the operation was refused or failed (unknown run, held, conflict,
    /// fenced out, damaged data, I/O error); doctor: a check failed.
    Failed,
    /// 2: doctor only: no check ran (none registered or none matched `--category`).
    NothingChecked,
    /// 64: bad command line: unknown flag, bad id, bad duration, bad scope.
    Usage,
    /// 69: the store (or a doctor check) did not answer; retrying may help.
    Unavailable,
    /// 70: internal error (a bug in runkeep).
    Internal,
    /// 75: soak only: it ran out of time (`--timeout`) before every run
    /// finished, and no guarantee was violated in what ran. Retry with more
    /// time (sysexits' EX_TEMPFAIL).
    Incomplete,
    /// 78: the store cannot be opened as configured (missing directory, not a
    /// directory, permission denied, a backend refusing the address).
    Config,
}

impl Exit {
    /// The numeric code.
    pub fn code(self) -> u8 {
        match self {
            Exit::Ok => 0,
            Exit::Failed => 1,
            Exit::NothingChecked => 2,
            Exit::Usage => 64,
            Exit::Unavailable => 69,
            Exit::Internal => 70,
            Exit::Incomplete => 75,
            Exit::Config => 78,
        }
    }
}

/// A failure of the command: exit code, one-line cause, optional hint.
#[derive(Clone, Debug)]
pub struct CliError {
    /// How the process exits.
    pub exit: Exit,
    /// One line; empty for a silent exit (e.g. a closed stdout pipe).
    pub message: String,
    /// What to try next.
    pub hint: Option<String>,
}

/// Result alias of the command.
pub type CliResult<T> = Result<T, CliError>;

impl CliError {
    /// A failure with `exit` and `message`.
    pub fn new(exit: Exit, message: impl Into<String>) -> Self {
        Self {
            exit,
            message: one_line(&message.into()),
            hint: None,
        }
    }

    /// Bad command line (64).
    pub fn usage(message: impl Into<String>) -> Self {
        Self::new(Exit::Usage, message)
    }

    /// The store cannot be opened (78).
    pub fn config(message: impl Into<String>) -> Self {
        Self::new(Exit::Config, message)
    }

    /// The operation was refused or failed (1).
    pub fn failed(message: impl Into<String>) -> Self {
        Self::new(Exit::Failed, message)
    }

    /// A bug (70).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Exit::Internal, message)
    }

    /// Exit quietly with `exit` (nothing printed).
    pub fn silent(exit: Exit) -> Self {
        Self {
            exit,
            message: String::new(),
            hint: None,
        }
    }

    /// The reader of stdout went away (`EPIPE`): exit 0, print nothing.
    pub fn closed_pipe() -> Self {
        Self::silent(Exit::Ok)
    }

    /// True for [`CliError::closed_pipe`].
    pub fn is_closed_pipe(&self) -> bool {
        self.exit == Exit::Ok && self.message.is_empty()
    }

    /// Adds (or replaces) the hint.
    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(one_line(&hint.into()));
        self
    }

    /// Prefixes the cause with context ("claim run_x: …").
    pub fn context(mut self, context: impl fmt::Display) -> Self {
        if !self.message.is_empty() {
            self.message = format!("{context}: {}", self.message);
        }
        self
    }
}

/// Collapses a message to one line (newlines become "; ").
/// Store passwords are redacted here, so no error or hint can print one.
fn one_line(s: &str) -> String {
    crate::store::redact(s)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// The error and its source chain on one line (the core's `Display` does not
/// repeat the source, which is where the OS error lives).
fn with_sources(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

impl From<runkeep::Error> for CliError {
    fn from(err: runkeep::Error) -> Self {
        use runkeep::Error as E;
        let message = with_sources(&err);
        let (exit, hint) = match &err {
            E::InvalidInput { .. } => (Exit::Usage, Some("see `runkeep help <command>` for accepted values")),
            E::NotFound { .. } => (Exit::Failed, Some("list the runs in this scope with `runkeep runs`; check --tenant/--project/--session")),
            E::FencedOut { .. } => (Exit::Failed, Some("the run was taken over; claim it again to get a current fence")),
            E::Contended { .. } => (Exit::Failed, Some("other workers are claiming the same run; retry in a moment")),
            E::Conflict { .. } => (Exit::Failed, None),
            E::Unsupported { .. } => (Exit::Failed, None),
            E::Corrupted { .. } => (Exit::Failed, Some("run `runkeep doctor` to see what is damaged")),
            E::Unavailable { .. } => (Exit::Unavailable, Some("the store did not answer; retry later")),
            _ => (Exit::Failed, None),
        };
        let e = CliError::new(exit, message);
        match hint {
            Some(h) => e.hint(h),
            None => e,
        }
    }
}

impl From<std::io::Error> for CliError {
    fn from(err: std::io::Error) -> Self {
        if err.kind() == std::io::ErrorKind::BrokenPipe {
            // The reader went away (`runkeep events | head`): not an error.
            return CliError::closed_pipe();
        }
        CliError::failed(format!("writing output: {err}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_errors_map_to_documented_codes() {
        let invalid: CliError = runkeep::Error::invalid("bad\nthing").into();
        assert_eq!(invalid.exit, Exit::Usage);
        assert_eq!(invalid.message, "invalid input: bad; thing");
        let gone: CliError =
            runkeep::Error::unavailable("db", std::io::Error::other("refused")).into();
        assert_eq!(gone.exit, Exit::Unavailable);
        assert!(gone.message.ends_with(": refused"), "{}", gone.message);
        let conflict: CliError = runkeep::Error::Conflict {
            message: "x".into(),
        }
        .into();
        assert_eq!(conflict.exit.code(), 1);
    }
}
