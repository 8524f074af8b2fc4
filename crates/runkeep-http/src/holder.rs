//! How the server records a holder: the name its claimer gave, followed by
//! the token it was claimed through ([`TAG`]). Answers show the name alone
//! ([`display`]).

/// What separates a holder from the token it was claimed through (the
/// core's: the store judges a write's actor by it, `runkeep::acting`).
pub use runkeep::acting::TAG;

/// The length of a token id (a token is `rk_<id>_<secret>`): what the
/// server's tag adds to a holder after [`TAG`].
pub const TOKEN_ID_LEN: usize = 12;

/// The holder as its claimer named it (the token tag removed).
pub fn display(holder: &str) -> &str {
    match holder.rfind(TAG) {
        Some(i) => &holder[..i],
        None => holder,
    }
}
