//! Terminal output: colour (only on a TTY, never with `NO_COLOR`), aligned
//! tables, readable instants and durations, JSON documents and lines.

use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use runkeep::Timestamp;
use serde::Serialize;

use crate::error::{CliError, CliResult};

pub use runkeep_term::{Cell, Color, Style, Table};

/// Key/value lines with the keys aligned (for `show`).
pub fn fields(pairs: &[(&str, Cell)], style: &Style) -> String {
    let width = pairs.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    pairs
        .iter()
        .map(|(k, v)| {
            let value = v.painted(style);
            format!(
                "{}  {value}\n",
                style.paint(&format!("{k:<width$}"), Color::Bold)
            )
        })
        .collect()
}

/// Writes text to stdout. A closed pipe (`EPIPE`: the reader went away, as
/// in `runkeep runs | head -1`) is not a failure of the command: it becomes a
/// silent [`CliError`] that `main` turns into exit 0 with nothing printed.
/// A store password this process parsed never reaches stdout
/// ([`crate::store::redact`]).
pub fn emit(text: &str) -> CliResult<()> {
    let text = crate::store::redact(text);
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// Writes one pretty JSON document to stdout.
pub fn emit_json<T: Serialize + ?Sized>(value: &T) -> CliResult<()> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| CliError::internal(format!("encoding JSON output: {e}")))?;
    emit(&format!("{text}\n"))
}

/// Writes one compact JSON line to stdout (JSON lines).
pub fn emit_json_line<T: Serialize + ?Sized>(value: &T) -> CliResult<()> {
    let text = serde_json::to_string(value)
        .map_err(|e| CliError::internal(format!("encoding JSON output: {e}")))?;
    emit(&format!("{text}\n"))
}

/// One line on stderr. A stderr that cannot be written (a closed pipe, as in
/// `runkeep runs 2>&1 >/dev/null | true`) loses the line and nothing else:
/// unlike `eprintln!`, this never panics.
fn stderr_line(line: &str) {
    let line = crate::store::redact(line);
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{line}");
}

/// A warning on stderr.
pub fn warn(message: &str) {
    let style = Style::stderr();
    stderr_line(&format!(
        "{} {message}",
        style.paint("warning:", Color::Yellow)
    ));
}

/// An informational note on stderr (kept off stdout so scripts can parse it).
pub fn note(message: &str) {
    let style = Style::stderr();
    stderr_line(&style.paint(message, Color::Dim));
}

/// The instant as a `SystemTime` (a `Timestamp` is never before 1970).
fn system_time(ts: Timestamp) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ts.as_millis().unsigned_abs())
}

/// What [`parse_instant`] accepts.
pub const INSTANT_FORMS: &str =
    "an instant in UTC, YYYY-MM-DDTHH:MM:SSZ (optionally with .mmm milliseconds before the Z)";

/// Parses a UTC instant as [`iso`] and [`iso_millis`] print it:
/// `2026-11-29T11:52:07Z` or `2026-11-29T11:52:07.315Z`. Other offsets,
/// dates without a time and out-of-range fields are refused (an instant
/// that is not what it looks like is worse than a refusal).
pub fn parse_instant(text: &str) -> Result<Timestamp, String> {
    let bad = || format!("{text:?} is not {INSTANT_FORMS}");
    let s = text.trim();
    let body = s.strip_suffix('Z').ok_or_else(|| {
        if s.len() >= 19 && s.as_bytes().get(10) == Some(&b'T') {
            format!("{text:?}: only UTC instants ending in Z are accepted; {INSTANT_FORMS}")
        } else {
            bad()
        }
    })?;
    let (main, millis) = match body.split_once('.') {
        Some((m, f)) if (1..=3).contains(&f.len()) && f.bytes().all(|b| b.is_ascii_digit()) => {
            let padded = format!("{f:0<3}");
            (m, padded.parse::<i64>().map_err(|_| bad())?)
        }
        Some(_) => return Err(bad()),
        None => (body, 0),
    };
    let b = main.as_bytes();
    if b.len() != 19
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
    {
        return Err(bad());
    }
    let num = |r: std::ops::Range<usize>| -> Result<i64, String> {
        let part = &main[r];
        if !part.bytes().all(|c| c.is_ascii_digit()) {
            return Err(bad());
        }
        part.parse::<i64>().map_err(|_| bad())
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || hour > 23 || minute > 59 || second > 59 || day < 1 {
        return Err(bad());
    }
    if year < 1970 {
        return Err(format!(
            "{text:?} is before 1970-01-01T00:00:00Z, the first instant a store holds"
        ));
    }
    // The calendar (month lengths, leap years) is humantime's; the syntax
    // above is stricter than its RFC 3339 (no leap second, at most
    // milliseconds).
    let at = humantime::parse_rfc3339(&format!("{main}Z"))
        .map_err(|_| format!("{text:?}: {year:04}-{month:02} has no day {day}"))?;
    let whole = at
        .duration_since(UNIX_EPOCH)
        .map_err(|_| bad())?
        .as_millis();
    let ms = i64::try_from(whole).map_err(|_| bad())? + millis;
    Timestamp::from_millis(ms).map_err(|e| format!("{text:?}: {e}"))
}

/// `2025-06-01T12:04:05Z` (UTC, seconds).
pub fn iso(ts: Timestamp) -> String {
    humantime::format_rfc3339_seconds(system_time(ts)).to_string()
}

/// `2025-06-01T12:04:05.123Z` (UTC, milliseconds), for JSON reports.
pub fn iso_millis(ts: Timestamp) -> String {
    humantime::format_rfc3339_millis(system_time(ts)).to_string()
}

/// A duration for humans: `850ms`, `25s`, `3m 12s`, `1h 5m`, `2d 4h`.
pub fn human_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let s = d.as_secs();
    let (days, hours, mins, secs) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    let parts = [(days, "d"), (hours, "h"), (mins, "m"), (secs, "s")];
    let first = parts.iter().position(|(v, _)| *v > 0).unwrap_or(3);
    parts[first..]
        .iter()
        .take(2)
        .filter(|(v, _)| *v > 0)
        .map(|(v, u)| format!("{v}{u}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `in 25s`, `3m ago`, `now`.
pub fn relative(ts: Timestamp, now: Timestamp) -> String {
    let delta = ts.as_millis() - now.as_millis();
    if delta.abs() < 1000 {
        return "now".to_string();
    }
    let d = human_duration(Duration::from_millis(delta.unsigned_abs()));
    if delta > 0 {
        format!("in {d}")
    } else {
        format!("{d} ago")
    }
}

/// `2025-06-01T12:04:05Z (3m ago)`.
pub fn when(ts: Timestamp, now: Timestamp) -> String {
    format!("{} ({})", iso(ts), relative(ts, now))
}

/// Shortens `text` to `max` characters with an ellipsis.
pub fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut s: String = text.chars().take(max.saturating_sub(1)).collect();
    s.push('…');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms).unwrap()
    }

    #[test]
    fn instants_format_as_utc_iso() {
        assert_eq!(iso(at(0)), "1970-01-01T00:00:00Z");
        assert_eq!(iso(at(951_782_400_000)), "2000-02-29T00:00:00Z");
        assert_eq!(
            iso_millis(at(1_717_243_445_123)),
            "2024-06-01T12:04:05.123Z"
        );
    }

    #[test]
    fn instants_parse_back_exactly_and_refuse_what_is_not_utc() {
        for ms in [
            0,
            951_782_400_000,
            1_717_243_445_123,
            4_102_444_799_999,
            runkeep::time::MAX_TIMESTAMP_MS,
        ] {
            assert_eq!(parse_instant(&iso_millis(at(ms))), Ok(at(ms)));
        }
        assert_eq!(
            parse_instant("2024-06-01T12:04:05Z"),
            Ok(at(1_717_243_445_000))
        );
        assert_eq!(
            parse_instant("2024-06-01T12:04:05.1Z"),
            Ok(at(1_717_243_445_100))
        );
        for bad in [
            "2024-06-01",
            "2024-06-01T12:04:05",
            "2024-06-01T12:04:05+02:00",
            "2024-02-30T00:00:00Z",
            "2023-02-29T00:00:00Z",
            "1900-02-29T00:00:00Z",
            "1969-12-31T23:59:59Z",
            "2024-06-01T12:04:60Z",
            "2024-13-01T00:00:00Z",
            "2024-06-01T24:00:00Z",
            "2024-06-01T12:04:05.1234Z",
            "yesterday",
        ] {
            assert!(parse_instant(bad).is_err(), "{bad}");
        }
        assert!(parse_instant("2024-06-01T12:04:05+02:00")
            .unwrap_err()
            .contains("only UTC"));
    }

    #[test]
    fn durations_and_relative_times_read_naturally() {
        assert_eq!(human_duration(Duration::from_millis(850)), "850ms");
        assert_eq!(human_duration(Duration::from_secs(25)), "25s");
        assert_eq!(human_duration(Duration::from_secs(192)), "3m 12s");
        assert_eq!(human_duration(Duration::from_secs(180)), "3m");
        assert_eq!(human_duration(Duration::from_secs(3900)), "1h 5m");
        assert_eq!(
            human_duration(Duration::from_secs(2 * 86_400 + 3600 * 4 + 7)),
            "2d 4h"
        );
        assert_eq!(relative(at(26_000), at(1_000)), "in 25s");
        assert_eq!(relative(at(1_000), at(181_000)), "3m ago");
        assert_eq!(relative(at(1_000), at(1_500)), "now");
    }

    #[test]
    fn truncation_marks_the_cut() {
        assert_eq!(truncate("abcdef", 4), "abc…");
        assert_eq!(truncate("abc", 4), "abc");
    }
}
