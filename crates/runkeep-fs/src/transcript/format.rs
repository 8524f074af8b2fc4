//! The transcript's line format and the file names of a run's logs: what
//! every other part of the transcript reads, so it sits below them all.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use runkeep::PersistedEvent;
use serde_json::Value;

/// The transcript file of a run.
pub(crate) const TRANSCRIPT: &str = "transcript.jsonl";

/// The audit trail of a run.
pub(crate) const AUDIT: &str = "audit.jsonl";

/// The offset index inside the run's meta directory.
pub(crate) const INDEX_FILE: &str = "transcript.idx";

/// What one non-empty line is.
pub(super) enum Parsed {
    Event(PersistedEvent),
    /// An object whose `seq` is not a positive integer.
    BadSeq(Value),
    Damaged(String),
}

pub(super) fn parse_line(bytes: &[u8], position: u64) -> Parsed {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(m)) => {
            if !matches!(m.get("type"), Some(Value::String(_))) {
                return Parsed::Damaged("is not an event object".into());
            }
            if let Some(v) = m.get("seq") {
                if v.as_u64().is_none_or(|s| s == 0) {
                    return Parsed::BadSeq(v.clone());
                }
            }
            match PersistedEvent::from_json(m, position) {
                Ok(e) => Parsed::Event(e),
                Err(reason) => Parsed::Damaged(reason),
            }
        }
        Ok(_) => Parsed::Damaged("is not an event object".into()),
        Err(_) => Parsed::Damaged("is not valid JSON".into()),
    }
}

/// Non-empty lines of `buf` with their absolute offsets and whether each is
/// newline-terminated.
pub(super) fn lines(buf: &[u8], base: u64) -> impl Iterator<Item = (u64, &[u8], bool)> {
    let mut start = 0usize;
    std::iter::from_fn(move || loop {
        if start >= buf.len() {
            return None;
        }
        let (end, next, terminated) = match buf[start..].iter().position(|b| *b == b'\n') {
            Some(i) => (start + i, start + i + 1, true),
            None => (buf.len(), buf.len(), false),
        };
        let off = base + start as u64;
        let line = &buf[start..end];
        start = next;
        if !line.is_empty() {
            return Some((off, line, terminated));
        }
    })
}

/// True when a non-empty log file's last byte is not a newline.
pub(crate) fn is_torn(path: &Path) -> bool {
    let Ok(f) = File::open(path) else {
        return false;
    };
    let Ok(len) = f.metadata().map(|m| m.len()) else {
        return false;
    };
    let mut b = [0u8; 1];
    len > 0 && f.read_exact_at(&mut b, len - 1).is_ok() && b[0] != b'\n'
}
