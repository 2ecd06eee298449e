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

/// Text that comes in several PDUs (the C bit set on all but the last), gathered until it is
/// whole, with a bound on all of it together: what a login may send before anyone knows who
/// is sending it.
#[derive(Debug)]
pub struct Accumulator {
    buf: Vec<u8>,
    /// Bytes taken so far, over every piece.
    total: usize,
    limit: usize,
}

impl Accumulator {
    pub fn new(limit: usize) -> Accumulator {
        Accumulator {
            buf: Vec::new(),
            total: 0,
            limit,
        }
    }

    /// Takes one PDU's text. `Ok(None)`: more follows (`cont`); `Ok(Some(pairs))`: the text is
    /// whole, parsed. Err: past the bound, or malformed.
    pub fn push(&mut self, data: &[u8], cont: bool) -> Result<Option<Vec<(String, String)>>, String> {
        if self.total + data.len() > self.limit {
            return Err(format!("more than {} bytes of text", self.limit));
        }
        self.total += data.len();
        self.buf.extend_from_slice(data);
        if cont {
            return Ok(None);
        }
        parse(&std::mem::take(&mut self.buf)).map(Some)
    }

    /// Bytes held, waiting for the rest of the text.
    pub fn held(&self) -> usize {
        self.buf.len()
    }
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

    #[test]
    fn accumulated_text_is_bounded_over_all_its_pieces() {
        let mut a = Accumulator::new(10);
        assert_eq!(a.push(b"A=", true).unwrap(), None);
        assert_eq!(a.push(b"1\0", false).unwrap().unwrap(), vec![("A".into(), "1".into())]);
        assert_eq!(a.held(), 0);
        assert!(a.push(b"B=22", true).unwrap().is_none());
        assert!(a.push(b"345", true).is_err(), "11 bytes in all: past the bound");
    }
}
