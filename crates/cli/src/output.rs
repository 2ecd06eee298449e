//! Human output: aligned tables and `key: value` blocks. `--json` bypasses all of it.

use serde_json::Value;
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

pub fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        v => v.to_string(),
    }
}

pub fn size(v: &Value) -> String {
    v.as_u64().map(format_size).unwrap_or_else(|| "-".into())
}

pub fn percent(done: u64, total: u64) -> String {
    if total == 0 {
        "-".into()
    } else {
        format!("{:.0}%", done as f64 * 100.0 / total as f64)
    }
}
