//! Human output: aligned tables and `key: value` blocks. `--json` bypasses all of it.

use tessera_server::units::format_size;

/// Prints rows under headers, each column as wide as its widest cell.
pub fn table(headers: &[&str], rows: Vec<Vec<String>>) {
    if rows.is_empty() {
        println!("(none)");
        return;
    }
    let mut w: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let s: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<width$}", width = w[i]))
            .collect();
        println!("{}", s.join("  ").trim_end());
    };
    line(headers.iter().map(|h| h.to_string()).collect());
    for r in rows {
        line(r);
    }
}

pub fn kv(pairs: &[(&str, String)]) {
    let w = pairs.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, v) in pairs {
        println!("{:<w$}  {v}", format!("{k}:"), w = w + 1);
    }
}

/// A value the daemon may leave out, or "-".
pub fn opt<T: std::fmt::Display>(v: &Option<T>) -> String {
    v.as_ref().map(|v| v.to_string()).unwrap_or_else(|| "-".into())
}

pub fn size(bytes: u64) -> String {
    format_size(bytes)
}

pub fn opt_size(bytes: Option<u64>) -> String {
    bytes.map(format_size).unwrap_or_else(|| "-".into())
}

pub fn percent(done: u64, total: u64) -> String {
    if total == 0 {
        "-".into()
    } else {
        format!("{:.0}%", done as f64 * 100.0 / total as f64)
    }
}

/// Seconds since the Unix epoch as a UTC date and time.
pub fn when(t: u64) -> String {
    match t {
        0 => "-".into(),
        t => utc(t),
    }
}

fn utc(t: u64) -> String {
    let (days, secs) = (t / 86_400, t % 86_400);
    // Days to a civil date (Howard Hinnant's algorithm), for the proleptic Gregorian calendar.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_dates() {
        assert_eq!(super::utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(super::utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(super::utc(1_795_359_845), "2026-11-22 15:04:05 UTC");
    }
}
