//! Human durations on the command line: `1500ms`, `30s`, `5m`, `2h`, `30d`, sums
//! such as `1h30m`, and decimal fractions such as `1.5s` or `0.25h`. Every
//! number needs a unit; the total must be a positive whole number of
//! milliseconds. Zero, negative, sub-millisecond and unit-less values are
//! refused with a message saying what is accepted.

use std::time::Duration;

use runkeep::Ttl;

const ACCEPTED: &str =
    "use a number with a unit: ms, s, m, h or d (e.g. 30s, 1.5s, 1500ms, 5m, 1h30m, 30d)";

/// Parses a positive duration.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err(format!("empty duration; {ACCEPTED}"));
    }
    if s.starts_with('-') {
        return Err(format!("{s:?} is negative; {ACCEPTED}"));
    }
    // Exact arithmetic: the total in units of 10^-FRACTION_DIGITS ms.
    const FRACTION_DIGITS: u32 = 6;
    const SCALE: u128 = 10u128.pow(FRACTION_DIGITS);
    let mut total: u128 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let whole_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let (whole, fraction, number_len) = match rest[whole_len..].strip_prefix('.') {
            Some(after) => {
                let frac_len = after.bytes().take_while(u8::is_ascii_digit).count();
                (
                    &rest[..whole_len],
                    &after[..frac_len],
                    whole_len + 1 + frac_len,
                )
            }
            None => (&rest[..whole_len], "", whole_len),
        };
        if whole.is_empty() && fraction.is_empty() {
            return Err(format!("{s:?} is not a duration; {ACCEPTED}"));
        }
        if fraction.len() > FRACTION_DIGITS as usize {
            return Err(format!(
                "{s:?} has more than {FRACTION_DIGITS} decimal places; {ACCEPTED}"
            ));
        }
        let number = &rest[..number_len];
        rest = &rest[number_len..];
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let unit_ms: u128 = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "" if rest.is_empty() && number_len == s.len() => {
                return Err(format!(
                    "{s:?} has no unit (did you mean {number}s or {number}ms?); {ACCEPTED}"
                ))
            }
            "" if rest.is_empty() => {
                return Err(format!(
                    "{s:?}: the number {number:?} has no unit; {ACCEPTED}"
                ))
            }
            "" => return Err(format!("{s:?} is not a duration; {ACCEPTED}")),
            other => return Err(format!("{s:?} has the unknown unit {other:?}; {ACCEPTED}")),
        };
        rest = &rest[unit_len..];
        let too_large = || format!("{s:?} is too large");
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| too_large())?
        };
        let padded = format!("{fraction:0<width$}", width = FRACTION_DIGITS as usize);
        let fraction: u128 = padded.parse().map_err(|_| too_large())?;
        total = whole
            .checked_mul(SCALE)
            .and_then(|w| w.checked_add(fraction))
            .and_then(|v| v.checked_mul(unit_ms))
            .and_then(|v| total.checked_add(v))
            .filter(|v| *v / SCALE <= u128::from(u64::MAX))
            .ok_or_else(too_large)?;
    }
    if total == 0 {
        return Err(format!("{s:?} is zero; a duration must be positive"));
    }
    if !total.is_multiple_of(SCALE) {
        return Err(format!(
            "{s:?} is not a whole number of milliseconds; durations are counted in milliseconds"
        ));
    }
    Ok(Duration::from_millis((total / SCALE) as u64))
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
        assert_eq!(
            parse_duration("30d").unwrap(),
            Duration::from_secs(30 * 86_400)
        );
    }

    #[test]
    fn accepts_decimal_fractions_with_a_unit() {
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("0.25h").unwrap(), Duration::from_secs(900));
        assert_eq!(parse_duration(".5s").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2.s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1h0.5m").unwrap(), Duration::from_secs(3630));
        assert_eq!(parse_duration("2.5ms").unwrap_err(), "\"2.5ms\" is not a whole number of milliseconds; durations are counted in milliseconds");
        assert_eq!(parse_ttl("1.5s").unwrap().as_millis(), 1500);
        // A unit-less number is refused as such, with the likely meaning.
        let err = parse_duration("1.5").unwrap_err();
        assert!(
            err.contains("has no unit (did you mean 1.5s or 1.5ms?)"),
            "{err}"
        );
        let err = parse_duration("1m30").unwrap_err();
        assert!(err.contains("the number \"30\" has no unit"), "{err}");
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
            "1.2.3s",
            ".s",
            "0.0001ms",
            "1.1234567s",
            "5w",
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
