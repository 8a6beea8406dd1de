//! The few time formats the guard reads and writes, without a date crate:
//! RFC 3339 instants (the agent's `expires`) and short durations ("10m").

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Parse an RFC 3339 date-time (`2026-11-30T00:53:20.5Z`, `...+08:00`).
pub fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    let num = |from: usize, len: usize| -> Option<i64> {
        let digits = b.get(from..from + len)?;
        if !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(digits).ok()?.parse().ok()
    };
    let sep = |at: usize, c: &[u8]| b.get(at).is_some_and(|x| c.contains(x));
    if !(sep(4, b"-") && sep(7, b"-") && sep(10, b"Tt ") && sep(13, b":") && sep(16, b":")) {
        return None;
    }
    let (year, month, day) = (num(0, 4)?, num(5, 2)?, num(8, 2)?);
    let (hour, min, sec) = (num(11, 2)?, num(14, 2)?, num(17, 2)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || min > 59 || sec > 60 {
        return None;
    }
    let mut i = 19;
    let mut nanos: u32 = 0;
    if sep(i, b".") {
        i += 1;
        let start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            if i - start < 9 {
                nanos = nanos * 10 + u32::from(b.get(i).copied().unwrap_or(b'0') - b'0');
            }
            i += 1;
        }
        if i == start {
            return None;
        }
        for _ in (i - start)..9 {
            nanos = nanos.saturating_mul(10);
        }
    }
    let offset = match b.get(i)? {
        b'Z' | b'z' if i + 1 == b.len() => 0,
        c @ (b'+' | b'-') if i + 6 == b.len() && sep(i + 3, b":") => {
            let (h, m) = (num(i + 1, 2)?, num(i + 4, 2)?);
            if h > 23 || m > 59 {
                return None;
            }
            let off = h * 3600 + m * 60;
            if *c == b'-' {
                -off
            } else {
                off
            }
        }
        _ => return None,
    };
    let secs = days_from_civil(year, month, day) * 86_400 + hour * 3600 + min * 60 + sec - offset;
    let secs = u64::try_from(secs).ok()?;
    UNIX_EPOCH.checked_add(Duration::new(secs, nanos))
}

// Howard Hinnant's civil-to-days algorithm.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Format an instant as RFC 3339 UTC (seconds precision).
pub fn format_rfc3339(t: SystemTime) -> String {
    let (secs, millis) = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (
            i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            d.subsec_millis(),
        ),
        Err(_) => (0, 0),
    };
    podgate_cni::log::format_rfc3339(secs, millis)
}

/// Parse a Go-style duration: `10m`, `1h30m`, `90s`, `500ms`, `0`.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s == "0" {
        return Some(Duration::ZERO);
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return None;
        }
        let n: u64 = rest.get(..digits)?.parse().ok()?;
        rest = rest.get(digits..)?;
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = match rest.get(..unit_len)? {
            "ms" => Duration::from_millis(1),
            "s" => Duration::from_secs(1),
            "m" => Duration::from_secs(60),
            "h" => Duration::from_secs(3600),
            "d" => Duration::from_secs(86_400),
            _ => return None,
        };
        rest = rest.get(unit_len..)?;
        total = total.checked_add(unit.checked_mul(u32::try_from(n).ok()?)?)?;
    }
    (!s.is_empty()).then_some(total)
}

/// Short human form: `4m`, `1h2m`, `3d4h`, `45s`, `250ms`.
pub fn human(d: Duration) -> String {
    let s = d.as_secs();
    let (big, small) = match s {
        0 => return format!("{}ms", d.subsec_millis()),
        1..=59 => return format!("{s}s"),
        60..=3599 => ((s / 60, "m"), (s % 60, "s")),
        3600..=86_399 => ((s / 3600, "h"), (s % 3600 / 60, "m")),
        _ => ((s / 86_400, "d"), (s % 86_400 / 3600, "h")),
    };
    match small {
        (0, _) => format!("{}{}", big.0, big.1),
        (n, unit) => format!("{}{}{n}{unit}", big.0, big.1),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn unix(t: SystemTime) -> f64 {
        t.duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
    }

    #[test]
    fn rfc3339_instants_parse_with_fractions_and_offsets_and_malformed_ones_do_not() {
        assert_eq!(unix(parse_rfc3339("1970-01-01T00:00:00Z").unwrap()), 0.0);
        assert_eq!(
            unix(parse_rfc3339("2026-11-30T00:53:20Z").unwrap()),
            1_796_000_000.0
        );
        assert_eq!(
            unix(parse_rfc3339("2026-11-30T08:53:20.5+08:00").unwrap()),
            1_796_000_000.5
        );
        assert_eq!(
            unix(parse_rfc3339("2000-02-29t00:00:00.000000000-01:30").unwrap()),
            951_787_800.0
        );
        for bad in [
            "",
            "2026-11-30",
            "2026-11-30T00:53:20",
            "2026-13-30T00:53:20Z",
            "2026-11-30T00:53:20.Z",
            "2026-11-30T00:53:20Zjunk",
            "2026-11-30T00:53:20+0800",
            "+026-11-30T00:53:20Z",
            "1969-12-31T23:59:59Z",
            "2026-11-30T00:53:20.1234567890123456789012345Z\u{e9}",
        ] {
            assert!(parse_rfc3339(bad).is_none(), "{bad}");
        }
        // Extra fraction digits beyond nanoseconds are accepted and ignored.
        assert!(parse_rfc3339("2026-11-30T00:53:20.1234567891Z").is_some());
    }

    #[test]
    fn format_round_trips() {
        let t = parse_rfc3339("2026-11-30T00:53:20Z").unwrap();
        assert_eq!(format_rfc3339(t), "2026-11-30T00:53:20.000Z");
    }

    #[test]
    fn a_duration_is_the_sum_of_its_units() {
        assert_eq!(parse_duration("10m"), Some(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_duration("2d"), Some(Duration::from_secs(172_800)));
    }

    #[test]
    fn a_duration_without_a_unit_with_a_fraction_sign_or_overflow_is_refused() {
        for bad in ["", "m", "10", "10x", "1.5h", "-1m", "99999999999h"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_duration_is_shown_in_its_two_largest_units() {
        assert_eq!(human(Duration::from_secs(240)), "4m");
        assert_eq!(human(Duration::from_secs(3720)), "1h2m");
        assert_eq!(human(Duration::from_secs(86_400 * 3 + 3600 * 4)), "3d4h");
        assert_eq!(human(Duration::from_secs(45)), "45s");
        assert_eq!(human(Duration::from_millis(250)), "250ms");
        assert_eq!(human(Duration::from_secs(600)), "10m");
    }
}
