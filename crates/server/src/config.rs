//! The daemon's configuration: a TOML file, overridden by command-line flags.
//!
//! ```toml
//! state_dir = "/var/lib/tessera"
//! api_listen = "127.0.0.1:8484"   # "" disables the TCP listener; the unix socket stays
//! api_token_file = "/etc/tessera/api-token"  # default: <state_dir>/api-token, made at first start
//! api_allowed_hosts = ["san1.example.com"]  # names the TCP API may be reached by
//! api_public_origins = ["https://san1.example.com"]  # a TLS proxy's origin the dashboard is served from
//! data_paths = ["/srv/tessera", "/dev/sdb"]  # all the API may make disks of, or read or write images in; default anywhere
//! rados_pools = ["tessera"]       # the RADOS pools the API may put or find a pool in; default any
//! rados_clients = ["tessera"]     # the Ceph clients it may connect as (without "client."); default any
//! metrics_listen = "0.0.0.0:9484"  # GET /metrics only, for a scraper (token required); default none
//! iscsi_listen = "0.0.0.0:3260"    # "none": no portal from here (those added by API stay)
//! iscsi_send_buffer = "4M"        # iSCSI sockets' SO_SNDBUF; unset: kernel autotuning
//! iscsi_recv_buffer = "4M"        # iSCSI sockets' SO_RCVBUF; unset: kernel autotuning
//! nbd_listen = "127.0.0.1:10809"  # "none" disables the NBD server; it requires TLS
//! nbd_insecure = false             # true: plain NBD on nbd_listen
//! nbd_tls_psk_file = "/etc/tessera/nbd.psk"  # default: <state_dir>/nbd-psk, made at start
//! nbd_tls_cert = "/etc/tessera/nbd-cert.pem"  # with nbd_tls_key and nbd_tls_ca, which signs the clients' certificates
//! nbd_unix_socket = "/run/tessera/nbd.sock"   # default: <state_dir>/nbd.sock; "none" disables
//! pools = ["tank"]                # imported at start, in addition to those left imported
//! log_format = "text"             # or "json"
//! auto_repair = true              # repair a pool by itself when a disk fails or stays away
//! auto_repair_delay = "5m"        # how long a disk may stay away (missing, or out on an I/O error) before that
//! scrub_interval = "30d"          # a scrub of every pool this often; "off": only when asked
//! scrub_rate = "200M"             # bytes per second a scheduled scrub reads; "off": no limit
//! scan_interval = "30d"           # a metadata scan of every pool this often; "off": only when asked
//! disk_error_limit = 100          # read or checksum errors after which a disk is failing
//! event_hook = "/usr/local/bin/tessera-alert"  # run per event: its JSON on stdin, TESSERA_EVENT_*
//! event_webhook = "http://alerts.example:9000/tessera"  # POSTed each event's JSON
//! event_hook_severity = "warning" # the least severity handed to the hook and the webhook
//! replication_listen = "0.0.0.0:3262"  # take replicas from peers holding the key; default none
//! replication_psk_file = "/etc/tessera/replication.psk"  # default: <state_dir>/replication-psk
//! replication_congestion = "bbr"  # TCP congestion control of replication streams
//! replication_peers = ["192.0.2.0/24"]  # the addresses peers may connect from; default any
//! replication_pools = ["dr"]      # the pools peers' cycles may make and write replicas in; default any
//! replication_quota = "20T"       # most a replication key's replicas may provision together; default no bound
//!
//! [gateway]                       # one of several gateways of pools on Ceph RADOS
//! name = "gw-a"                   # unique among the gateways
//! etcd = ["http://10.0.0.5:2379"] # where ownership is kept
//! lease_seconds = 5               # how long a stalled or dead gateway keeps what it owned
//! prefix = "/tessera"             # etcd key prefix shared by the gateways
//! etcd_ca_file = "/etc/tessera/etcd-ca.pem"   # TLS: the authority that signed etcd's certificate
//! etcd_cert_file = "/etc/tessera/gw-a.pem"    # this gateway's certificate (etcd --client-cert-auth)
//! etcd_key_file = "/etc/tessera/gw-a.key"     # and its key
//! etcd_user = "gw-a"                          # or: an etcd user with a password (through TLS,
//! etcd_password_file = "/etc/tessera/gw-a.etcd-password"  # or to an etcd on this machine)
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub const DEFAULT_API_LISTEN: &str = "127.0.0.1:8484";
pub const DEFAULT_ISCSI_LISTEN: &str = "127.0.0.1:3260";
pub const DEFAULT_NBD_LISTEN: &str = "127.0.0.1:10809";
pub const DEFAULT_THIN_THRESHOLD_PERCENT: u8 = 80;
pub const DEFAULT_AUTO_REPAIR_DELAY: Duration = Duration::from_secs(300);
/// Monthly: the habit of Storage Spaces' integrity scan and of ZFS installations.
pub const DEFAULT_SCRUB_INTERVAL: Duration = Duration::from_secs(30 * 24 * 3600);
pub const DEFAULT_SCRUB_RATE: u64 = 200 << 20;
/// Monthly too: Windows runs its Data Integrity Scan task every four weeks.
pub const DEFAULT_SCAN_INTERVAL: Duration = Duration::from_secs(30 * 24 * 3600);
pub const DEFAULT_DISK_ERROR_LIMIT: u64 = 100;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// The file as written; every field optional, unknown fields refused.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    pub state_dir: Option<PathBuf>,
    pub api_listen: Option<String>,
    pub api_token: Option<String>,
    pub api_token_file: Option<PathBuf>,
    #[serde(default)]
    pub api_allowed_hosts: Vec<String>,
    #[serde(default)]
    pub api_public_origins: Vec<String>,
    #[serde(default)]
    pub data_paths: Vec<PathBuf>,
    #[serde(default)]
    pub rados_pools: Vec<String>,
    #[serde(default)]
    pub rados_clients: Vec<String>,
    pub metrics_listen: Option<String>,
    pub iscsi_listen: Option<String>,
    pub iscsi_send_buffer: Option<Size>,
    pub iscsi_recv_buffer: Option<Size>,
    pub iscsi_connections_per_portal: Option<usize>,
    pub iscsi_logins_per_address: Option<usize>,
    pub iscsi_sessions_per_initiator: Option<usize>,
    pub iscsi_sessions_per_target: Option<usize>,
    pub iscsi_write_buffer_per_session: Option<Size>,
    pub iscsi_write_buffer_total: Option<Size>,
    pub nbd_listen: Option<String>,
    pub nbd_insecure: Option<bool>,
    pub nbd_tls_psk_file: Option<PathBuf>,
    pub nbd_tls_cert: Option<PathBuf>,
    pub nbd_tls_key: Option<PathBuf>,
    pub nbd_tls_ca: Option<PathBuf>,
    pub nbd_unix_socket: Option<String>,
    pub nbd_max_connections: Option<usize>,
    pub nbd_buffer_total: Option<Size>,
    #[serde(default)]
    pub pools: Vec<String>,
    pub log_format: Option<LogFormat>,
    pub thin_threshold_percent: Option<u8>,
    pub auto_repair: Option<bool>,
    pub auto_repair_delay: Option<String>,
    pub scrub_interval: Option<String>,
    pub scrub_rate: Option<String>,
    pub scan_interval: Option<String>,
    pub disk_error_limit: Option<u64>,
    pub event_hook: Option<PathBuf>,
    pub event_webhook: Option<String>,
    pub event_hook_severity: Option<String>,
    pub replication_listen: Option<String>,
    pub replication_psk_file: Option<PathBuf>,
    pub replication_congestion: Option<String>,
    #[serde(default)]
    pub replication_peers: Vec<String>,
    #[serde(default)]
    pub replication_pools: Vec<String>,
    pub replication_quota: Option<Size>,
    pub gateway: Option<GatewayFile>,
}

/// The `[gateway]` table as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayFile {
    pub name: Option<String>,
    #[serde(default)]
    pub etcd: Vec<String>,
    pub lease_seconds: Option<i64>,
    pub prefix: Option<String>,
    pub etcd_ca_file: Option<PathBuf>,
    pub etcd_cert_file: Option<PathBuf>,
    pub etcd_key_file: Option<PathBuf>,
    pub etcd_user: Option<String>,
    pub etcd_password_file: Option<PathBuf>,
}

/// This daemon as one gateway of pools kept in a Ceph cluster: its name, the etcd that keeps
/// who owns which pool, and its lease there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayConfig {
    pub name: String,
    pub etcd: Vec<String>,
    /// Seconds a gateway that stopped renewing keeps what it owned; another takes over after.
    pub lease_seconds: i64,
    pub prefix: String,
    /// TLS to etcd (every endpoint https://); None: plain text.
    pub etcd_tls: Option<EtcdTlsFiles>,
    /// The etcd user this gateway is, and the file that holds its password (read at each
    /// joining); None: a user by certificate, or none.
    pub etcd_user: Option<(String, PathBuf)>,
}

/// The files a gateway reaches an etcd that serves TLS with, read at each joining (so that a
/// certificate renewed in place counts from the next).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdTlsFiles {
    /// The certificate of the authority that signed etcd's (PEM).
    pub ca: PathBuf,
    /// This gateway's certificate and its key (PEM), for an etcd that asks for one
    /// (`--client-cert-auth`): with authentication on, its common name is the etcd user.
    pub identity: Option<(PathBuf, PathBuf)>,
}

pub const DEFAULT_GATEWAY_LEASE_SECONDS: i64 = 5;
pub const DEFAULT_GATEWAY_PREFIX: &str = "/tessera";

fn gateway(f: Option<GatewayFile>) -> Result<Option<GatewayConfig>, String> {
    let Some(g) = f else { return Ok(None) };
    let name = g.name.ok_or("[gateway]: name is missing (unique among the gateways)")?;
    if name.is_empty() || name.len() > 64 || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
        return Err(format!(
            "[gateway]: name '{name}' must be 1 to 64 letters, digits, '-', '_' or '.'"
        ));
    }
    if g.etcd.is_empty() {
        return Err("[gateway]: etcd lists no endpoint (e.g. etcd = [\"http://127.0.0.1:2379\"])".into());
    }
    for e in &g.etcd {
        if e.is_empty() || e.contains(char::is_whitespace) {
            return Err(format!("[gateway]: etcd endpoint '{e}' is not an address"));
        }
    }
    let lease_seconds = g.lease_seconds.unwrap_or(DEFAULT_GATEWAY_LEASE_SECONDS);
    if !(2..=300).contains(&lease_seconds) {
        return Err(format!(
            "[gateway]: lease_seconds must be between 2 and 300, not {lease_seconds}"
        ));
    }
    let prefix = g.prefix.unwrap_or_else(|| DEFAULT_GATEWAY_PREFIX.into());
    if !prefix.starts_with('/') || prefix.len() < 2 || prefix.contains(char::is_whitespace) {
        return Err(format!(
            "[gateway]: prefix '{prefix}' must be a key path such as /tessera"
        ));
    }
    let etcd_tls = etcd_tls(&g.etcd, g.etcd_ca_file, g.etcd_cert_file, g.etcd_key_file)?;
    let etcd_user = match (g.etcd_user, g.etcd_password_file) {
        (None, None) => None,
        (Some(user), Some(file)) => {
            if user.is_empty() || user.contains(char::is_whitespace) {
                return Err(format!("[gateway]: etcd_user '{user}' is not an etcd user name"));
            }
            if !file.is_absolute() {
                return Err(format!(
                    "[gateway]: etcd_password_file '{}' must be an absolute path",
                    file.display()
                ));
            }
            Some((user, file))
        }
        _ => return Err(
            "[gateway]: etcd_user and etcd_password_file go together (the user and the file that holds its password)"
                .into(),
        ),
    };
    Ok(Some(GatewayConfig {
        name,
        etcd: g.etcd,
        lease_seconds,
        prefix: prefix.trim_end_matches('/').to_string(),
        etcd_tls,
        etcd_user,
    }))
}

/// The `[gateway]` table's TLS files, checked against its endpoints: TLS for all or none.
fn etcd_tls(
    endpoints: &[String],
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
) -> Result<Option<EtcdTlsFiles>, String> {
    for (field, path) in [
        ("etcd_ca_file", &ca),
        ("etcd_cert_file", &cert),
        ("etcd_key_file", &key),
    ] {
        if let Some(p) = path.as_ref().filter(|p| !p.is_absolute()) {
            return Err(format!("[gateway]: {field} '{}' must be an absolute path", p.display()));
        }
    }
    let identity = match (cert, key) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        _ => {
            return Err(
                "[gateway]: etcd_cert_file and etcd_key_file go together (this gateway's certificate and its key)"
                    .into(),
            )
        }
    };
    let Some(ca) = ca else {
        if identity.is_some() {
            return Err(
                "[gateway]: etcd_cert_file needs etcd_ca_file, the authority that signed etcd's certificate".into(),
            );
        }
        if let Some(e) = endpoints.iter().find(|e| e.starts_with("https://")) {
            return Err(format!(
                "[gateway]: etcd endpoint '{e}' serves TLS: name etcd_ca_file, the authority that signed its certificate"
            ));
        }
        return Ok(None);
    };
    if let Some(e) = endpoints.iter().find(|e| e.starts_with("http://")) {
        return Err(format!(
            "[gateway]: etcd endpoint '{e}' is plain text, but etcd_ca_file sets up TLS: write https://"
        ));
    }
    Ok(Some(EtcdTlsFiles { ca, identity }))
}

/// What the command line may override.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub state_dir: Option<PathBuf>,
    pub api_listen: Option<String>,
    pub api_token: Option<String>,
    pub iscsi_listen: Option<String>,
    pub nbd_listen: Option<String>,
    pub nbd_insecure: bool,
    pub log_format: Option<LogFormat>,
    pub demo: bool,
}

/// The configuration the daemon runs with, checked.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub state_dir: PathBuf,
    pub api_listen: Option<SocketAddr>,
    /// A listener that serves GET /metrics only, with the API's token.
    pub metrics_listen: Option<SocketAddr>,
    /// The TCP listener's token; None: the one in `<state_dir>/api-token` (made if missing).
    pub api_token: Option<String>,
    /// Host names (lowercase) the TCP listener answers to, beyond its address.
    pub api_allowed_hosts: Vec<String>,
    /// Origins (`https://name[:port]`, lowercase, the port written only when not the
    /// scheme's) a browser may send requests from besides the listener's own: a TLS proxy's.
    pub api_public_origins: Vec<String>,
    /// The directories (or devices, or files) inside which a request may name a pool's disk
    /// or an image; empty: anywhere but the state directory (`data_paths.rs`).
    pub data_paths: Vec<PathBuf>,
    /// The RADOS pools a request may put a pool in or import one from; empty: any the Ceph
    /// client may reach.
    pub rados_pools: Vec<String>,
    /// The Ceph clients (names without "client.") a request may connect as; empty: any
    /// whose keyring the daemon can read.
    pub rados_clients: Vec<String>,
    /// The configured iSCSI portal; None when disabled.
    pub iscsi_listen: Option<SocketAddr>,
    /// Socket buffers of every iSCSI portal.
    pub iscsi_buffers: tessera_iscsi::SocketBuffers,
    /// What initiators may make the target hold.
    pub iscsi_limits: tessera_iscsi::Limits,
    /// The NBD server's address; None when disabled.
    pub nbd_listen: Option<SocketAddr>,
    /// Plain NBD allowed on `nbd_listen`; otherwise it requires TLS.
    pub nbd_insecure: bool,
    /// TLS keys and certificates configured; with none, the daemon makes a pre-shared key in
    /// `<state_dir>/nbd-psk`.
    pub nbd_tls: tessera_nbd::TlsConfig,
    /// The unix socket that serves plain NBD to local clients; None when disabled.
    pub nbd_unix_socket: Option<PathBuf>,
    pub nbd_max_connections: usize,
    /// Bytes of request data all NBD connections may hold together (READ buffers, WRITE
    /// payloads, replies not yet taken).
    pub nbd_buffer_total: usize,
    pub pools: Vec<String>,
    pub log_format: LogFormat,
    /// Allocated share of a pool past which its thin LUNs raise THIN PROVISIONING SOFT
    /// THRESHOLD REACHED and the pool carries a warning.
    pub thin_threshold_percent: u8,
    /// Start a pool's repair without being asked when a disk fails for good, or stays away
    /// (missing, or taken out by an I/O error) for `auto_repair_delay` (so that a cable pulled
    /// and put back does not start a rebuild).
    pub auto_repair: bool,
    pub auto_repair_delay: Duration,
    /// How often each pool is scrubbed; None: only when asked.
    pub scrub_interval: Option<Duration>,
    /// Bytes per second a scheduled (or restarted) scrub reads; None: no limit.
    pub scrub_rate: Option<u64>,
    /// How often each pool's metadata is scanned (`tessera pool scan`); None: only when asked.
    pub scan_interval: Option<Duration>,
    /// Read and checksum errors of a disk (since its pool was imported) past which the daemon
    /// takes it for failing: it is retired and, with auto repair, its data moved off.
    pub disk_error_limit: u64,
    /// Where events go beyond the event log.
    pub event_hook: crate::events::HookConfig,
    /// Where peers' replication streams are taken; None: this site takes no replicas.
    pub replication_listen: Option<SocketAddr>,
    /// The keys shared with the peer sites (made at start when missing).
    pub replication_psk_file: PathBuf,
    pub replication_congestion: String,
    /// The networks peers may connect to the replication listener from; empty: any. Others
    /// are closed at once, before a handshake costs anything or holds a place.
    pub replication_peers: Vec<crate::networks::Network>,
    /// The pools peers' cycles may make and write replicas in; empty: any imported pool.
    pub replication_pools: Vec<String>,
    /// Most bytes the replicas made with one replication key may provision together (each
    /// replica's size, as the source's): a key holder cannot fill the site's pools, nor take
    /// the memory every vdisk's grain map shares. None: no bound.
    pub replication_quota: Option<u64>,
    /// This daemon as a gateway of pools on Ceph RADOS; None: it serves local pools only.
    pub gateway: Option<GatewayConfig>,
    pub demo: bool,
}

impl ServerConfig {
    /// Reads `file` (if any), applies the overrides and checks the result.
    pub fn load(file: Option<&Path>, o: Overrides) -> Result<ServerConfig, String> {
        let f = match file {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| format!("cannot read the configuration file {}: {e}", p.display()))?;
                parse_file(&text).map_err(|e| format!("configuration file {}: {e}", p.display()))?
            }
            None => ConfigFile::default(),
        };
        Self::resolve(f, o)
    }

    pub fn resolve(f: ConfigFile, o: Overrides) -> Result<ServerConfig, String> {
        let iscsi_limits = iscsi_limits(&f)?;
        let default_state = if o.demo { "tessera-demo" } else { "/var/lib/tessera" };
        // A relative path in the file would depend on where the daemon happens to start (the
        // root directory, under systemd); on the command line it is the caller's.
        if o.state_dir.is_none() && f.state_dir.as_ref().is_some_and(|p| !p.is_absolute()) {
            return Err("state_dir in the configuration file must be an absolute path".into());
        }
        let state_dir = o
            .state_dir
            .or(f.state_dir)
            .unwrap_or_else(|| PathBuf::from(default_state));
        if state_dir.as_os_str().is_empty() {
            return Err("state_dir is empty: name the directory the daemon keeps its state in".into());
        }
        let state_dir = absolute(&state_dir)?;
        let api_listen = listen_addr("api_listen", o.api_listen.or(f.api_listen), DEFAULT_API_LISTEN)?;
        let metrics_listen = listen_addr("metrics_listen", f.metrics_listen.clone(), "none")?;
        if f.api_token.is_some() && f.api_token_file.is_some() {
            return Err("api_token and api_token_file are both set: keep one".into());
        }
        let token_from_file = match &f.api_token_file {
            Some(p) => {
                let t = std::fs::read_to_string(p)
                    .map_err(|e| format!("cannot read api_token_file {}: {e}", p.display()))?
                    .trim()
                    .to_string();
                if t.is_empty() {
                    return Err(format!("api_token_file {} is empty", p.display()));
                }
                Some(t)
            }
            None => None,
        };
        let api_token = o
            .api_token
            .or(f.api_token)
            .or(token_from_file)
            .filter(|t| !t.is_empty());
        if let Some(t) = &api_token {
            if t.len() < 16 {
                return Err("the API token must be at least 16 characters long".into());
            }
            if !t.chars().all(|c| c.is_ascii_graphic()) {
                return Err("the API token may hold only printable ASCII characters, no spaces".into());
            }
        }
        // Every TCP listener, loopback included, needs a token: without one configured, the
        // daemon makes one in the state directory at start (api::auth).
        let mut api_allowed_hosts = Vec::new();
        for h in f.api_allowed_hosts {
            if h.is_empty() || h.contains(['/', ' ', '@']) {
                return Err(format!("api_allowed_hosts: '{h}' is not a host name"));
            }
            api_allowed_hosts.push(h.to_ascii_lowercase());
        }
        let api_public_origins = f
            .api_public_origins
            .iter()
            .map(|o| public_origin(o))
            .collect::<Result<Vec<_>, _>>()?;
        for (key, names) in [
            ("rados_pools", &f.rados_pools),
            ("rados_clients", &f.rados_clients),
            ("replication_pools", &f.replication_pools),
        ] {
            if let Some(bad) = names
                .iter()
                .find(|n| n.is_empty() || n.contains(|c: char| c.is_whitespace() || c == '\0'))
            {
                return Err(format!("{key}: '{bad}' is not a name"));
            }
        }
        for p in &f.data_paths {
            if !p.is_absolute() || p.components().any(|c| c == std::path::Component::ParentDir) {
                return Err(format!(
                    "data_paths: '{}' must be an absolute path without '..'",
                    p.display()
                ));
            }
        }
        let iscsi_listen = listen_addr("iscsi_listen", o.iscsi_listen.or(f.iscsi_listen), DEFAULT_ISCSI_LISTEN)?;
        let iscsi_buffers = tessera_iscsi::SocketBuffers {
            send: socket_buffer("iscsi_send_buffer", f.iscsi_send_buffer)?,
            recv: socket_buffer("iscsi_recv_buffer", f.iscsi_recv_buffer)?,
        };
        let nbd_listen = listen_addr("nbd_listen", o.nbd_listen.or(f.nbd_listen), DEFAULT_NBD_LISTEN)?;
        // The demo serves plain NBD on loopback, and says so; anything else asks.
        let nbd_insecure = o.nbd_insecure || f.nbd_insecure.unwrap_or(o.demo);
        let nbd_tls = tessera_nbd::TlsConfig {
            psk_file: f.nbd_tls_psk_file,
            cert: f.nbd_tls_cert,
            key: f.nbd_tls_key,
            ca: f.nbd_tls_ca,
        };
        if nbd_tls.cert.is_some() != nbd_tls.key.is_some() {
            return Err("nbd_tls_cert and nbd_tls_key go together".into());
        }
        if nbd_tls.cert.is_some() && nbd_tls.ca.is_none() {
            return Err("nbd_tls_cert needs nbd_tls_ca, the CA that signs the clients' certificates: without it any client that completes TLS would be let in (a pre-shared key alone, nbd_tls_psk_file, needs no certificate)".into());
        }
        if nbd_tls.ca.is_some() && nbd_tls.cert.is_none() {
            return Err("nbd_tls_ca needs nbd_tls_cert and nbd_tls_key: the server shows a certificate too".into());
        }
        let nbd_unix_socket = match f.nbd_unix_socket.as_deref() {
            Some("" | "none") => None,
            Some(p) => Some(PathBuf::from(p)),
            None => Some(state_dir.join("nbd.sock")),
        };
        let nbd_max_connections = match f.nbd_max_connections {
            Some(0) => return Err("nbd_max_connections must be at least 1".into()),
            Some(n) => n,
            None => tessera_nbd::server::DEFAULT_MAX_CONNECTIONS,
        };
        let nbd_buffer_total = buffer_budget(
            "nbd_buffer_total",
            &f.nbd_buffer_total,
            tessera_nbd::held::DEFAULT_MAX_HELD_TOTAL,
        )?;
        for p in &f.pools {
            tessera_pool::validate_name("pool", p)?;
        }
        let auto_repair_delay = match f.auto_repair_delay.as_deref() {
            None => DEFAULT_AUTO_REPAIR_DELAY,
            Some(d) => crate::units::parse_duration(d).map_err(|e| format!("auto_repair_delay: {e}"))?,
        };
        let scrub_interval = interval("scrub_interval", f.scrub_interval.as_deref(), DEFAULT_SCRUB_INTERVAL)?;
        let scan_interval = interval("scan_interval", f.scan_interval.as_deref(), DEFAULT_SCAN_INTERVAL)?;
        let scrub_rate = match f.scrub_rate.as_deref() {
            None => Some(DEFAULT_SCRUB_RATE),
            Some("off" | "none") => None,
            Some(r) => match crate::units::parse_size(r).map_err(|e| format!("scrub_rate: {e}"))? {
                0 => return Err("scrub_rate must be more than 0 bytes per second, or \"off\" for no limit".into()),
                r => Some(r),
            },
        };
        let disk_error_limit = match f.disk_error_limit {
            Some(0) => return Err("disk_error_limit must be at least 1".into()),
            Some(n) => n,
            None => DEFAULT_DISK_ERROR_LIMIT,
        };
        let event_hook = crate::events::HookConfig {
            command: match f.event_hook {
                Some(p) if p.as_os_str().is_empty() => None,
                Some(p) if !p.is_absolute() => {
                    return Err(format!("event_hook '{}' must be an absolute path", p.display()))
                }
                p => p,
            },
            webhook: match f.event_webhook.as_deref() {
                None | Some("") => None,
                Some(u) => Some(crate::events::Webhook::parse(u)?),
            },
            min_severity: match f.event_hook_severity.as_deref() {
                None => crate::events::Severity::Warning,
                Some(s) => crate::events::Severity::parse(s).map_err(|e| format!("event_hook_severity: {e}"))?,
            },
        };
        let replication_listen = listen_addr("replication_listen", f.replication_listen, "none")?;
        let replication_psk_file = match f.replication_psk_file {
            Some(p) if !p.is_absolute() => {
                return Err(format!(
                    "replication_psk_file '{}' must be an absolute path",
                    p.display()
                ))
            }
            Some(p) => p,
            None => state_dir.join("replication-psk"),
        };
        let replication_congestion = f.replication_congestion.unwrap_or_else(|| "bbr".into());
        if replication_congestion.is_empty()
            || replication_congestion.len() > 15
            || !replication_congestion
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(format!(
                "replication_congestion '{replication_congestion}' is not a congestion control's name (bbr, cubic, ...)"
            ));
        }
        let replication_peers = f
            .replication_peers
            .iter()
            .map(|n| crate::networks::Network::parse(n).map_err(|e| format!("replication_peers: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        let replication_quota = f.replication_quota.map(|s| s.bytes("replication_quota")).transpose()?;
        let gateway = gateway(f.gateway)?;
        Ok(ServerConfig {
            gateway,
            replication_listen,
            replication_psk_file,
            replication_congestion,
            replication_peers,
            replication_pools: f.replication_pools,
            replication_quota,
            state_dir,
            api_listen,
            metrics_listen,
            api_token,
            api_allowed_hosts,
            api_public_origins,
            data_paths: f.data_paths,
            rados_pools: f.rados_pools,
            rados_clients: f.rados_clients,
            iscsi_listen,
            iscsi_buffers,
            iscsi_limits,
            nbd_listen,
            nbd_insecure,
            nbd_tls,
            nbd_unix_socket,
            nbd_max_connections,
            nbd_buffer_total,
            pools: f.pools,
            log_format: o.log_format.or(f.log_format).unwrap_or_default(),
            thin_threshold_percent: match f.thin_threshold_percent {
                None => DEFAULT_THIN_THRESHOLD_PERCENT,
                Some(p @ 1..=99) => p,
                Some(p) => return Err(format!("thin_threshold_percent must be 1 to 99, not {p}")),
            },
            auto_repair: f.auto_repair.unwrap_or(true),
            auto_repair_delay,
            scrub_interval,
            scan_interval,
            scrub_rate,
            disk_error_limit,
            event_hook,
            demo: o.demo,
        })
    }

    pub fn socket_path(&self) -> PathBuf {
        self.state_dir.join("api.sock")
    }

    pub fn pools_dir(&self) -> PathBuf {
        self.state_dir.join("pools")
    }
}

/// A schedule's interval: `default` when not given, None for "off", "none" or zero.
fn interval(key: &str, given: Option<&str>, default: Duration) -> Result<Option<Duration>, String> {
    match given {
        None => Ok(Some(default)),
        Some("off" | "none") => Ok(None),
        Some(d) => match crate::units::parse_duration(d).map_err(|e| format!("{key}: {e}"))? {
            d if d.is_zero() => Ok(None),
            d => Ok(Some(d)),
        },
    }
}

/// A listener's address: the given one or `default`; "" or "none" turns the listener off.
fn listen_addr(key: &str, given: Option<String>, default: &str) -> Result<Option<SocketAddr>, String> {
    match given.as_deref().unwrap_or(default) {
        "" | "none" => Ok(None),
        s => parse_addr(key, s).map(Some),
    }
}

/// The iSCSI bounds: each setting given, or the default.
fn iscsi_limits(f: &ConfigFile) -> Result<tessera_iscsi::Limits, String> {
    let d = tessera_iscsi::Limits::default();
    let count = |key: &str, v: Option<usize>, default: usize| match v {
        None => Ok(default),
        Some(0) => Err(format!("{key} must be at least 1")),
        Some(n) => Ok(n),
    };
    let bytes = buffer_budget;
    let l = tessera_iscsi::Limits {
        connections_per_portal: count(
            "iscsi_connections_per_portal",
            f.iscsi_connections_per_portal,
            d.connections_per_portal,
        )?,
        logins_per_address: count(
            "iscsi_logins_per_address",
            f.iscsi_logins_per_address,
            d.logins_per_address,
        )?,
        sessions_per_initiator: count(
            "iscsi_sessions_per_initiator",
            f.iscsi_sessions_per_initiator,
            d.sessions_per_initiator,
        )?,
        sessions_per_target: count(
            "iscsi_sessions_per_target",
            f.iscsi_sessions_per_target,
            d.sessions_per_target,
        )?,
        write_bytes_per_session: bytes(
            "iscsi_write_buffer_per_session",
            &f.iscsi_write_buffer_per_session,
            d.write_bytes_per_session,
        )?,
        write_bytes_total: bytes(
            "iscsi_write_buffer_total",
            &f.iscsi_write_buffer_total,
            d.write_bytes_total,
        )?,
    };
    if l.write_bytes_total < l.write_bytes_per_session {
        return Err("iscsi_write_buffer_total must be at least iscsi_write_buffer_per_session".into());
    }
    Ok(l)
}

/// A bound on buffers held for requests: `default` when not given.
fn buffer_budget(key: &str, v: &Option<Size>, default: usize) -> Result<usize, String> {
    let n = match v {
        None => return Ok(default),
        Some(s) => s.bytes(key)?,
    };
    // At least one largest request (32 MiB and a little): a smaller budget refuses every one.
    let least = tessera_scsi::MAX_TRANSFER_BYTES.max(tessera_nbd::export::MAX_PAYLOAD as u64) + (1 << 20);
    if n < least {
        return Err(format!("{key} must be at least {} MiB, not {n} bytes", least >> 20));
    }
    Ok(n as usize)
}

/// A size in the file: a number of bytes or a string with a suffix ("4M").
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Size {
    Bytes(u64),
    Text(String),
}

impl Size {
    /// The size in bytes; an error names the setting `key`.
    fn bytes(&self, key: &str) -> Result<u64, String> {
        match self {
            Size::Bytes(n) => Ok(*n),
            Size::Text(t) => crate::units::parse_size(t).map_err(|e| format!("{key}: {e}")),
        }
    }
}

/// Socket buffer sizes: 4 KiB (below that TCP stalls) to 1 GiB (what a u32 socket option and
/// the kernel's doubling leave room for).
fn socket_buffer(key: &str, v: Option<Size>) -> Result<Option<u32>, String> {
    let n = match v {
        None => return Ok(None),
        Some(s) => s.bytes(key)?,
    };
    if !(4096..=1 << 30).contains(&n) {
        return Err(format!("{key} must be between 4K and 1G, not {n} bytes"));
    }
    Ok(Some(n as u32))
}

pub fn parse_file(text: &str) -> Result<ConfigFile, String> {
    toml::from_str(text).map_err(|e| e.to_string())
}

fn parse_addr(what: &str, s: &str) -> Result<SocketAddr, String> {
    s.parse()
        .map_err(|_| format!("{what} '{s}' is not an address: write IP:PORT, e.g. 127.0.0.1:8484 or [::1]:8484"))
}

fn absolute(p: &Path) -> Result<PathBuf, String> {
    if p.is_absolute() {
        return Ok(p.to_path_buf());
    }
    let cwd = std::env::current_dir().map_err(|e| format!("cannot read the current directory: {e}"))?;
    Ok(cwd.join(p))
}

/// An origin a browser sends, as `api_public_origins` gives it (crate::origin): written
/// lowercase, its port left out when it is the scheme's, as browsers write it.
fn public_origin(o: &str) -> Result<String, String> {
    crate::origin::Origin::parse(o).map(|o| o.to_string()).ok_or_else(|| {
        format!("api_public_origins: '{o}' is not an origin (https://name or https://name:port, with no path)")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(toml: &str, o: Overrides) -> Result<ServerConfig, String> {
        ServerConfig::resolve(parse_file(toml)?, o)
    }

    #[test]
    fn defaults_and_overrides() {
        let c = resolve(
            "state_dir = \"/srv/t\"\napi_listen = \"127.0.0.1:9000\"\n",
            Overrides::default(),
        )
        .unwrap();
        assert_eq!(c.state_dir, PathBuf::from("/srv/t"));
        assert_eq!(c.api_listen.unwrap().port(), 9000);
        let o = Overrides {
            state_dir: Some("/other".into()),
            api_listen: Some("none".into()),
            ..Default::default()
        };
        let c = resolve("state_dir = \"/srv/t\"\n", o).unwrap();
        assert_eq!(c.state_dir, PathBuf::from("/other"));
        assert!(c.api_listen.is_none());
    }

    #[test]
    fn a_gateway_table_is_checked() {
        let o = Overrides::default;
        let c = resolve("[gateway]\nname = \"gw-a\"\netcd = [\"http://127.0.0.1:2379\"]\n", o()).unwrap();
        assert_eq!(
            c.gateway,
            Some(GatewayConfig {
                name: "gw-a".into(),
                etcd: vec!["http://127.0.0.1:2379".into()],
                lease_seconds: DEFAULT_GATEWAY_LEASE_SECONDS,
                prefix: "/tessera".into(),
                etcd_tls: None,
                etcd_user: None,
            })
        );
        let user = "[gateway]\nname = \"gw-a\"\netcd = [\"http://127.0.0.1:2379\"]\n\
                    etcd_user = \"gw-a\"\netcd_password_file = \"/etc/t/gw-a.password\"\n";
        assert_eq!(
            resolve(user, o()).unwrap().gateway.unwrap().etcd_user,
            Some(("gw-a".into(), "/etc/t/gw-a.password".into()))
        );
        let tls = "[gateway]\nname = \"gw-a\"\netcd = [\"https://10.0.0.5:2379\", \"10.0.0.6:2379\"]\n\
                   etcd_ca_file = \"/etc/t/ca.pem\"\netcd_cert_file = \"/etc/t/gw.pem\"\netcd_key_file = \"/etc/t/gw.key\"\n";
        assert_eq!(
            resolve(tls, o()).unwrap().gateway.unwrap().etcd_tls,
            Some(EtcdTlsFiles {
                ca: "/etc/t/ca.pem".into(),
                identity: Some(("/etc/t/gw.pem".into(), "/etc/t/gw.key".into())),
            })
        );
        assert!(resolve("", o()).unwrap().gateway.is_none());
        let bad = [
            ("[gateway]\netcd = [\"e:1\"]\n", "name is missing"),
            ("[gateway]\nname = \"a b\"\netcd = [\"e:1\"]\n", "must be 1 to 64"),
            ("[gateway]\nname = \"a\"\n", "lists no endpoint"),
            ("[gateway]\nname = \"a\"\netcd = [\"\"]\n", "is not an address"),
            (
                "[gateway]\nname = \"a\"\netcd = [\"e:1\"]\nlease_seconds = 1\n",
                "between 2 and 300",
            ),
            (
                "[gateway]\nname = \"a\"\netcd = [\"e:1\"]\nprefix = \"t\"\n",
                "must be a key path",
            ),
            ("[gateway]\nname = \"a\"\netcd = [\"e:1\"]\nttl = 3\n", "unknown field"),
            (
                "[gateway]\nname = \"a\"\netcd = [\"https://e:1\"]\n",
                "serves TLS: name etcd_ca_file",
            ),
            (
                "[gateway]\nname = \"a\"\netcd = [\"http://e:1\"]\netcd_ca_file = \"/ca.pem\"\n",
                "is plain text",
            ),
            (
                "[gateway]\nname = \"a\"\netcd = [\"e:1\"]\netcd_ca_file = \"ca.pem\"\n",
                "must be an absolute path",
            ),
            (
                "[gateway]\nname = \"a\"\netcd = [\"e:1\"]\netcd_ca_file = \"/ca.pem\"\netcd_cert_file = \"/c.pem\"\n",
                "go together",
            ),
            (
                "[gateway]\nname = \"a\"\netcd = [\"e:1\"]\netcd_cert_file = \"/c.pem\"\netcd_key_file = \"/k.pem\"\n",
                "needs etcd_ca_file",
            ),
            (
                "[gateway]\nname = \"a\"\netcd = [\"e:1\"]\netcd_user = \"a\"\n",
                "etcd_user and etcd_password_file go together",
            ),
            (
                "[gateway]\nname = \"a\"\netcd = [\"e:1\"]\netcd_user = \"a\"\netcd_password_file = \"p\"\n",
                "must be an absolute path",
            ),
            (
                "[gateway]\nname = \"a\"\netcd = [\"e:1\"]\netcd_user = \"\"\netcd_password_file = \"/p\"\n",
                "is not an etcd user name",
            ),
        ];
        for (text, why) in bad {
            let e = resolve(text, o()).unwrap_err();
            assert!(e.contains(why), "{text}: {e}");
        }
    }

    #[test]
    fn nbd_certificates_need_a_ca_for_the_clients() {
        let o = Overrides::default;
        let cert = "nbd_tls_cert = \"/etc/t/c.pem\"\nnbd_tls_key = \"/etc/t/k.pem\"\n";
        let e = resolve(cert, o()).unwrap_err();
        assert!(e.contains("nbd_tls_ca"), "{e}");
        let e = resolve(&format!("{cert}nbd_tls_psk_file = \"/etc/t/psk\"\n"), o()).unwrap_err();
        assert!(
            e.contains("nbd_tls_ca"),
            "a pre-shared key beside it changes nothing: {e}"
        );
        let c = resolve(&format!("{cert}nbd_tls_ca = \"/etc/t/ca.pem\"\n"), o()).unwrap();
        assert_eq!(c.nbd_tls.ca, Some(PathBuf::from("/etc/t/ca.pem")));
        assert!(resolve("nbd_tls_cert = \"/etc/t/c.pem\"\n", o())
            .unwrap_err()
            .contains("go together"));
        assert!(resolve("nbd_tls_ca = \"/etc/t/ca.pem\"\n", o())
            .unwrap_err()
            .contains("needs nbd_tls_cert"));
    }

    #[test]
    fn data_paths_are_absolute() {
        let c = resolve("data_paths = [\"/srv/tessera\", \"/dev/sdb\"]\n", Overrides::default()).unwrap();
        assert_eq!(
            c.data_paths,
            vec![PathBuf::from("/srv/tessera"), PathBuf::from("/dev/sdb")]
        );
        assert!(resolve("", Overrides::default()).unwrap().data_paths.is_empty());
        for bad in ["srv", "/srv/../etc"] {
            let e = resolve(&format!("data_paths = [\"{bad}\"]\n"), Overrides::default()).unwrap_err();
            assert!(e.contains("data_paths") && e.contains(bad), "{e}");
        }
    }

    #[test]
    fn tokens_and_allowed_hosts() {
        // No token configured: the daemon makes one in the state directory at start.
        let c = resolve("api_listen = \"0.0.0.0:8484\"\n", Overrides::default()).unwrap();
        assert!(c.api_token.is_none());
        let c = resolve("api_allowed_hosts = [\"SAN1.example\"]\n", Overrides::default()).unwrap();
        assert_eq!(c.api_allowed_hosts, vec!["san1.example".to_string()]);
        let c = resolve(
            "api_public_origins = [\"HTTPS://San1.example/\", \"https://san1.example:8443\", \"http://[::1]:80\"]\n",
            Overrides::default(),
        )
        .unwrap();
        assert_eq!(
            c.api_public_origins,
            vec!["https://san1.example", "https://san1.example:8443", "http://[::1]"]
        );
        for bad in [
            "san1.example",
            "https://",
            "https://san1.example/ui",
            "ftp://x",
            "https://x:99999",
            "https://a@b",
        ] {
            let e = resolve(&format!("api_public_origins = [\"{bad}\"]\n"), Overrides::default()).unwrap_err();
            assert!(e.contains("is not an origin"), "{bad}: {e}");
        }
        assert!(resolve("api_allowed_hosts = [\"a b\"]\n", Overrides::default()).is_err());
        let c = resolve(
            "api_listen = \"0.0.0.0:8484\"\napi_token = \"0123456789abcdef0123\"\n",
            Overrides::default(),
        )
        .unwrap();
        assert!(c.api_token.is_some());
        assert!(resolve("api_token = \"short\"\n", Overrides::default())
            .unwrap_err()
            .contains("16 characters"));
        // A token file that holds nothing is an error, not a silent fall back to another token.
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("token");
        std::fs::write(&empty, "\n").unwrap();
        let file = format!("api_token_file = \"{}\"\n", empty.display());
        assert!(resolve(&file, Overrides::default()).unwrap_err().contains("is empty"));
        let both = format!("{file}api_token = \"0123456789abcdef0123\"\n");
        assert!(resolve(&both, Overrides::default()).unwrap_err().contains("both set"));
    }

    #[test]
    fn the_state_directory_is_named_absolutely_in_the_file() {
        for bad in ["state_dir = \"\"\n", "state_dir = \"var/lib/tessera\"\n"] {
            assert!(resolve(bad, Overrides::default()).is_err(), "{bad}");
        }
        let empty = Overrides {
            state_dir: Some(PathBuf::new()),
            ..Default::default()
        };
        assert!(resolve("", empty).unwrap_err().contains("empty"));
    }

    #[test]
    fn iscsi_limits_from_the_file() {
        let c = resolve(
            "iscsi_sessions_per_initiator = 4\niscsi_write_buffer_per_session = \"64M\"\n",
            Overrides::default(),
        )
        .unwrap();
        assert_eq!(c.iscsi_limits.sessions_per_initiator, 4);
        assert_eq!(c.iscsi_limits.write_bytes_per_session, 64 << 20);
        assert_eq!(
            c.iscsi_limits.write_bytes_total,
            tessera_iscsi::Limits::default().write_bytes_total
        );
        for bad in [
            "iscsi_sessions_per_target = 0\n",
            "iscsi_write_buffer_per_session = \"1M\"\n",
            "iscsi_write_buffer_per_session = \"2G\"\niscsi_write_buffer_total = \"1G\"\n",
        ] {
            assert!(resolve(bad, Overrides::default()).is_err(), "{bad}");
        }
    }

    #[test]
    fn socket_buffers() {
        let c = resolve(
            "iscsi_send_buffer = \"4M\"\niscsi_recv_buffer = 262144\n",
            Overrides::default(),
        )
        .unwrap();
        assert_eq!(c.iscsi_buffers.send, Some(4 << 20));
        assert_eq!(c.iscsi_buffers.recv, Some(256 << 10));
        assert_eq!(
            resolve("", Overrides::default()).unwrap().iscsi_buffers,
            Default::default()
        );
    }

    #[test]
    fn scrub_settings_default_to_monthly_at_a_bounded_rate_and_may_be_turned_off() {
        let c = resolve("", Overrides::default()).unwrap();
        assert_eq!(c.scrub_interval, Some(DEFAULT_SCRUB_INTERVAL));
        assert_eq!(c.scan_interval, Some(DEFAULT_SCAN_INTERVAL));
        assert_eq!(c.scrub_rate, Some(DEFAULT_SCRUB_RATE));
        assert_eq!(c.disk_error_limit, DEFAULT_DISK_ERROR_LIMIT);
        let c = resolve(
            "scrub_interval = \"7d\"\nscrub_rate = \"50M\"\ndisk_error_limit = 10\n",
            Overrides::default(),
        )
        .unwrap();
        assert_eq!(c.scrub_interval, Some(Duration::from_secs(7 * 86400)));
        assert_eq!(c.scrub_rate, Some(50 << 20));
        assert_eq!(c.disk_error_limit, 10);
        let c = resolve("scrub_interval = \"off\"\nscrub_rate = \"off\"\n", Overrides::default()).unwrap();
        assert_eq!((c.scrub_interval, c.scrub_rate), (None, None));
        let c = resolve("scan_interval = \"12h\"\n", Overrides::default()).unwrap();
        assert_eq!(c.scan_interval, Some(Duration::from_secs(12 * 3600)));
        let c = resolve("scan_interval = \"off\"\n", Overrides::default()).unwrap();
        assert_eq!(c.scan_interval, None);
        for bad in [
            "scrub_interval = \"soon\"\n",
            "scan_interval = \"weekly\"\n",
            "scan_interval = \"18446744073709551615\"\n",
            "scrub_interval = \"99999999d\"\n",
            "auto_repair_delay = \"4000d\"\n",
            "scrub_rate = \"0\"\n",
            "disk_error_limit = 0\n",
        ] {
            let e = resolve(bad, Overrides::default()).unwrap_err();
            assert!(e.contains(bad.split(' ').next().unwrap()), "{bad}: {e}");
        }
    }

    #[test]
    fn event_hooks() {
        let c = resolve("", Overrides::default()).unwrap();
        assert_eq!(c.event_hook, Default::default());
        let c = resolve(
            "event_hook = \"/usr/local/bin/alert\"\nevent_webhook = \"http://alerts:9000/t\"\nevent_hook_severity = \"error\"\n",
            Overrides::default(),
        )
        .unwrap();
        assert_eq!(c.event_hook.command, Some(PathBuf::from("/usr/local/bin/alert")));
        assert_eq!(c.event_hook.webhook.unwrap().authority, "alerts:9000");
        assert_eq!(c.event_hook.min_severity, crate::events::Severity::Error);
        for bad in [
            "event_hook = \"alert\"\n",
            "event_webhook = \"https://alerts/t\"\n",
            "event_hook_severity = \"loud\"\n",
        ] {
            let e = resolve(bad, Overrides::default()).unwrap_err();
            assert!(e.contains(bad.split(' ').next().unwrap()), "{bad}: {e}");
        }
    }

    #[test]
    fn the_shipped_example_parses() {
        let c = resolve(include_str!("../../../dist/tessera.toml"), Overrides::default()).unwrap();
        assert_eq!(c.state_dir, PathBuf::from("/var/lib/tessera"));
    }

    #[test]
    fn bad_files_are_refused_with_the_reason() {
        assert!(resolve("state_dri = \"/x\"\n", Overrides::default())
            .unwrap_err()
            .contains("unknown field"));
        assert!(resolve("api_listen = 8484\n", Overrides::default()).is_err());
        assert!(resolve("api_listen = \"localhost\"\n", Overrides::default())
            .unwrap_err()
            .contains("IP:PORT"));
        assert!(resolve("pools = [\"a/b\"]\n", Overrides::default())
            .unwrap_err()
            .contains("pool name"));
        assert!(resolve("log_format = \"xml\"\n", Overrides::default()).is_err());
        assert!(resolve("replication_quota = \"12Q\"\n", Overrides::default())
            .unwrap_err()
            .contains("replication_quota"));
        assert!(resolve("replication_peers = [\"10.1.2.3/8\"]\n", Overrides::default())
            .unwrap_err()
            .contains("replication_peers: '10.1.2.3/8'"));
        assert!(resolve("replication_pools = [\"\"]\n", Overrides::default())
            .unwrap_err()
            .contains("replication_pools"));
        let c = resolve(
            "replication_pools = [\"dr\"]\nreplication_quota = \"2T\"\n",
            Overrides::default(),
        )
        .unwrap();
        assert_eq!(
            (c.replication_pools, c.replication_quota),
            (vec!["dr".to_string()], Some(2 << 40))
        );
        assert!(resolve("iscsi_send_buffer = \"12Q\"\n", Overrides::default())
            .unwrap_err()
            .contains("iscsi_send_buffer"));
        assert!(resolve("iscsi_recv_buffer = 100\n", Overrides::default())
            .unwrap_err()
            .contains("between 4K and 1G"));
        assert!(resolve("[[[", Overrides::default()).is_err());
        assert!(resolve("nbd_buffer_total = \"16M\"\n", Overrides::default())
            .unwrap_err()
            .contains("nbd_buffer_total must be at least 33 MiB"));
        let c = resolve("nbd_buffer_total = \"2G\"\n", Overrides::default()).unwrap();
        assert_eq!(c.nbd_buffer_total, 2 << 30);
        let c = resolve("", Overrides::default()).unwrap();
        assert_eq!(c.nbd_buffer_total, tessera_nbd::held::DEFAULT_MAX_HELD_TOTAL);
    }
}
