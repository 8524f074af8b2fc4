//! Who may act on a holding over HTTP: the token that claimed it.
//!
//! The store checks fences; a fence proves *that* a write belongs to the
//! current holding, not *who* presents it. Any reader can see a run's fence
//! (`GET …/lease`), so over HTTP a fence alone is not enough:
//!
//! - **A holding is bound to the token that claimed it.** The server stores
//!   the holder as `<holder> ~token:<token id>` ([`tag`]): the store keeps
//!   it with the holding like any holder name, so the binding survives a
//!   server restart and is shared by every server in front of one store.
//!   Answers show the holder as the client sent it ([`display`]).
//!   A claim under another token's holder name is therefore a different
//!   holder: it is answered `held`, never a renewal.
//! - **Every write of a worker's request is made for its token**
//!   (`runkeep::acting`, set by the route guard in `api`). The *store*
//!   judges it, on the holding it judges the fence on, under the same lock
//!   or transaction: a fenced act on a holding another token claimed, and
//!   an unfenced write while another token's lease (live or expired) is on
//!   top, are refused 403 `forbidden` (`runkeep::Error::NotYourHolding`,
//!   with `run`, `operation` and the holding's fence in `current`). No
//!   claim can land between a check and the write: there is one check.
//! - Operators act for no one: they may override (release, answer, prune)
//!   without a fence.

use runkeep::Holder;

use crate::problem::Problem;

pub use runkeep_http::holder::{display, TAG};

/// The holder the store records for `holder` claimed through `token_id`.
pub fn tag(holder: &str, token_id: &str, field: &str) -> Result<Holder, Problem> {
    if holder.contains(TAG.trim_start()) {
        return Err(Problem::invalid(
            field,
            format!("a holder may not contain {:?}: the server adds it to bind the holding to your token", TAG.trim_start()),
        ));
    }
    let tagged = format!("{holder}{TAG}{token_id}");
    Holder::new(&tagged).map_err(|e| {
        let room = runkeep::id::MAX_HOLDER_LEN.saturating_sub(TAG.len() + token_id.len());
        if holder.len() > room {
            Problem::invalid(
                field,
                format!(
                    "holder is {} bytes long; over HTTP the limit is {room} (the server appends the token it was claimed through)",
                    holder.len()
                ),
            )
        } else {
            Problem::from(e).with_field(field)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip_and_the_last_tag_counts() {
        let h = tag("w1@host:1", "abc", "holder").unwrap();
        assert_eq!(h.as_str(), "w1@host:1 ~token:abc");
        assert_eq!(display(h.as_str()), "w1@host:1");
        assert_eq!(runkeep::acting::bound_to(h.as_str()), Some("abc"));
        assert_eq!(runkeep::acting::bound_to("w1"), None);
        assert_eq!(display("w1"), "w1");
    }

    #[test]
    fn a_holder_cannot_carry_a_tag_of_its_own() {
        let p = tag("w1 ~token:victim", "attacker", "holder").unwrap_err();
        assert_eq!(p.field.as_deref(), Some("holder"));
        let p = tag("w1~token:victim", "attacker", "holder").unwrap_err();
        assert_eq!(p.field.as_deref(), Some("holder"));
    }

    #[test]
    fn a_long_holder_is_refused_with_the_http_limit() {
        let p = tag(&"w".repeat(250), "abcdefghijkl", "holder").unwrap_err();
        let detail = p.detail.clone().unwrap_or_default();
        assert!(detail.contains("over HTTP the limit is 236"), "{detail}");
    }
}
