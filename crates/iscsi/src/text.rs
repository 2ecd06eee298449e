//! Text key=value pairs, NUL-separated, as login and text PDUs carry them.

/// Parses `key=value\0...`. Malformed pairs (no `=`, empty key) are an error.
pub fn parse(data: &[u8]) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for part in data.split(|&b| b == 0) {
        if part.is_empty() {
            continue;
        }
        let s = std::str::from_utf8(part).map_err(|_| "text key is not UTF-8".to_string())?;
        let (k, v) = s.split_once('=').ok_or_else(|| format!("text pair '{s}' has no '='"))?;
        if k.is_empty() || k.len() > 63 {
            return Err(format!("bad text key '{k}'"));
        }
        out.push((k.to_string(), v.to_string()));
    }
    Ok(out)
}

pub fn encode(pairs: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(b'=');
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_encode() {
        let p = parse(b"A=1\0B=x=y\0\0").unwrap();
        assert_eq!(p, vec![("A".into(), "1".into()), ("B".into(), "x=y".into())]);
        assert_eq!(encode(&p), b"A=1\0B=x=y\0");
        assert!(parse(b"novalue\0").is_err());
        assert!(parse(b"=v\0").is_err());
        assert!(parse(&[0xFF, b'=', b'1']).is_err());
    }
}
