//! Identifiers.
//!
//! # The id rule
//!
//! Every id (tenant, project, session, run, checkpoint) is 1 to
//! [`MAX_ID_LEN`] bytes of `[A-Za-z0-9_-]`, starting with a letter or digit.
//! There is no `.`, no separator, no NUL and no whitespace in that alphabet, so
//! an id is always one plain path segment: it can never be `.` or `..`, never
//! name a parent, never escape its directory in any backend, and never be taken
//! for a command-line option. The reference's shapes (`run_` + 12 characters,
//! `cp_…`, `tnt_…`) all fit.
//!
//! A [`Holder`] is not a path segment; it is evidence naming a worker, so its
//! rule is looser: 1 to [`MAX_HOLDER_LEN`] bytes of printable characters.
//!
//! Each type validates where it is built, so an invalid value cannot exist.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Longest id accepted, in bytes.
pub const MAX_ID_LEN: usize = 128;
/// Longest holder accepted, in bytes.
pub const MAX_HOLDER_LEN: usize = 256;

fn check_id(kind: &str, value: &str) -> Result<()> {
    if value.is_empty() {
        return Err(Error::invalid(format!(
            "{kind} id is empty; ids are 1 to {MAX_ID_LEN} characters of [A-Za-z0-9_-]"
        )));
    }
    if value.len() > MAX_ID_LEN {
        return Err(Error::invalid(format!(
            "{kind} id is {} bytes long; the limit is {MAX_ID_LEN}",
            value.len()
        )));
    }
    if let Some(bad) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
    {
        return Err(Error::invalid(format!(
            "{kind} id {value:?} contains {bad:?}; ids may only use [A-Za-z0-9_-] (no '.', '/', '\\', ':', NUL or spaces), so they can never escape their directory"
        )));
    }
    if !value.as_bytes()[0].is_ascii_alphanumeric() {
        return Err(Error::invalid(format!(
            "{kind} id {value:?} must start with a letter or digit"
        )));
    }
    Ok(())
}

macro_rules! define_id {
    ($(#[$doc:meta])* $name:ident, $kind:literal, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// Validates and wraps an id (see the module's id rule).
            pub fn new(value: impl Into<String>) -> Result<Self> {
                let value = value.into();
                check_id($kind, &value)?;
                Ok(Self(value))
            }

            /// A fresh id: the conventional prefix and 12 random characters of `[0-9a-z]`.
            pub fn generate() -> Self {
                Self(format!("{}{}", $prefix, random_suffix(12)))
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), self.0)
            }
        }

        impl std::str::FromStr for $name {
            type Err = Error;
            fn from_str(s: &str) -> Result<Self> {
                Self::new(s)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::new(s).map_err(serde::de::Error::custom)
            }
        }
    };
}

define_id!(
    /// A tenant: the top of every scope.
    TenantId, "tenant", "tnt_"
);
define_id!(
    /// A project within a tenant.
    ProjectId, "project", "prj_"
);
define_id!(
    /// A session within a project.
    SessionId, "session", "ses_"
);
define_id!(
    /// A run within a session.
    RunId, "run", "run_"
);
define_id!(
    /// A checkpoint within a run.
    CheckpointId, "checkpoint", "cp_"
);

/// Random suffix of `len` characters drawn uniformly from `[0-9a-z]`.
pub fn random_suffix(len: usize) -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut rng = rand::thread_rng();
    (0..len)
        .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
        .collect()
}

/// The name of a worker holding (or asking for) a lease.
///
/// It is the only thing that tells a renewal from a takeover, so it must be
/// unique per process: [`Holder::unique`] builds one from host, pid and
/// randomness. It is evidence, not authority: the fence decides.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct Holder(String);

impl Holder {
    /// Validates a holder: 1 to [`MAX_HOLDER_LEN`] bytes, no control characters.
    pub fn new(value: impl Into<String>) -> Result<Self> {
        let value = value.into();
        if value.trim().is_empty() {
            return Err(Error::invalid(
                "holder is empty; a holder names the worker process (an empty one would look like a released lease)",
            ));
        }
        if value.len() > MAX_HOLDER_LEN {
            return Err(Error::invalid(format!(
                "holder is {} bytes long; the limit is {MAX_HOLDER_LEN}",
                value.len()
            )));
        }
        if value.chars().any(char::is_control) {
            return Err(Error::invalid(format!(
                "holder {value:?} contains a control character"
            )));
        }
        Ok(Self(value))
    }

    /// A holder unique to this process and call: `<host>:<pid>:<random>`.
    pub fn unique(label: &str) -> Self {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "host".to_string());
        let label: String = label.chars().filter(|c| !c.is_control()).take(64).collect();
        let value = format!("{label}@{host}:{}:{}", std::process::id(), random_suffix(6));
        Self(value.chars().take(MAX_HOLDER_LEN).collect())
    }

    /// The holder as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Holder({:?})", self.0)
    }
}

impl<'de> Deserialize<'de> for Holder {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::new(s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_shapes_are_accepted() {
        for ok in [
            "run_1ylihmgdaeqp",
            "cp_n64vi04kywt4",
            "tnt_p35kw40pexr4",
            "run_conformance_a",
            "cp_emergency_abc",
            "A-9_z",
        ] {
            RunId::new(ok).unwrap();
        }
        assert!(RunId::generate().as_str().starts_with("run_"));
        assert_eq!(CheckpointId::generate().as_str().len(), 15);
    }

    #[test]
    fn traversal_and_separator_ids_are_refused_with_a_clear_error() {
        for bad in [
            "",
            ".",
            "..",
            "run_/../x",
            "../etc",
            "a/b",
            "a\\b",
            "a\0b",
            "run a",
            "c:x",
            "run.x",
            "-rf",
            "_x",
            "ä",
        ] {
            let err = RunId::new(bad).expect_err(bad);
            assert!(matches!(err, Error::InvalidInput { .. }), "{bad:?}: {err}");
            assert!(err.to_string().contains("run id"), "{err}");
        }
        let err = CheckpointId::new("../../x").unwrap_err();
        assert!(
            err.to_string().contains("can never escape their directory"),
            "{err}"
        );
        assert!(RunId::new("x".repeat(MAX_ID_LEN)).is_ok());
        assert!(RunId::new("x".repeat(MAX_ID_LEN + 1)).is_err());
    }

    #[test]
    fn ids_refuse_bad_values_when_deserialized() {
        assert!(serde_json::from_str::<RunId>("\"../x\"").is_err());
        assert!(serde_json::from_str::<RunId>("\"run_ok\"").is_ok());
    }

    #[test]
    fn holders_refuse_empty_and_control_characters() {
        assert!(Holder::new("").is_err());
        assert!(Holder::new("   ").is_err());
        assert!(Holder::new("a\nb").is_err());
        assert!(Holder::new("x".repeat(MAX_HOLDER_LEN + 1)).is_err());
        Holder::new("gke-pool-b-2x4k:37192:r90zkp").unwrap();
        assert_ne!(Holder::unique("w"), Holder::unique("w"));
    }
}
