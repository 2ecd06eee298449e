//! Who may use a TCP listener of the management API. Every request must carry the bearer
//! token; its Host must name the listener (its address, `localhost` for a loopback listener,
//! or a name the configuration allows), so that a DNS name rebound to this host by a web page
//! is refused; and a browser's request from another origin is refused. The unix socket needs
//! none of this: only its owner can open it.
//!
//! A browser shows the token once, in the dashboard's login form (`POST /ui/login`), and gets a
//! session cookie for it: random, `HttpOnly` (no script reads it), `SameSite=Strict` (no other
//! site's page sends it), valid [`SESSION_LIFETIME`] or until `POST /ui/logout`. A request
//! without the token or a live session is refused: 401 with the login form for a page, 401
//! JSON for the API.

use std::collections::HashMap;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, COOKIE, HOST, LOCATION, ORIGIN, SET_COOKIE};
use axum::http::Method;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tracing::{info, warn};

use crate::error::{code, ApiError};
use crate::origin::Origin;

/// The file in the state directory that holds the token the daemon made for itself.
pub const TOKEN_FILE: &str = "api-token";
/// The file in the state directory that holds the token a scraper reads `GET /metrics` with,
/// and nothing else: a monitoring host that holds it cannot change the SAN.
pub const SCRAPE_TOKEN_FILE: &str = "metrics-token";
/// The file in the state directory that holds the token that reads everything the API and
/// the dashboard show and changes nothing: for whoever watches the SAN but runs it not.
pub const VIEWER_TOKEN_FILE: &str = "viewer-token";

/// How long a dashboard login lasts.
pub const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// Logins kept at once; the oldest goes first.
const MAX_SESSIONS: usize = 64;
const SESSION_COOKIE: &str = "tessera_session";
/// The header the dashboard's API requests carry the session's key in.
const SESSION_KEY_HEADER: &str = "x-tessera-key";
/// How long a request with a wrong token waits for its refusal: with the connections a
/// source may hold (api/listener.rs), a guesser gets about 130 tries a second.
const WRONG_TOKEN_DELAY: Duration = Duration::from_millis(250);
/// Wrong tokens are logged once in this long, with how many came: a guesser cannot fill the
/// log.
const WRONG_TOKEN_WARN_EVERY: Duration = Duration::from_secs(10);

/// What a token or a session lets its holder do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Everything: the API token.
    Full,
    /// Every read (GET, HEAD), no change: the viewer token.
    Read,
    /// `GET /metrics` only: the metrics token.
    Scrape,
}

impl Access {
    /// Whether this access admits `method` on `path`.
    fn admits(self, method: &Method, path: &str) -> bool {
        match self {
            Access::Full => true,
            Access::Read => method == Method::GET || method == Method::HEAD,
            Access::Scrape => method == Method::GET && path == "/metrics",
        }
    }
}

/// A dashboard login.
#[derive(Debug, Clone)]
pub struct Session {
    made: Instant,
    /// Given only to the page that logged in; its API requests show it.
    key: String,
    access: Access,
}

/// What a TCP listener checks.
pub struct Guard {
    pub token: String,
    /// The listener's bound address.
    pub listen: SocketAddr,
    /// Other names the API may be reached by (api_allowed_hosts), lowercase.
    pub names: Vec<String>,
    /// Origins of a proxy in front of the listener (api_public_origins), as browsers write
    /// them: a page served through it may use the API.
    pub public_origins: Vec<String>,
    /// Dashboard logins: session id (the cookie) → when it was made, and the key that only
    /// the page that logged in was given.
    pub sessions: Mutex<HashMap<String, Session>>,
    /// Whether this listener serves the dashboard (and its login); not `metrics_listen`.
    pub dashboard: bool,
    /// A bearer token that admits `GET /metrics` only.
    pub scrape_token: Option<String>,
    /// A bearer token (and dashboard login) that admits reads only: GET and HEAD.
    pub viewer_token: Option<String>,
    /// Wrong tokens since the last warning, and when that was.
    wrong_tokens: Mutex<(u64, Option<Instant>)>,
}

impl Guard {
    pub fn new(token: String, listen: SocketAddr, names: Vec<String>) -> Guard {
        Guard {
            token,
            listen,
            names,
            public_origins: Vec::new(),
            sessions: Mutex::new(HashMap::new()),
            dashboard: true,
            scrape_token: None,
            viewer_token: None,
            wrong_tokens: Mutex::new((0, None)),
        }
    }

    /// Also admits `GET /metrics` with `token`, and nothing else with it.
    pub fn with_scrape_token(mut self, token: String) -> Guard {
        self.scrape_token = Some(token);
        self
    }

    /// Also admits browser requests from these origins (a TLS proxy's, api_public_origins).
    pub fn with_public_origins(mut self, origins: Vec<String>) -> Guard {
        self.public_origins = origins;
        self
    }

    /// Also admits reads (GET, HEAD), and nothing else, with `token`, and dashboard logins
    /// with it that read only.
    pub fn with_viewer_token(mut self, token: String) -> Guard {
        self.viewer_token = Some(token);
        self
    }

    /// What a bearer token (or a login form's) admits, if anything.
    fn access_of(&self, token: &str) -> Option<Access> {
        let is = |t: &Option<String>| {
            t.as_ref()
                .is_some_and(|t| constant_time_eq(token.as_bytes(), t.as_bytes()))
        };
        if constant_time_eq(token.as_bytes(), self.token.as_bytes()) {
            Some(Access::Full)
        } else if is(&self.viewer_token) {
            Some(Access::Read)
        } else if is(&self.scrape_token) {
            Some(Access::Scrape)
        } else {
            None
        }
    }

    /// For a listener that serves no pages: the bearer token only.
    pub fn without_dashboard(mut self) -> Guard {
        self.dashboard = false;
        self
    }

    /// Counts a wrong token (`how`: a bearer token, a login) and warns of those counted at
    /// most once per [`WRONG_TOKEN_WARN_EVERY`]; true when it warned.
    fn wrong_token(&self, how: &str) -> bool {
        let mut w = self.wrong_tokens.lock();
        w.0 += 1;
        if w.1.is_some_and(|at| at.elapsed() < WRONG_TOKEN_WARN_EVERY) {
            return false;
        }
        warn!(listener = %self.listen, last = how, refused = w.0, "API requests refused: wrong token");
        *w = (0, Some(Instant::now()));
        true
    }

    /// The live session `id`, if there is one.
    fn session(&self, id: &str) -> Option<Session> {
        let mut s = self.sessions.lock();
        s.retain(|_, v| v.made.elapsed() < SESSION_LIFETIME);
        // Compared in constant time, as the token is.
        s.iter()
            .find(|(k, _)| constant_time_eq(k.as_bytes(), id.as_bytes()))
            .map(|(_, v)| v.clone())
    }

    /// A new session with `access`: its id (the cookie) and its key (for the page's API
    /// requests).
    fn new_session(&self, access: Access) -> Result<(String, String), String> {
        let (id, key) = (random_hex(32)?, random_hex(32)?);
        let mut s = self.sessions.lock();
        if s.len() >= MAX_SESSIONS {
            if let Some(oldest) = s.iter().min_by_key(|(_, v)| v.made).map(|(k, _)| k.clone()) {
                s.remove(&oldest);
            }
        }
        s.insert(
            id.clone(),
            Session {
                made: Instant::now(),
                key: key.clone(),
                access,
            },
        );
        Ok((id, key))
    }

    /// Whether a browser's `Origin` is this listener: its scheme's port (80, 443) when it
    /// names none, so that a page served on another port of the same host is another origin.
    /// (The session cookie's SameSite ignores ports; this check does not.)
    pub fn origin_allowed(&self, origin: &str) -> bool {
        let Some(origin) = Origin::parse(origin) else {
            return false;
        };
        if self.public_origins.contains(&origin.to_string()) {
            return true;
        }
        origin.port == self.listen.port() && self.host_allowed(&format!("{}:{}", origin.host, origin.port))
    }

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
        let ok = origin.to_str().is_ok_and(|o| g.origin_allowed(o));
        if !ok {
            return ApiError::new(
                StatusCode::FORBIDDEN,
                code::FORBIDDEN,
                "requests from a web page of another origin are refused".to_string(),
            )
            .into_response();
        }
    }
    let path = req.uri().path().to_string();
    if g.dashboard && req.method() == Method::POST && path == "/ui/login" {
        return login(&g, req).await;
    }
    let given = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let session = session_cookie(headers).filter(|_| g.dashboard);
    let access = match (given, &session) {
        (Some(t), _) => g.access_of(t),
        // The cookie alone admits the dashboard's pages. A browser sends it to every port of
        // this host, so a page served on another port would receive it: the API also wants
        // the session's key, given only to the page that logged in (browsers keep it apart
        // by origin, port included).
        (None, Some(id)) => g
            .session(id)
            .filter(|s| {
                is_page(&path) || session_key_of(&req).is_some_and(|k| constant_time_eq(k.as_bytes(), s.key.as_bytes()))
            })
            .map(|s| s.access),
        (None, None) => None,
    };
    let logout = req.method() == Method::POST && path == "/ui/logout";
    if let Some(access) = access {
        if logout && access != Access::Scrape {
            if let Some(id) = session {
                g.sessions.lock().remove(&id);
            }
            return redirect_home(Some(format!(
                "{SESSION_COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"
            )));
        }
        if access.admits(req.method(), &path) {
            return next.run(req).await;
        }
        if access == Access::Read {
            return ApiError::new(
                StatusCode::FORBIDDEN,
                code::FORBIDDEN,
                "this token (or dashboard login) only reads: changes need the API token".to_string(),
            )
            .into_response();
        }
    }
    if given.is_some() {
        g.wrong_token("bearer");
        tokio::time::sleep(WRONG_TOKEN_DELAY).await;
    }
    if g.dashboard && is_page(&path) {
        return login_page(StatusCode::UNAUTHORIZED, None);
    }
    ApiError::unauthorized().into_response()
}

/// Paths a browser navigates to (the dashboard), as opposed to the API and the metrics.
fn is_page(path: &str) -> bool {
    path == "/" || path.starts_with("/ui/")
}

/// The session key a dashboard request shows: the `x-tessera-key` header, or a `key` query
/// parameter (an EventSource sets no headers).
fn session_key_of(req: &Request) -> Option<String> {
    if let Some(k) = req.headers().get(SESSION_KEY_HEADER).and_then(|v| v.to_str().ok()) {
        return Some(k.to_string());
    }
    req.uri()
        .query()?
        .split('&')
        .find_map(|kv| kv.strip_prefix("key="))
        .map(str::to_string)
}

fn session_cookie(headers: &axum::http::HeaderMap) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| {
            c.trim()
                .strip_prefix(SESSION_COOKIE)?
                .strip_prefix('=')
                .map(str::to_string)
        })
        .filter(|v| !v.is_empty())
}

/// `POST /ui/login` with the form's `token`: a session cookie and the way home, or the form
/// again with why.
async fn login(g: &Guard, req: Request) -> Response {
    let body = match axum::body::to_bytes(req.into_body(), 8192).await {
        Ok(b) => b,
        Err(_) => return login_page(StatusCode::PAYLOAD_TOO_LARGE, Some("The form was too large.")),
    };
    let token = form_value(&String::from_utf8_lossy(&body), "token").unwrap_or_default();
    // The API token logs in for everything, the viewer token to read only; the metrics
    // token does not log in.
    let Some(access) = g.access_of(token.trim()).filter(|a| *a != Access::Scrape) else {
        g.wrong_token("dashboard login");
        // A guesser waits for each answer (the token itself is far beyond guessing).
        tokio::time::sleep(WRONG_TOKEN_DELAY.max(Duration::from_millis(500))).await;
        return login_page(StatusCode::UNAUTHORIZED, Some("That is not the API token."));
    };
    match g.new_session(access) {
        // The key goes in the address's fragment, which the page reads and no request carries.
        Ok((id, key)) => redirect(
            &format!("/#key={key}"),
            Some(format!(
                "{SESSION_COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
                SESSION_LIFETIME.as_secs()
            )),
        ),
        Err(e) => ApiError::io(e).into_response(),
    }
}

fn redirect_home(cookie: Option<String>) -> Response {
    redirect("/", cookie)
}

fn redirect(to: &str, cookie: Option<String>) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    if let Ok(to) = axum::http::HeaderValue::from_str(to) {
        r.headers_mut().insert(LOCATION, to);
    }
    if let Some(c) = cookie.and_then(|c| axum::http::HeaderValue::from_str(&c).ok()) {
        r.headers_mut().insert(SET_COOKIE, c);
    }
    r
}

/// The login form: all a page shows without the token.
pub fn login_page(status: StatusCode, problem: Option<&str>) -> Response {
    let problem = problem
        .map(|p| format!("<p class=\"problem\" id=\"problem\">{p}</p>"))
        .unwrap_or_default();
    let html = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Tessera: log in</title>\
         <meta name=\"viewport\" content=\"width=device-width\"></head>\
         <body>\
         <h1>Tessera</h1><p>Give the API token: the one in the daemon's configuration, or \
         <code>&lt;state dir&gt;/api-token</code>.</p>{problem}\
         <form method=\"post\" action=\"/ui/login\"><input type=\"password\" name=\"token\" id=\"token\" \
         autocomplete=\"current-password\" size=\"40\" autofocus> <button type=\"submit\" id=\"login\">Log in</button></form>\
         </body></html>"
    );
    let mut r = (status, html).into_response();
    r.headers_mut().insert(
        CONTENT_TYPE,
        axum::http::HeaderValue::from_static("text/html; charset=utf-8"),
    );
    crate::api::dashboard::secure_page_headers(r.headers_mut());
    r
}

/// The value of `key` in a urlencoded form.
fn form_value(form: &str, key: &str) -> Option<String> {
    form.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == key).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'+', _, _) => out.push(b' '),
            (b'%', Some(h), Some(l)) => {
                out.push(h << 4 | l);
                i += 2;
            }
            (c, _, _) => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn random_hex(n: usize) -> Result<String, String> {
    let mut raw = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut raw))
        .map_err(|e| format!("cannot read /dev/urandom: {e}"))?;
    Ok(raw.iter().map(|b| format!("{b:02x}")).collect())
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

pub fn scrape_token_path(state_dir: &Path) -> PathBuf {
    state_dir.join(SCRAPE_TOKEN_FILE)
}

/// The API token in the state directory, made (random, owner-only) at the first start. A
/// token file that others could read is made owner-only again, with a warning.
pub fn load_or_create_token(state_dir: &Path) -> Result<String, String> {
    load_or_create(&token_path(state_dir), "API token")
}

/// The viewer token's file in the state directory.
pub fn viewer_token_path(state_dir: &Path) -> PathBuf {
    state_dir.join(VIEWER_TOKEN_FILE)
}

/// The viewer token in the state directory, made as the API token is.
pub fn load_or_create_viewer_token(state_dir: &Path) -> Result<String, String> {
    load_or_create(&viewer_token_path(state_dir), "viewer token")
}

/// The scrape token in the state directory, made as the API token is.
pub fn load_or_create_scrape_token(state_dir: &Path) -> Result<String, String> {
    load_or_create(&scrape_token_path(state_dir), "metrics token")
}

fn load_or_create(path: &Path, what: &str) -> Result<String, String> {
    let path = path.to_path_buf();
    match std::fs::read_to_string(&path) {
        Ok(t) => {
            let meta = std::fs::metadata(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            if meta.permissions().mode() & 0o077 != 0 {
                warn!(path = %path.display(), "the {what} file was readable by others; it is owner-only now, but the token should be replaced (delete the file and restart)");
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
            let token = random_hex(32).map_err(|e| format!("no {what} made: {e}"))?;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
            f.write_all(format!("{token}\n").as_bytes())
                .and_then(|_| f.sync_all())
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            info!(path = %path.display(), "made a {what} for the TCP listeners");
            Ok(token)
        }
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(listen: &str, names: &[&str]) -> Guard {
        Guard::new(
            "t".repeat(32),
            listen.parse().unwrap(),
            names.iter().map(|s| s.to_string()).collect(),
        )
    }

    #[test]
    fn each_token_admits_what_it_is_for() {
        let g = guard("127.0.0.1:8484", &[])
            .with_scrape_token("s".repeat(32))
            .with_viewer_token("v".repeat(32));
        assert_eq!(g.access_of(&"t".repeat(32)), Some(Access::Full));
        assert_eq!(g.access_of(&"v".repeat(32)), Some(Access::Read));
        assert_eq!(g.access_of(&"s".repeat(32)), Some(Access::Scrape));
        assert_eq!(g.access_of(&"x".repeat(32)), None);
        assert_eq!(g.access_of(""), None);
        let (get, head, post, delete) = (Method::GET, Method::HEAD, Method::POST, Method::DELETE);
        assert!(Access::Full.admits(&delete, "/api/pools/p"));
        assert!(Access::Read.admits(&get, "/api/pools") && Access::Read.admits(&head, "/"));
        assert!(!Access::Read.admits(&post, "/api/pools") && !Access::Read.admits(&delete, "/api/pools/p"));
        assert!(!Access::Read.admits(&Method::PUT, "/api/replicas/r"));
        assert!(Access::Scrape.admits(&get, "/metrics"));
        assert!(!Access::Scrape.admits(&get, "/api/pools") && !Access::Scrape.admits(&post, "/metrics"));
        // Without a viewer token configured, nothing reads with a made-up one.
        assert_eq!(guard("127.0.0.1:8484", &[]).access_of(&"v".repeat(32)), None);
    }

    #[test]
    fn wrong_tokens_are_told_at_most_once_in_a_while() {
        let g = guard("127.0.0.1:8484", &[]);
        assert!(g.wrong_token("bearer"), "the first is told");
        for _ in 0..1000 {
            assert!(!g.wrong_token("bearer"), "the next ones are counted");
        }
        assert_eq!(g.wrong_tokens.lock().0, 1000);
        g.wrong_tokens.lock().1 = Some(Instant::now() - WRONG_TOKEN_WARN_EVERY);
        assert!(g.wrong_token("dashboard login"), "told again once its time came");
        assert_eq!(g.wrong_tokens.lock().0, 0);
    }

    #[test]
    fn a_proxys_origin_is_admitted_when_configured() {
        let g = guard("127.0.0.1:8484", &[]);
        assert!(!g.origin_allowed("https://san.example"));
        let g = g.with_public_origins(vec!["https://san.example".into(), "https://san.example:8443".into()]);
        assert!(g.origin_allowed("https://san.example"));
        assert!(g.origin_allowed("HTTPS://SAN.example"));
        assert!(g.origin_allowed("https://san.example:8443"));
        for bad in [
            "http://san.example",
            "https://san.example:444",
            "https://san.example.evil",
            "https://evil.example",
        ] {
            assert!(!g.origin_allowed(bad), "{bad}");
        }
    }

    #[test]
    fn origins_must_name_the_listener_and_its_port() {
        let g = guard("127.0.0.1:8484", &["san.example"]);
        assert!(g.origin_allowed("http://127.0.0.1:8484"));
        assert!(g.origin_allowed("http://localhost:8484"));
        assert!(g.origin_allowed("http://san.example:8484"));
        for bad in [
            "http://localhost",
            "http://127.0.0.1",
            "https://127.0.0.1",
            "http://localhost:80",
            "http://evil.example:8484",
            "null",
            "file://",
        ] {
            assert!(!g.origin_allowed(bad), "{bad}");
        }
        let on80 = guard("127.0.0.1:80", &[]);
        assert!(on80.origin_allowed("http://127.0.0.1"));
        assert!(!on80.origin_allowed("https://127.0.0.1"));
    }

    #[test]
    fn forms_and_sessions() {
        assert_eq!(form_value("a=1&token=ab%2Bc+d%zz", "token").unwrap(), "ab+c d%zz");
        assert_eq!(form_value("token=x%4", "token").unwrap(), "x%4");
        assert_eq!(form_value("nothing", "token"), None);
        let g = guard("127.0.0.1:8484", &[]);
        let (id, key) = g.new_session(Access::Full).unwrap();
        assert_eq!((id.len(), key.len()), (64, 64));
        assert_ne!(id, key);
        assert_eq!(g.session(&id).map(|s| (s.key, s.access)), Some((key, Access::Full)));
        assert!(g.session("0000").is_none());
        for _ in 0..MAX_SESSIONS {
            g.new_session(Access::Read).unwrap();
        }
        assert!(g.session(&id).is_none(), "the oldest goes first");
        assert_eq!(g.sessions.lock().len(), MAX_SESSIONS);
        let mut h = axum::http::HeaderMap::new();
        h.insert(COOKIE, "a=b; tessera_session=abc".parse().unwrap());
        assert_eq!(session_cookie(&h).as_deref(), Some("abc"));
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
