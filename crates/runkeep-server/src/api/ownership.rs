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
//! - **A fenced act by a worker** ([`check_fenced`]) whose fence is the
//!   run's top holding must come from the token that claimed that holding,
//!   or it is refused 403 before the store is touched. A fence that is not
//!   the top holding goes on to the store, which refuses it as stale (409).
//! - **An unfenced write by a worker** ([`check_unfenced`]) to a run that
//!   is held live is refused 403: without a fence it would land under the
//!   holder's fence (the store stamps it). An operator's token may.
//! - Operators pass both checks: they may override (release, answer,
//!   prune) without a fence, so a fence check adds nothing for them.
//!
//! The checks read the run's top holding (one store read) unless this
//! server has already seen the holding taken through the same token
//! ([`Owners`], a bounded cache of immutable facts: a fence of a run is
//! issued once). An unfenced write checks the holding just before it is
//! written; a claim that lands between the check and the write is the one
//! window left (the write is then stamped with the new holding's fence).

// A `Problem` is returned straight into a response, once per refused
// request: its size costs nothing measurable, boxing it would cost clarity.
#![expect(
    clippy::result_large_err,
    reason = "a Problem (RFC 9457 details) is what every parser and handler here refuses with; boxing it would allocate per refusal and change nothing else"
)]

use std::collections::HashMap;
use std::sync::Mutex;

use runkeep::{Fence, Holder, RunScope};

use crate::auth::{Principal, Role};
use crate::problem::{Problem, ProblemType};
use crate::state::AppState;

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

/// The id of the token a stored holder was claimed through, if any.
pub fn token_of(holder: &str) -> Option<&str> {
    holder.rfind(TAG).map(|i| &holder[i + TAG.len()..])
}

/// Holdings this server saw taken, by run and fence: `(run, fence) → token
/// id`. A fence is issued once per run, so an entry never goes stale; the
/// map is cleared when it grows past [`Owners::CAPACITY`] (a miss costs one
/// store read, never a wrong answer).
#[derive(Debug, Default)]
pub struct Owners {
    map: Mutex<HashMap<(String, u64), String>>,
}

impl Owners {
    /// The most entries kept.
    pub const CAPACITY: usize = 1 << 16;

    /// Notes that `fence` of `scope` was taken through `token_id`.
    pub fn remember(&self, scope: &RunScope, fence: Fence, token_id: &str) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= Self::CAPACITY {
            map.clear();
        }
        map.insert((scope.to_string(), fence.get()), token_id.to_string());
    }

    fn get(&self, scope: &RunScope, fence: Fence) -> Option<String> {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.get(&(scope.to_string(), fence.get())).cloned()
    }
}

fn not_yours(scope: &RunScope, fence: Fence, operation: &str) -> Problem {
    Problem::new(
        ProblemType::Forbidden,
        format!(
            "{operation} on run {}: the holding at fence {fence} was not claimed through this token; a worker acts only on holdings it claimed itself (claim the run, or use an operator token)",
            scope.run_id
        ),
    )
}

/// Refuses (403) a worker's act under `fence` when `fence` is the run's top
/// holding and was claimed through another token (module docs).
pub async fn check_fenced(
    state: &AppState,
    principal: &Principal,
    scope: &RunScope,
    fence: Fence,
    operation: &str,
) -> Result<(), Problem> {
    if principal.role >= Role::Operator {
        return Ok(());
    }
    if let Some(owner) = state.owners.get(scope, fence) {
        return if owner == principal.token_id {
            Ok(())
        } else {
            Err(not_yours(scope, fence, operation))
        };
    }
    let Some(top) = state.store.lease(scope, state.store.now()).await? else {
        return Ok(()); // never claimed: the store refuses the fence
    };
    if top.fence != fence || top.holder.is_empty() {
        return Ok(()); // not the top holding, or released: the store refuses it
    }
    match token_of(&top.holder) {
        Some(owner) => {
            state.owners.remember(scope, fence, owner);
            if owner == principal.token_id {
                Ok(())
            } else {
                Err(not_yours(scope, fence, operation))
            }
        }
        // Claimed in process (not through a server): no worker token holds it.
        None => Err(not_yours(scope, fence, operation)),
    }
}

/// Refuses (403) a worker's unfenced write to a run held live (module docs).
pub async fn check_unfenced(
    state: &AppState,
    principal: &Principal,
    scope: &RunScope,
    operation: &str,
) -> Result<(), Problem> {
    if principal.role >= Role::Operator {
        return Ok(());
    }
    let now = state.store.now();
    match state.store.lease(scope, now).await? {
        Some(top) if !top.holder.is_empty() && !top.expired => Err(Problem::new(
            ProblemType::Forbidden,
            format!(
                "{operation} on run {} without a fence: the run is held (fence {}), and an unfenced write would land under that holding. Send the fence of your own holding (claim the run first), or use an operator token",
                scope.run_id, top.fence
            ),
        )),
        _ => Ok(()),
    }
}

/// [`check_fenced`] with a fence, [`check_unfenced`] without.
pub async fn check_write(
    state: &AppState,
    principal: &Principal,
    scope: &RunScope,
    fence: Option<Fence>,
    operation: &str,
) -> Result<(), Problem> {
    match fence {
        Some(f) => check_fenced(state, principal, scope, f, operation).await,
        None => check_unfenced(state, principal, scope, operation).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip_and_the_last_tag_counts() {
        let h = tag("w1@host:1", "abc", "holder").unwrap();
        assert_eq!(h.as_str(), "w1@host:1 ~token:abc");
        assert_eq!(display(h.as_str()), "w1@host:1");
        assert_eq!(token_of(h.as_str()), Some("abc"));
        assert_eq!(token_of("w1"), None);
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
        let detail = p.detail.unwrap_or_default();
        assert!(detail.contains("over HTTP the limit is 236"), "{detail}");
    }
}
