//! [`FenceGate`]: the zombie check an external side-effect system applies.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::handle::FenceToken;
use runkeep::lease::Fence;
use runkeep::scope::RunScope;

/// The rule, as a pure function: an effect presented under `presented` is
/// admitted iff no higher fence has been seen for its run. Equal is admitted
/// (one holding issues many effects). Whoever applies it must remember the
/// highest admitted fence per run and check-and-record atomically with the
/// effect.
pub fn admit_fence(highest_seen: Option<Fence>, presented: Fence) -> bool {
    highest_seen.is_none_or(|h| presented >= h)
}

/// An effect refused because a newer holding of its run had been seen.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[error("effect on run {run} refused: it presented fence {presented}, but fence {highest} has been seen for this run (a superseded worker)")]
pub struct EffectRefused {
    /// The run (its scope, as text).
    pub run: String,
    /// The fence the effect presented.
    pub presented: Fence,
    /// The highest fence seen for the run.
    pub highest: Fence,
}

/// An in-process side-effect sink that refuses zombies: it remembers the
/// highest fence seen per run and refuses any effect presented under a lower
/// one ([`admit_fence`]).
///
/// It stops a superseded worker once the new holder has shown its fence to
/// the sink — by its first effect, or up front with [`FenceGate::observe`]
/// right after taking the run (do that to close the window before the new
/// holder's first effect).
#[derive(Debug, Default)]
pub struct FenceGate {
    highest: Mutex<HashMap<RunScope, Fence>>,
}

impl FenceGate {
    /// An empty gate.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RunScope, Fence>> {
        self.highest.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Checks `token`, and if admitted records its fence and runs `effect`,
    /// all under one lock: check, record and effect are atomic with respect
    /// to every other call on this gate.
    pub fn apply<T>(
        &self,
        token: &FenceToken,
        effect: impl FnOnce() -> T,
    ) -> Result<T, EffectRefused> {
        let mut highest = self.lock();
        let seen = highest.get(&token.scope).copied();
        if !admit_fence(seen, token.fence) {
            return Err(EffectRefused {
                run: token.scope.to_string(),
                presented: token.fence,
                highest: seen.unwrap_or(token.fence),
            });
        }
        highest.insert(token.scope.clone(), token.fence);
        Ok(effect())
    }

    /// Checks and records `token` with no effect of its own.
    pub fn admit(&self, token: &FenceToken) -> Result<(), EffectRefused> {
        self.apply(token, || ())
    }

    /// Raises the run's highest fence to `token.fence` without an effect
    /// (never lowers it): a new holder announces itself so a zombie is
    /// refused even before the new holder's first effect.
    pub fn observe(&self, token: &FenceToken) {
        let mut highest = self.lock();
        let entry = highest.entry(token.scope.clone()).or_insert(token.fence);
        *entry = (*entry).max(token.fence);
    }

    /// The highest fence seen for `scope`.
    pub fn highest(&self, scope: &RunScope) -> Option<Fence> {
        self.lock().get(scope).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(n: u64) -> Fence {
        Fence::new(n).unwrap()
    }

    #[test]
    fn rule_admits_equal_and_higher_and_refuses_lower() {
        assert!(admit_fence(None, f(1)));
        assert!(admit_fence(Some(f(3)), f(3)));
        assert!(admit_fence(Some(f(3)), f(4)));
        assert!(!admit_fence(Some(f(3)), f(2)));
    }
}
