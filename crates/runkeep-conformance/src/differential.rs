//! The differential property test (see the driver below).
