//! Driver errors mapped into the contract's one error enum.
//!
//! - Connection faults (closed connection, I/O, SQLSTATE class 08, a
//!   terminated backend `57P01`–`57P03`), a statement or lock timeout
//!   (`57014`, `55P03`), serialization failures and deadlocks (`40001`,
//!   `40P01`) and an exhausted pool are [`Error::Unavailable`]: retryable,
//!   nothing was committed (the transaction was rolled back or never
//!   reached `COMMIT`).
//! - A fault while `COMMIT` itself was in flight is also `Unavailable`, but
//!   with `outcome_unknown` set ([`Error::is_outcome_unknown`], displayed
//!   with the prefix [`OUTCOME_UNKNOWN`]): the commit may or may not have
//!   happened, so the caller reads back before repeating anything.
//! - A value PostgreSQL cannot store (`22P05`, a `\u0000` in JSON text) is
//!   [`Error::InvalidInput`].
//! - Anything else is [`Error::Backend`] naming the operation.

use runkeep::Error;
use tokio_postgres::error::SqlState;

/// How an `Unavailable` whose commit may have happened is displayed (the
/// marker is the core's `outcome_unknown` field, [`Error::is_outcome_unknown`]).
pub use runkeep::error::OUTCOME_UNKNOWN;

/// True when `e` is a fault a retry can get past.
fn is_transient(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        Some(code) => {
            code.code().starts_with("08")
                || [
                    SqlState::ADMIN_SHUTDOWN,
                    SqlState::CRASH_SHUTDOWN,
                    SqlState::CANNOT_CONNECT_NOW,
                    SqlState::QUERY_CANCELED,
                    SqlState::LOCK_NOT_AVAILABLE,
                    SqlState::T_R_SERIALIZATION_FAILURE,
                    SqlState::T_R_DEADLOCK_DETECTED,
                    SqlState::TOO_MANY_CONNECTIONS,
                    SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT,
                ]
                .contains(code)
        }
        // No SQLSTATE: the error came from the socket or the protocol.
        None => true,
    }
}

/// Maps a driver error met while doing `what`.
pub(crate) fn map_pg(what: &str, e: tokio_postgres::Error) -> Error {
    if let Some(refused) = crate::db::pooled::refused_options(what, &e) {
        return refused;
    }
    if e.code() == Some(&SqlState::UNTRANSLATABLE_CHARACTER)
        || e.code() == Some(&SqlState::INVALID_TEXT_REPRESENTATION)
    {
        return Error::invalid(format!(
            "{what}: PostgreSQL cannot store this value ({}); JSON text must not contain \\u0000",
            e.as_db_error()
                .map_or_else(|| e.to_string(), |d| d.message().to_string())
        ));
    }
    if is_transient(&e) {
        return Error::unavailable(format!("PostgreSQL: {what}: {}; retry", describe(&e)), e);
    }
    Error::backend(format!("PostgreSQL: {what}"), e)
}

/// The error as a reader needs it: a server's (or pooler's) error with its
/// severity, SQLSTATE and message (tokio-postgres shows only "db error").
fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("{} {}: {}", d.severity(), d.code().code(), d.message()),
        None => e.to_string(),
    }
}

/// Maps a fault of `COMMIT`: a transient one leaves the outcome unknown.
pub(crate) fn map_commit(what: &str, e: tokio_postgres::Error) -> Error {
    if is_transient(&e) && e.code().is_none() {
        return Error::outcome_unknown(
            format!(
                "PostgreSQL: {what}: the connection failed while COMMIT was in flight ({}); the change may or may not be stored: read it back before repeating it",
                describe(&e)
            ),
            e,
        );
    }
    map_pg(what, e)
}

/// Maps a pool error.
pub(crate) fn map_pool(what: &str, e: deadpool_postgres::PoolError) -> Error {
    match e {
        deadpool_postgres::PoolError::Backend(pg) => map_pg(what, pg),
        other => Error::unavailable(
            format!("PostgreSQL: {what}: no connection from the pool ({other}); retry"),
            other,
        ),
    }
}
