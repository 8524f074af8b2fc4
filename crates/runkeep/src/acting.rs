//! Who a write is made for, when one store serves principals that must not
//! act on each other's holdings.
//!
//! A fence proves that a write belongs to the run's current holding, not
//! *who* presents it: any reader of a shared store can see a run's fence.
//! A server in front of a store (`runkeep serve`) binds each holding to the
//! principal that claimed it, by claiming under a holder name that ends in
//! [`TAG`] and the principal's id (`w1@host ~token:abc`), and makes every
//! write of a request *acting for* that principal ([`scope`]).
//!
//! The rule ([`check`]) is judged by the store with the fence, on the same
//! holding read under the same lock or transaction, so no claim can land
//! between the two checks:
//!
//! - a **fenced** write acting for `A` whose fence is the run's top holding
//!   is refused with [`Error::NotYourHolding`] unless that holding was
//!   claimed by `A` (its holder ends in `~token:A`);
//! - an **unfenced** write acting for `A` is refused while the run's top
//!   holding is a lease, live *or* expired, whoever claimed it: stamped
//!   with that holding's fence it would pass for the holder's work, and a
//!   principal (one token) may be a whole fleet of workers, so even `A`'s
//!   own holding cannot tell its current worker from a stale one without
//!   the fence. Send the fence, or claim the run first (an expired lease is
//!   taken over by the claim); a released or never-claimed run takes
//!   unfenced writes;
//! - a write acting for no one (in-process callers, an operator's override)
//!   is judged by the fence rule alone.
//!
//! The actor travels with the task, like a tracing span, so every backend's
//! fence check ([`crate::lease::check_write_fence`],
//! [`crate::lease::decide_release`], [`crate::lease::check_unfenced_write`])
//! sees it without each of twenty contract methods taking a parameter. A
//! backend that runs its I/O on another thread carries it there with
//! [`current`] and [`sync_scope`] (the directory store's `blocking`).

use std::future::Future;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::id::RunId;
use crate::lease::{Fence, TopHolding};

/// What separates a holder's own name from the principal it was claimed
/// for (`w1@host ~token:abc`).
pub const TAG: &str = " ~token:";

/// The principal a write is made for: the id of the token it came through.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Actor(Arc<str>);

impl Actor {
    /// The actor with id `id` (a token id: never empty, no [`TAG`]).
    pub fn new(id: &str) -> Result<Self> {
        if id.is_empty() || id.contains(TAG.trim()) || id.chars().any(char::is_whitespace) {
            return Err(Error::invalid(format!(
                "an actor id is a token id: non-empty, without whitespace or {:?}; got {id:?}",
                TAG.trim()
            )));
        }
        Ok(Self(id.into()))
    }

    /// Its id.
    pub fn id(&self) -> &str {
        &self.0
    }

    /// True when `holder` was claimed for this actor.
    pub fn holds(&self, holder: &str) -> bool {
        bound_to(holder) == Some(self.id())
    }
}

impl std::fmt::Display for Actor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The id of the actor a holder was claimed for, if any (the text after
/// the last [`TAG`]).
pub fn bound_to(holder: &str) -> Option<&str> {
    holder.rfind(TAG).map(|i| &holder[i + TAG.len()..])
}

tokio::task_local! {
    static ACTING: Actor;
}

/// Runs `f` acting for `actor`: every write it makes through a store is
/// judged by [`check`] for that actor.
pub async fn scope<F: Future>(actor: Actor, f: F) -> F::Output {
    ACTING.scope(actor, f).await
}

/// [`scope`] for synchronous work (a backend's blocking thread); `None`
/// runs `f` acting for no one.
pub fn sync_scope<R>(actor: Option<Actor>, f: impl FnOnce() -> R) -> R {
    match actor {
        Some(a) => ACTING.sync_scope(a, f),
        None => f(),
    }
}

/// The actor the current task's writes are made for, if any.
pub fn current() -> Option<Actor> {
    ACTING.try_with(Actor::clone).ok()
}

/// The actor rule (module docs), for a write presenting `presented`
/// (`None`: unfenced) against the run's top holding, acting for `actor`.
/// Judged after the fence rule has admitted a fenced write.
pub fn check(
    run: &RunId,
    operation: &'static str,
    presented: Option<Fence>,
    top: Option<&TopHolding>,
    actor: Option<&Actor>,
) -> Result<()> {
    let Some(actor) = actor else {
        return Ok(());
    };
    let refuse = |fence: Fence| Error::NotYourHolding {
        run: run.to_string(),
        operation,
        fence,
        fenced: presented.is_some(),
    };
    match (presented, top) {
        (Some(p), Some(TopHolding::Lease { fence, holder, .. })) if *fence == p => {
            if actor.holds(holder.as_str()) {
                Ok(())
            } else {
                Err(refuse(*fence))
            }
        }
        // Whose an unreadable holding is cannot be told: it grants no one.
        (Some(p), Some(TopHolding::Unreadable { fence })) if *fence == p => Err(refuse(*fence)),
        (Some(_), _) => Ok(()),
        (None, Some(TopHolding::Lease { fence, .. })) => Err(refuse(*fence)),
        (None, _) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::Holder;
    use crate::time::Timestamp;

    fn run() -> RunId {
        RunId::new("run_a").unwrap()
    }
    fn f(n: u64) -> Fence {
        Fence::new(n).unwrap()
    }
    fn lease(n: u64, holder: &str, expires: i64) -> TopHolding {
        TopHolding::Lease {
            fence: f(n),
            holder: Holder::new(holder).unwrap(),
            expires_at: Timestamp::from_millis(expires).unwrap(),
        }
    }

    #[test]
    fn a_fenced_write_must_come_from_the_holdings_actor() {
        let a = Actor::new("a").unwrap();
        let top = lease(3, "w1 ~token:a", 10);
        assert!(check(&run(), "op", Some(f(3)), Some(&top), Some(&a)).is_ok());
        let b = Actor::new("b").unwrap();
        let e = check(&run(), "op", Some(f(3)), Some(&top), Some(&b)).unwrap_err();
        assert!(
            matches!(e, Error::NotYourHolding { fence, fenced: true, .. } if fence == f(3)),
            "{e:?}"
        );
        // A holding claimed in process (no tag) belongs to no actor.
        let untagged = lease(3, "w1", 10);
        assert!(check(&run(), "op", Some(f(3)), Some(&untagged), Some(&a)).is_err());
        // No actor: the fence rule alone.
        assert!(check(&run(), "op", Some(f(3)), Some(&top), None).is_ok());
        // A tag is judged by its last occurrence: a name cannot smuggle one.
        let smuggled = lease(3, "x ~token:b ~token:a", 10);
        assert!(check(&run(), "op", Some(f(3)), Some(&smuggled), Some(&b)).is_err());
    }

    #[test]
    fn an_unfenced_write_is_refused_under_any_lease_live_or_expired() {
        let b = Actor::new("b").unwrap();
        for expires in [0, 4_000_000_000_000] {
            for holder in ["w1 ~token:a", "w1 ~token:b", "w1"] {
                let top = lease(1, holder, expires);
                let e = check(&run(), "op", None, Some(&top), Some(&b)).unwrap_err();
                assert!(
                    matches!(e, Error::NotYourHolding { fenced: false, .. }),
                    "{e:?}"
                );
                assert!(check(&run(), "op", None, Some(&top), None).is_ok());
            }
        }
        let released = TopHolding::Released { fence: f(2) };
        assert!(check(&run(), "op", None, Some(&released), Some(&b)).is_ok());
        assert!(check(&run(), "op", None, None, Some(&b)).is_ok());
    }

    #[test]
    fn an_unreadable_holding_grants_no_actor() {
        let a = Actor::new("a").unwrap();
        let top = TopHolding::Unreadable { fence: f(4) };
        assert!(check(&run(), "op", Some(f(4)), Some(&top), Some(&a)).is_err());
    }

    #[test]
    fn actor_ids_cannot_carry_a_tag() {
        assert!(Actor::new("").is_err());
        assert!(Actor::new("a ~token:b").is_err());
        assert!(Actor::new("a~token:b").is_err());
        assert_eq!(bound_to("w ~token:abc"), Some("abc"));
        assert_eq!(bound_to("w"), None);
    }

    #[tokio::test]
    async fn the_actor_travels_with_the_task_and_to_a_blocking_thread() {
        assert_eq!(current(), None);
        let a = Actor::new("a").unwrap();
        let seen = scope(a.clone(), async {
            let carried = current();
            tokio::task::spawn_blocking(move || sync_scope(carried, current))
                .await
                .unwrap()
        })
        .await;
        assert_eq!(seen, Some(a));
        assert_eq!(current(), None);
    }
}
