//! Who may use a TCP listener of the management API. Every request must carry the bearer
//! token; its Host must name the listener (its address, `localhost` for a loopback listener,
//! or a name the configuration allows), so that a DNS name rebound to this host by a web page
//! is refused; and a browser's request from another origin is refused. The unix socket needs
//! none of this: only its owner can open it.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, HOST, ORIGIN};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tracing::{info, warn};

use crate::error::{code, ApiError};

/// The file in the state directory that holds the token the daemon made for itself.
pub const TOKEN_FILE: &str = "api-token";

/// What a TCP listener checks.
pub struct Guard {
    pub token: String,
    /// The listener's bound address.
    pub listen: SocketAddr,
    /// Other names the API may be reached by (api_allowed_hosts), lowercase.
    pub names: Vec<String>,
}

impl Guard {
    /// Whether `host` (a Host header or an Origin's authority: `name[:port]`, `[v6]:port`)
    /// names this listener.
    pub fn host_allowed(&self, host: &str) -> bool {
        let (name, port) = split_host_port(host);
        if port.is_some_and(|p| p != self.listen.port()) {
            return false;
        }
        let name = name.to_ascii_lowercase();
        if let Ok(ip) = name.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
            // An address cannot be rebound. Any of the host's addresses when listening on all.
            return self.listen.ip().is_unspecified() || ip == self.listen.ip();
        }
        (name == "localhost" && self.listen.ip().is_loopback()) || self.names.iter().any(|n| *n == name)
    }
}

fn split_host_port(s: &str) -> (&str, Option<u16>) {
    if let Some(rest) = s.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((ip, tail)) => (
                &s[..ip.len() + 2],
                tail.strip_prefix(':')
                    .and_then(|p| p.parse().ok())
                    .or(if tail.is_empty() { None } else { Some(0) }),
            ),
            None => (s, None),
        };
    }
    match s.rsplit_once(':') {
        Some((h, p)) => (h, Some(p.parse().unwrap_or(0))),
        None => (s, None),
    }
}

pub async fn check(State(g): State<Arc<Guard>>, req: Request, next: Next) -> Response {
    let headers = req.headers();
    let host = headers.get(HOST).and_then(|v| v.to_str().ok());
    if !host.is_some_and(|h| g.host_allowed(h)) {
        return ApiError::new(
            StatusCode::MISDIRECTED_REQUEST,
            code::FORBIDDEN,
            format!(
                "this listener answers to {} only, not to Host '{}'; add the name to api_allowed_hosts to use it",
                g.listen,
                host.unwrap_or("")
            ),
        )
        .into_response();
    }
    if let Some(origin) = headers.get(ORIGIN) {
        let ok = origin
            .to_str()
            .ok()
            .and_then(|o| o.strip_prefix("http://").or_else(|| o.strip_prefix("https://")))
            .is_some_and(|authority| g.host_allowed(authority));
        if !ok {
            return ApiError::new(
                StatusCode::FORBIDDEN,
                code::FORBIDDEN,
                "requests from a web page of another origin are refused".to_string(),
            )
            .into_response();
        }
    }
    let given = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match given {
        Some(t) if constant_time_eq(t.as_bytes(), g.token.as_bytes()) => next.run(req).await,
        _ => ApiError::unauthorized().into_response(),
    }
}

/// Compares without an early exit, so that timing does not tell how much of a guess was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub fn token_path(state_dir: &Path) -> PathBuf {
    state_dir.join(TOKEN_FILE)
}

/// The token in the state directory, made (random, owner-only) at the first start. A token
/// file that others could read is made owner-only again, with a warning.
pub fn load_or_create_token(state_dir: &Path) -> Result<String, String> {
    let path = token_path(state_dir);
    match std::fs::read_to_string(&path) {
        Ok(t) => {
            let meta = std::fs::metadata(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            if meta.permissions().mode() & 0o077 != 0 {
                warn!(path = %path.display(), "the API token file was readable by others; it is owner-only now, but the token should be replaced (delete the file and restart)");
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                    .map_err(|e| format!("cannot restrict {}: {e}", path.display()))?;
            }
            let t = t.trim().to_string();
            if t.len() < 16 {
                return Err(format!(
                    "{} holds no usable token (fewer than 16 characters); delete it to have a new one made",
                    path.display()
                ));
            }
            Ok(t)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut raw = [0u8; 32];
            std::fs::File::open("/dev/urandom")
                .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut raw))
                .map_err(|e| format!("cannot read /dev/urandom for the API token: {e}"))?;
            let token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
            f.write_all(format!("{token}\n").as_bytes())
                .and_then(|_| f.sync_all())
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            info!(path = %path.display(), "made an API token for the TCP listener");
            Ok(token)
        }
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(listen: &str, names: &[&str]) -> Guard {
        Guard {
            token: "t".repeat(32),
            listen: listen.parse().unwrap(),
            names: names.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn hosts_that_name_the_listener() {
        let g = guard("127.0.0.1:8484", &["san.example"]);
        for ok in [
            "127.0.0.1:8484",
            "127.0.0.1",
            "localhost:8484",
            "LOCALHOST",
            "san.example:8484",
        ] {
            assert!(g.host_allowed(ok), "{ok}");
        }
        for bad in [
            "127.0.0.1:9999",
            "10.0.0.1:8484",
            "evil.example:8484",
            "127.0.0.1.evil.example",
            "localhost:x",
            "",
        ] {
            assert!(!g.host_allowed(bad), "{bad}");
        }
        let any = guard("0.0.0.0:8484", &[]);
        assert!(any.host_allowed("192.0.2.7:8484"));
        assert!(!any.host_allowed("localhost:8484"), "not loopback");
        assert!(!any.host_allowed("rebound.example:8484"));
        let v6 = guard("[::1]:8484", &[]);
        assert!(v6.host_allowed("[::1]:8484"));
        assert!(v6.host_allowed("[::1]"));
        assert!(!v6.host_allowed("[::2]:8484"));
    }

    #[test]
    fn token_comparison() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }

    #[test]
    fn the_token_file_is_made_owner_only_and_read_back() {
        let d = tempfile::tempdir().unwrap();
        let t = load_or_create_token(d.path()).unwrap();
        assert_eq!(t.len(), 64);
        let mode = std::fs::metadata(token_path(d.path())).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(load_or_create_token(d.path()).unwrap(), t);
        std::fs::set_permissions(token_path(d.path()), std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(load_or_create_token(d.path()).unwrap(), t);
        let mode = std::fs::metadata(token_path(d.path())).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "tightened");
    }
}
