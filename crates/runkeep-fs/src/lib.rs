//! The directory backend (in progress).
