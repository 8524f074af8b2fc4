//! A run's priority.
//!
//! An integer set at enqueue (default 0) and changed by an operator
//! ([`CheckpointStore::set_priority`](crate::CheckpointStore::set_priority)).
//! `claim_next` takes the **highest** priority first and, among equal
//! priorities, follows the filter's order (run id or created-at): the claim
//! key is [`RowKey::with_priority`](crate::listing::RowKey::with_priority).
//! The listing sorts by it with [`ListOrder::Priority`](crate::ListOrder)
//! (highest first, then run id) and filters with `ListOptions::min_priority`.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A run's priority: higher runs first. Any value in
/// [`Priority::MIN`]`..=`[`Priority::MAX`].
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Priority(i32);

impl Priority {
    /// The lowest priority accepted.
    pub const MIN: i32 = -1_000_000;
    /// The highest priority accepted.
    pub const MAX: i32 = 1_000_000;

    /// A checked priority: `InvalidInput` outside [`Self::MIN`]`..=`[`Self::MAX`].
    pub fn new(value: i64) -> Result<Self> {
        if !(i64::from(Self::MIN)..=i64::from(Self::MAX)).contains(&value) {
            return Err(Error::invalid(format!(
                "priority {value} is out of range; a priority is an integer from {} to {} (higher runs first, default 0)",
                Self::MIN,
                Self::MAX
            )));
        }
        Ok(Self(value as i32))
    }

    /// The value.
    pub fn get(self) -> i32 {
        self.0
    }

    /// True for the default (0).
    pub fn is_default(&self) -> bool {
        self.0 == 0
    }

    /// Refuses a value outside the range (one read from storage or the wire
    /// without [`Self::new`]).
    pub fn validate(self) -> Result<Self> {
        Self::new(i64::from(self.0))
    }

    /// The sort component that puts higher priorities first in ascending
    /// order (what [`crate::listing::RowKey`] carries).
    pub fn rank(self) -> i64 {
        -i64::from(self.0)
    }
}

impl std::fmt::Display for Priority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_is_checked_and_rank_puts_high_first() {
        assert!(Priority::new(1_000_001).is_err());
        assert!(Priority::new(-1_000_001).is_err());
        let hi = Priority::new(5).unwrap();
        let lo = Priority::new(-5).unwrap();
        assert!(hi.rank() < lo.rank());
        assert!(Priority::default().is_default());
    }
}
