//! A web origin (`scheme://host[:port]`), read one way both where `api_public_origins` is
//! configured and where a browser's `Origin` header is checked against it and against the
//! API listener, so that the two cannot disagree on what names the same origin.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// "http" or "https".
    pub scheme: &'static str,
    /// A name or an address, lowercase; an IPv6 address in brackets.
    pub host: String,
    /// The scheme's own (80, 443) when the origin names none.
    pub port: u16,
}

impl Origin {
    /// An http or https origin: a host and maybe a port, nothing after but one slash (which
    /// a browser never sends and an administrator may write). None for anything else: a
    /// path, a query, user information, a port that is not a number.
    pub fn parse(s: &str) -> Option<Origin> {
        let lower = s.strip_suffix('/').unwrap_or(s).to_ascii_lowercase();
        let (scheme, rest, default_port) = if let Some(r) = lower.strip_prefix("https://") {
            ("https", r, 443)
        } else if let Some(r) = lower.strip_prefix("http://") {
            ("http", r, 80)
        } else {
            return None;
        };
        if rest.is_empty() || rest.contains(['/', '?', '#', '@', ' ']) {
            return None;
        }
        let (host, port) = match rest.rsplit_once(':') {
            Some((h, p)) if !h.is_empty() && (!h.contains(':') || h.ends_with(']')) => (h, p.parse::<u16>().ok()?),
            _ => (rest, default_port),
        };
        if host.is_empty() || (host.contains(':') && !(host.starts_with('[') && host.ends_with(']'))) {
            return None;
        }
        Some(Origin {
            scheme,
            host: host.to_string(),
            port,
        })
    }
}

/// As browsers write it: the port left out when it is the scheme's.
impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let default_port = if self.scheme == "https" { 443 } else { 80 };
        if self.port == default_port {
            write!(f, "{}://{}", self.scheme, self.host)
        } else {
            write!(f, "{}://{}:{}", self.scheme, self.host, self.port)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_read_and_written_as_browsers_write_them() {
        for (given, written) in [
            ("HTTPS://San1.example/", "https://san1.example"),
            ("https://san1.example:443", "https://san1.example"),
            ("https://san1.example:8443", "https://san1.example:8443"),
            ("http://[::1]:80", "http://[::1]"),
            ("http://[::1]:8080", "http://[::1]:8080"),
            ("http://[::1]", "http://[::1]"),
            ("http://10.0.0.5:9000", "http://10.0.0.5:9000"),
        ] {
            assert_eq!(
                Origin::parse(given).map(|o| o.to_string()).as_deref(),
                Some(written),
                "{given}"
            );
        }
        for bad in [
            "san1.example",
            "ftp://san1.example",
            "https://",
            "https://san1.example/path",
            "https://san1.example//",
            "https://user@san1.example",
            "https://san1.example:port",
            "https://san1.example:",
            "https://san1.example:70000",
            "https://::1:8080",
            "https://[::1",
            "https://san1.example?x",
        ] {
            assert_eq!(Origin::parse(bad), None, "{bad}");
        }
    }
}
