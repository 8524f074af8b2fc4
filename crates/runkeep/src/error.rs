//! The one public error type.
//!
//! Every backend maps its detailed failures into [`Error`]. Each variant has one
//! meaning, so a caller branches on the variant and never on message text. The
//! message names the run and the operation; the backend's own error, when there
//! is one, is kept as the `source` and not repeated in `Display`.

use crate::lease::Fence;

/// Boxed source error kept for context.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Result alias used across runkeep.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything a runkeep store can refuse or fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An addressed record does not exist (absence in a *read* is answered with
    /// `None` or an empty collection instead; this is for operations that need
    /// the record, such as resolving a park).
    #[error("not found: {what}")]
    NotFound {
        /// What was looked for, with its run.
        what: String,
    },

    /// The caller's input breaks a rule (bad id, TTL, holder, clock, cursor,
    /// limit, scope, payload). Nothing was changed.
    #[error("invalid input: {message}")]
    InvalidInput {
        /// What was wrong and what is accepted instead.
        message: String,
    },

    /// The write presented a fence that no longer holds the run: another
    /// holding was issued after it (or the holder released it). Stop working
    /// on the run; retrying cannot help.
    #[error(
        "fenced out: {operation} on run {run} presented fence {presented}, but the run is now at fence {current}; this worker no longer holds it"
    )]
    FencedOut {
        /// The run.
        run: String,
        /// The operation that was refused.
        operation: &'static str,
        /// The fence the caller presented.
        presented: Fence,
        /// The run's current (highest issued) fence.
        current: Fence,
    },

    /// The write was made for a principal ([`crate::acting`]) and the run's
    /// holding is not one it may write under: a fenced write at the top
    /// holding's fence claimed for another principal, or an unfenced write
    /// while a lease (live or expired) is on top. Nothing was changed.
    /// Act only on holdings you claimed, with their fence; claim the run
    /// first.
    #[error("{}", not_your_holding(run, operation, *.fence, *.fenced))]
    NotYourHolding {
        /// The run.
        run: String,
        /// The operation that was refused.
        operation: &'static str,
        /// The fence of the holding that is not the caller's.
        fence: Fence,
        /// The write presented a fence (`false`: an unfenced write).
        fenced: bool,
    },

    /// The run was cancelled by an operator ([`crate::failure`]): the
    /// holder's write (or renewal) is refused for that reason, not because
    /// another worker took over. Stop working on the run; it is handed out
    /// again only if an operator reopens it.
    #[error(
        "cancelled: {operation} on run {run} was refused because the run was cancelled{}; stop its step",
        cancel_reason(.reason.as_deref())
    )]
    Cancelled {
        /// The run.
        run: String,
        /// The operation that was refused.
        operation: &'static str,
        /// The operator's reason.
        reason: Option<String>,
    },

    /// A claim lost every attempt to other takers of the same run. Nobody is
    /// known to hold it live; retrying later may succeed.
    #[error(
        "contended: claim of run {run} lost {attempts} races in a row to other takers; retry later"
    )]
    Contended {
        /// The run.
        run: String,
        /// How many attempts were made.
        attempts: u32,
    },

    /// A compare-and-set found the record already changed by someone else,
    /// e.g. a park that was already answered. Nothing was changed.
    #[error("conflict: {message}")]
    Conflict {
        /// What was found instead.
        message: String,
    },

    /// The backend cannot honour a capability (for example a volume without
    /// hard links). It refuses rather than degrade; the message says what to do.
    #[error("unsupported: {message}")]
    Unsupported {
        /// What is missing and the ways out.
        message: String,
    },

    /// Stored data could not be understood (damaged file, unknown format
    /// version). Nothing was changed by the read.
    #[error("corrupted: {message}")]
    Corrupted {
        /// Where and what.
        message: String,
    },

    /// The backend is temporarily unreachable or overloaded; the same call may
    /// succeed later. When `outcome_unknown` is set
    /// ([`Error::is_outcome_unknown`]) the write may have been stored: its
    /// acknowledgement was lost, so read back before repeating it.
    #[error("unavailable: {}{message}", outcome_prefix(*.outcome_unknown))]
    Unavailable {
        /// What could not be reached.
        message: String,
        /// The underlying failure.
        #[source]
        source: Option<BoxError>,
        /// The call's write may have been stored (its acknowledgement was
        /// lost): distinct from a refusal and from a plain outage, where
        /// nothing was stored. Displayed as the prefix [`OUTCOME_UNKNOWN`].
        outcome_unknown: bool,
    },

    /// Any other backend failure (I/O error, full disk, permission denied).
    /// The message names the run, the operation and the path or statement.
    #[error("{message}")]
    Backend {
        /// Context: run, operation, path.
        message: String,
        /// The underlying failure.
        #[source]
        source: Option<BoxError>,
    },
}

/// How an [`Error::Unavailable`] whose write may or may not have been
/// stored (the acknowledgement of its commit was lost) begins when
/// displayed. The marker itself is the variant's `outcome_unknown` field:
/// build it with [`Error::outcome_unknown`], test it with
/// [`Error::is_outcome_unknown`]; the text is for people.
pub const OUTCOME_UNKNOWN: &str = "outcome unknown";

fn not_your_holding(run: &str, operation: &str, fence: Fence, fenced: bool) -> String {
    if fenced {
        format!(
            "not your holding: {operation} on run {run} presented fence {fence}, but that holding was claimed by another principal; act only on holdings you claimed yourself (claim the run first), or use an operator's override"
        )
    } else {
        format!(
            "not your holding: {operation} on run {run} without a fence, while the run is held at fence {fence}: an unfenced write would pass for that holding's work. Send the fence of your own holding (claim the run first), or use an operator's override"
        )
    }
}

fn cancel_reason(reason: Option<&str>) -> String {
    reason.map(|r| format!(" ({r})")).unwrap_or_default()
}

fn outcome_prefix(outcome_unknown: bool) -> &'static str {
    if outcome_unknown {
        "outcome unknown: "
    } else {
        ""
    }
}

impl Error {
    /// An [`Error::Unavailable`] whose write may have been stored
    /// (`outcome_unknown` set).
    pub fn outcome_unknown(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Error::Unavailable {
            message: message.into(),
            source: Some(source.into()),
            outcome_unknown: true,
        }
    }

    /// True when the call's write may or may not have been stored (its
    /// acknowledgement was lost). Still [`Error::is_retryable`], but a
    /// caller must read back before repeating a write that is not
    /// idempotent (an append): the worker runtime's `RunHandle` does.
    pub fn is_outcome_unknown(&self) -> bool {
        matches!(
            self,
            Error::Unavailable {
                outcome_unknown: true,
                ..
            }
        )
    }

    /// True when repeating the same call later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Contended { .. } | Error::Unavailable { .. })
    }

    /// True when the caller no longer holds the run: a fenced-out refusal,
    /// or a refusal because an operator cancelled the run. Either way, stop
    /// working on it.
    pub fn is_fenced_out(&self) -> bool {
        matches!(self, Error::FencedOut { .. } | Error::Cancelled { .. })
    }

    /// Shorthand for [`Error::InvalidInput`].
    pub fn invalid(message: impl Into<String>) -> Self {
        Error::InvalidInput {
            message: message.into(),
        }
    }

    /// Shorthand for [`Error::Corrupted`].
    pub fn corrupted(message: impl Into<String>) -> Self {
        Error::Corrupted {
            message: message.into(),
        }
    }

    /// Shorthand for [`Error::Backend`] with a source.
    pub fn backend(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Error::Backend {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// Shorthand for [`Error::Unavailable`] with a source.
    pub fn unavailable(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Error::Unavailable {
            message: message.into(),
            source: Some(source.into()),
            outcome_unknown: false,
        }
    }

    /// A short stable name of the variant, for logs and JSON output.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::NotFound { .. } => "not_found",
            Error::InvalidInput { .. } => "invalid_input",
            Error::FencedOut { .. } => "fenced_out",
            Error::NotYourHolding { .. } => "not_your_holding",
            Error::Cancelled { .. } => "cancelled",
            Error::Contended { .. } => "contended",
            Error::Conflict { .. } => "conflict",
            Error::Unsupported { .. } => "unsupported",
            Error::Corrupted { .. } => "corrupted",
            Error::Unavailable { .. } => "unavailable",
            Error::Backend { .. } => "backend",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_contended_and_unavailable_are_retryable() {
        let fenced = Error::FencedOut {
            run: "run_a".into(),
            operation: "write_checkpoint",
            presented: Fence::new(1).unwrap(),
            current: Fence::new(2).unwrap(),
        };
        assert!(!fenced.is_retryable());
        assert!(fenced.is_fenced_out());
        assert!(fenced.to_string().contains("presented fence 1"));
        assert!(fenced.to_string().contains("fence 2"));
        assert!(Error::Contended {
            run: "r".into(),
            attempts: 8
        }
        .is_retryable());
        assert!(Error::unavailable("db", std::io::Error::other("x")).is_retryable());
        assert!(!Error::unavailable("db", std::io::Error::other("x")).is_outcome_unknown());
        let unknown = Error::outcome_unknown("commit", std::io::Error::other("x"));
        assert!(unknown.is_outcome_unknown() && unknown.is_retryable());
        assert!(unknown
            .to_string()
            .starts_with("unavailable: outcome unknown: commit"));
        // The marker is the field, not the text: an outage whose message
        // happens to read "outcome unknown" is not one.
        assert!(
            !Error::unavailable("outcome unknown: maybe", std::io::Error::other("x"))
                .is_outcome_unknown()
        );
        assert!(!Error::backend("disk", std::io::Error::other("x")).is_retryable());
        assert!(!Error::invalid("x").is_retryable());
        assert!(!Error::corrupted("x").is_retryable());
    }
}
