//! What the bench prints and how it fails: colour (only on a TTY, never
//! with `NO_COLOR`), aligned tables, notes and warnings on stderr, and one
//! error type with the exit codes of the `runkeep` command it came from
//! (1 failed, 64 usage, 70 internal, 78 configuration).

use std::io::Write;

use runkeep::Timestamp;
use serde::Serialize;

pub use runkeep_term::{Cell, Color, Style, Table};

/// Writes text to stdout. A closed pipe (`EPIPE`) is a silent exit 0.
pub fn emit(text: &str) -> BenchResult<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// Writes one pretty JSON document to stdout.
pub fn emit_json<T: Serialize + ?Sized>(value: &T) -> BenchResult<()> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| BenchError::internal(format!("encoding JSON output: {e}")))?;
    emit(&format!("{text}\n"))
}

/// One line on stderr; a stderr that cannot be written loses the line and
/// nothing else (never panics).
fn stderr_line(line: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{line}");
}

/// A warning on stderr.
pub fn warn(message: &str) {
    let style = Style::stderr();
    stderr_line(&format!(
        "{} {message}",
        style.paint("warning:", Color::Yellow)
    ));
}

/// An informational note on stderr (kept off stdout so scripts can parse it).
pub fn note(message: &str) {
    let style = Style::stderr();
    stderr_line(&style.paint(message, Color::Dim));
}

/// `2025-06-01T12:04:05Z` (UTC, seconds).
pub fn iso(ts: Timestamp) -> String {
    let at =
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(ts.as_millis().unsigned_abs());
    humantime::format_rfc3339_seconds(at).to_string()
}

/// Shortens `text` to `max` characters with an ellipsis.
pub fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut s: String = text.chars().take(max.saturating_sub(1)).collect();
    s.push('…');
    s
}

/// The password of a `postgres://user:password@host/…` URL in `text`
/// replaced by `…` (the command line goes into the JSON report).
pub fn redact(text: &str) -> String {
    let Some((scheme, rest)) = text.split_once("://") else {
        return text.to_string();
    };
    let Some(at) = rest.rfind('@') else {
        return text.to_string();
    };
    let (userinfo, host) = rest.split_at(at);
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:…{host}"),
        None => text.to_string(),
    }
}

/// How the process exits.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Exit {
    /// 0.
    Ok,
    /// 1: a case failed, or an output could not be written.
    Failed,
    /// 64: bad command line.
    Usage,
    /// 70: a bug.
    Internal,
    /// 78: a store could not be set up (`--dir`).
    Config,
}

impl Exit {
    /// The numeric code.
    pub fn code(self) -> u8 {
        match self {
            Exit::Ok => 0,
            Exit::Failed => 1,
            Exit::Usage => 64,
            Exit::Internal => 70,
            Exit::Config => 78,
        }
    }
}

/// A failure of the bench: exit code, one-line cause, optional hint.
#[derive(Clone, Debug)]
pub struct BenchError {
    /// How the process exits.
    pub exit: Exit,
    /// One line; empty for a silent exit (a closed stdout pipe).
    pub message: String,
    /// What to try next.
    pub hint: Option<String>,
}

/// Result alias of the bench.
pub type BenchResult<T> = Result<T, BenchError>;

fn one_line(s: &str) -> String {
    redact(s)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

impl BenchError {
    fn new(exit: Exit, message: impl Into<String>) -> Self {
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

    /// A store cannot be set up (78).
    pub fn config(message: impl Into<String>) -> Self {
        Self::new(Exit::Config, message)
    }

    /// Something failed (1).
    pub fn failed(message: impl Into<String>) -> Self {
        Self::new(Exit::Failed, message)
    }

    /// A bug (70).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Exit::Internal, message)
    }

    /// Adds (or replaces) the hint.
    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(one_line(&hint.into()));
        self
    }

    /// Prints `error: …` / `hint: …` on stderr (nothing for a silent exit).
    pub fn report(&self) {
        if self.message.is_empty() {
            return;
        }
        let style = Style::stderr();
        stderr_line(&format!(
            "{} {}",
            style.paint("error:", Color::Red),
            self.message
        ));
        if let Some(hint) = &self.hint {
            stderr_line(&format!("{} {hint}", style.paint("hint:", Color::Yellow)));
        }
    }
}

impl From<std::io::Error> for BenchError {
    fn from(err: std::io::Error) -> Self {
        if err.kind() == std::io::ErrorKind::BrokenPipe {
            // The reader went away (`runkeep-bench --list | head`).
            return Self {
                exit: Exit::Ok,
                message: String::new(),
                hint: None,
            };
        }
        BenchError::failed(format!("writing output: {err}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_format_as_utc_iso() {
        let at = |ms| Timestamp::from_millis(ms).unwrap();
        assert_eq!(iso(at(0)), "1970-01-01T00:00:00Z");
        assert_eq!(iso(at(951_782_400_000)), "2000-02-29T00:00:00Z");
        assert_eq!(iso(at(1_717_243_445_123)), "2024-06-01T12:04:05Z");
    }

    #[test]
    fn passwords_do_not_reach_the_report() {
        assert_eq!(
            redact("postgres://u:secret@db:5432/x"),
            "postgres://u:…@db:5432/x"
        );
        assert_eq!(redact("postgres://u@db/x"), "postgres://u@db/x");
        assert_eq!(redact("--quick"), "--quick");
    }
}
