//! The worker runtime (in progress).
