//! Units in and out: durations as users type them, nanoseconds and counts as people read them.

use std::time::Duration;

use anyhow::{anyhow, bail, Result};

/// Parses `10s`, `500ms`, `2m`, `1h` or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration> {
    let text = s.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (num, unit) = text.split_at(split);
    let value: f64 = num.parse().map_err(|_| {
        anyhow!("invalid duration {text:?}: expected a number with a unit, like 10s or 500ms")
    })?;
    let secs = match unit {
        "" | "s" => value,
        "ms" => value / 1e3,
        "us" => value / 1e6,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        _ => bail!("invalid duration {text:?}: unknown unit {unit:?} (use ms, s, m or h)"),
    };
    if !secs.is_finite() || secs <= 0.0 {
        bail!("invalid duration {text:?}: must be positive");
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Human units for nanoseconds: `850ns`, `1.25us`, `3.40ms`, `2.10s`.
pub fn fmt_ns(ns: f64) -> String {
    if ns < 1_000.0 {
        format!("{ns:.0}ns")
    } else if ns < 1_000_000.0 {
        format!("{:.2}us", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.2}ms", ns / 1e6)
    } else {
        format!("{:.2}s", ns / 1e9)
    }
}

/// Compact counts: `950`, `12.3k`, `4.56M`.
pub fn fmt_count(n: f64) -> String {
    if n < 10_000.0 {
        format!("{n:.0}")
    } else if n < 1e6 {
        format!("{:.1}k", n / 1e3)
    } else if n < 1e9 {
        format!("{:.2}M", n / 1e6)
    } else {
        format!("{:.2}G", n / 1e9)
    }
}

/// `v` with two significant digits (one decimal below 10) and its unit suffix, in at most 5
/// characters for `v` < 999.5.
fn two_digits(v: f64, unit: &str) -> String {
    if v < 9.95 {
        format!("{v:.1}{unit}")
    } else {
        format!("{v:.0}{unit}")
    }
}

/// Durations in at most 5 characters, unit included (`512ns`, `4.1us`, `131us`, `17ms`,
/// `1.1s`): for labels under narrow bars.
pub fn fmt_ns_short(ns: f64) -> String {
    if ns < 999.5 {
        format!("{ns:.0}ns")
    } else if ns < 999.5e3 {
        two_digits(ns / 1e3, "us")
    } else if ns < 999.5e6 {
        two_digits(ns / 1e6, "ms")
    } else if ns < 999.5e9 {
        two_digits(ns / 1e9, "s")
    } else {
        ">999s".into()
    }
}

/// Counts in at most 5 characters (`950`, `9999`, `315k`, `1.2M`, `47M`, `1.3G`).
pub fn fmt_count_short(n: f64) -> String {
    if n < 9_999.5 {
        format!("{n:.0}")
    } else if n < 999.5e3 {
        two_digits(n / 1e3, "k")
    } else if n < 999.5e6 {
        two_digits(n / 1e6, "M")
    } else if n < 999.5e9 {
        two_digits(n / 1e9, "G")
    } else {
        ">999G".into()
    }
}

/// Relative change from `a` to `b`, as "+12.3%" (or "-" when undefined).
pub fn pct_change(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if a != 0.0 => format!("{:+.1}%", (b - a) / a * 100.0),
        _ => "-".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        for bad in ["", "abc", "10x", "-1s", "0s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn changes() {
        assert_eq!(pct_change(Some(100.0), Some(112.3)), "+12.3%");
        assert_eq!(pct_change(Some(100.0), Some(50.0)), "-50.0%");
        assert_eq!(pct_change(Some(0.0), Some(5.0)), "-");
        assert_eq!(pct_change(None, Some(5.0)), "-");
    }

    #[test]
    fn human_units() {
        assert_eq!(fmt_ns(850.0), "850ns");
        assert_eq!(fmt_ns(1250.0), "1.25us");
        assert_eq!(fmt_ns(3.4e6), "3.40ms");
        assert_eq!(fmt_ns(2.1e9), "2.10s");
        assert_eq!(fmt_count(950.0), "950");
        assert_eq!(fmt_count(12_345.0), "12.3k");
        assert_eq!(fmt_count(4_560_000.0), "4.56M");
    }
}
