//! Sizes and durations as administrators type them (`16G`, `256K`, `1.5T`, `4096`; `30s`, `5m`,
//! `2h`) and as they read them.

use std::time::Duration;

/// Parses a byte count with an optional binary suffix K, M, G, T or P (KiB, MiB, ... also
/// accepted, and a trailing `B`). Fractions are allowed with a suffix (`1.5G`).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let bad = || format!("'{s}' is not a size: write a number of bytes with an optional K, M, G or T suffix, e.g. 16G");
    if t.is_empty() {
        return Err(bad());
    }
    let upper = t.to_ascii_uppercase();
    let body = upper
        .strip_suffix("IB")
        .or_else(|| upper.strip_suffix('B'))
        .unwrap_or(&upper);
    let (num, shift) = match body.chars().last() {
        Some('K') => (&body[..body.len() - 1], 10),
        Some('M') => (&body[..body.len() - 1], 20),
        Some('G') => (&body[..body.len() - 1], 30),
        Some('T') => (&body[..body.len() - 1], 40),
        Some('P') => (&body[..body.len() - 1], 50),
        _ => (body, 0),
    };
    let num = num.trim();
    if num.is_empty() || num.starts_with(['-', '+']) {
        return Err(bad());
    }
    if let Ok(n) = num.parse::<u64>() {
        return n
            .checked_mul(1u64 << shift)
            .ok_or_else(|| format!("'{s}' is too large"));
    }
    if shift == 0 {
        return Err(bad());
    }
    let f: f64 = num.parse().map_err(|_| bad())?;
    if !f.is_finite() || f < 0.0 {
        return Err(bad());
    }
    let v = f * (1u64 << shift) as f64;
    if v >= u64::MAX as f64 {
        return Err(format!("'{s}' is too large"));
    }
    Ok(v.round() as u64)
}

/// A byte count for humans: `16.0 GiB`, `512 B`.
pub fn format_size(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// The longest duration a setting takes: ten years. Schedules add it to clocks counted in
/// seconds since 1970, which a longer one would overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(3650 * 86_400);

/// Parses a duration: a whole number with a unit s, m, h or d (`90s`, `5m`, `2h`, `1d`); a
/// bare number is seconds. At most [`MAX_DURATION`].
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let bad = || format!("'{s}' is not a duration: write a whole number with s, m, h or d, e.g. 5m");
    let (num, unit) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&t[..i], c.to_ascii_lowercase()),
        Some(_) => (t, 's'),
        None => return Err(bad()),
    };
    let n: u64 = num.trim().parse().map_err(|_| bad())?;
    let secs = match unit {
        's' => Some(n),
        'm' => n.checked_mul(60),
        'h' => n.checked_mul(3600),
        'd' => n.checked_mul(86_400),
        _ => return Err(bad()),
    };
    secs.map(Duration::from_secs)
        .filter(|d| *d <= MAX_DURATION)
        .ok_or_else(|| format!("'{s}' is too long: at most 3650d"))
}

/// A duration for humans: `45 s`, `5 min`, `2 h 30 min`.
pub fn format_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s} s"),
        60..3600 if s % 60 == 0 => format!("{} min", s / 60),
        60..3600 => format!("{} min {} s", s / 60, s % 60),
        _ if s % 3600 == 0 => format!("{} h", s / 3600),
        _ => format!("{} h {} min", s / 3600, s % 3600 / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration(" 2H "), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        for bad in ["", "m", "5x", "-5m", "1.5h", "five minutes"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert!(parse_duration("99999999999999999d").unwrap_err().contains("too long"));
        assert_eq!(parse_duration("3650d"), Ok(MAX_DURATION));
        assert!(parse_duration("3651d").unwrap_err().contains("too long"));
        assert!(parse_duration("18446744073709551615").unwrap_err().contains("too long"));
        assert_eq!(format_duration(Duration::from_secs(45)), "45 s");
        assert_eq!(format_duration(Duration::from_secs(300)), "5 min");
        assert_eq!(format_duration(Duration::from_secs(150)), "2 min 30 s");
        assert_eq!(format_duration(Duration::from_secs(9000)), "2 h 30 min");
    }

    #[test]
    fn parses_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("16G"), Ok(16 << 30));
        assert_eq!(parse_size("16g"), Ok(16 << 30));
        assert_eq!(parse_size("256KiB"), Ok(256 << 10));
        assert_eq!(parse_size("1MB"), Ok(1 << 20));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("2T"), Ok(2 << 40));
        assert_eq!(parse_size(" 8M "), Ok(8 << 20));
    }

    #[test]
    fn refuses_nonsense() {
        for s in ["", "G", "-1G", "1X", "abc", "1.5", "1e3", "NaNG", "99999999999P", "+5"] {
            assert!(parse_size(s).is_err(), "{s} was accepted");
        }
        assert!(parse_size("1Q").unwrap_err().contains("not a size"));
    }

    #[test]
    fn formats() {
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(16 << 30), "16.0 GiB");
        assert_eq!(format_size(1536 << 20), "1.5 GiB");
    }
}
