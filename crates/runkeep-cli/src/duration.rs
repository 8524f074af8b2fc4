//! Human durations on the command line: `1500ms`, `30s`, `5m`, `2h`, and sums
//! such as `1h30m`. Whole numbers with a unit only; zero, negative, fractional
//! and unit-less values are refused with a message saying what is accepted.

use std::time::Duration;

use runkeep::Ttl;

const ACCEPTED: &str =
    "use a whole number with a unit: ms, s, m or h (e.g. 30s, 1500ms, 5m, 1h30m)";

/// Parses a positive duration.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err(format!("empty duration; {ACCEPTED}"));
    }
    if s.starts_with('-') {
        return Err(format!("{s:?} is negative; {ACCEPTED}"));
    }
    let mut total: u128 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(format!("{s:?} is not a duration; {ACCEPTED}"));
        }
        let value: u128 = rest[..digits]
            .parse()
            .map_err(|_| format!("{s:?} is too large; {ACCEPTED}"))?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let unit_ms: u128 = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            "" => return Err(format!("{s:?} has no unit; {ACCEPTED}")),
            other => return Err(format!("{s:?} has the unknown unit {other:?}; {ACCEPTED}")),
        };
        rest = &rest[unit_len..];
        total = value
            .checked_mul(unit_ms)
            .and_then(|v| total.checked_add(v))
            .filter(|v| *v <= u128::from(u64::MAX))
            .ok_or_else(|| format!("{s:?} is too large"))?;
    }
    if total == 0 {
        return Err(format!("{s:?} is zero; a duration must be positive"));
    }
    Ok(Duration::from_millis(total as u64))
}

/// Parses a lease TTL (a positive duration within the store's limit).
pub fn parse_ttl(text: &str) -> Result<Ttl, String> {
    let d = parse_duration(text)?;
    Ttl::from_duration(d).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_units_and_sums() {
        assert_eq!(
            parse_duration("1500ms").unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("2h").unwrap(), Duration::from_secs(7200));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
    }

    #[test]
    fn refuses_zero_negative_garbage_and_overflow() {
        for bad in [
            "",
            "0s",
            "0ms",
            "-5s",
            "30",
            "abc",
            "1.5s",
            "5d",
            "s",
            "5 s",
            "99999999999999999999h",
        ] {
            let err = parse_duration(bad).expect_err(bad);
            assert!(!err.is_empty());
        }
        assert!(parse_duration("30").unwrap_err().contains("no unit"));
        assert!(parse_duration("-1s").unwrap_err().contains("negative"));
        assert!(parse_ttl("9000h").unwrap_err().contains("366 days"));
        assert_eq!(parse_ttl("30s").unwrap().as_millis(), 30_000);
    }
}
