//! `tessera serve`: takes the state directory's lock, imports the pools, serves the API on the
//! unix socket and on TCP, and on SIGTERM or SIGINT stops jobs and flushes every pool.

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener};
use tokio::signal::unix::{signal, SignalKind};
use tracing::{error, info};

use crate::config::ServerConfig;
use crate::daemon::Daemon;
use crate::lock::StateLock;
use crate::units::format_size;

/// How often pools are checked against the thin provisioning threshold.
const THIN_CHECK_INTERVAL: Duration = Duration::from_secs(2);

pub fn run(cfg: ServerConfig) -> Result<(), String> {
    crate::logging::init(cfg.log_format);
    std::fs::create_dir_all(&cfg.state_dir)
        .map_err(|e| format!("cannot create the state directory {}: {e}", cfg.state_dir.display()))?;
    let _lock = StateLock::acquire(&cfg.state_dir)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("tessera")
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    rt.block_on(serve(cfg))?;
    // Every pool is flushed. An iSCSI session that raced the signal (or its ring thread) may
    // still hold one, and a metadata store still open when the process's static destructors
    // run aborts it (RocksDB: "pthread lock: Invalid argument"). Leave without running them:
    // what is durable is on disk, and the kernel releases the state lock.
    rt.shutdown_timeout(Duration::from_secs(10));
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: ends the process at once; nothing after this runs.
    unsafe { libc::_exit(0) }
}

async fn serve(cfg: ServerConfig) -> Result<(), String> {
    let demo = cfg.demo;
    // What the configuration names that may be wrong (an address another program holds, a
    // certificate missing) is found before the daemon imports its pools and records anything.
    // The addresses are only tried here (bound and let go), so that no client connects
    // before the daemon answers.
    for (addr, naming) in [
        (cfg.api_listen, API),
        (cfg.metrics_listen, METRICS),
        (cfg.nbd_listen, NBD),
        (cfg.iscsi_listen, ISCSI),
        (cfg.replication_listen, REPLICATION),
    ] {
        drop(bind(addr, naming).await?);
    }
    let configured_tls = match cfg.nbd_tls.is_empty() {
        false => Some(nbd_tls(&cfg)?),
        // The default key is made in the state directory, once the daemon holds it.
        true => None,
    };
    let daemon = tokio::task::spawn_blocking(move || Daemon::start(cfg))
        .await
        .map_err(|e| e.to_string())??;
    let daemon = Arc::new(daemon);
    if demo {
        let d = daemon.clone();
        tokio::task::spawn_blocking(move || crate::demo::prepare(&d))
            .await
            .map_err(|e| e.to_string())??;
    }

    // We hold the state lock, so a socket file left here is stale.
    let sock = daemon.cfg.socket_path();
    let _ = std::fs::remove_file(&sock);
    // Whoever can open the socket is an administrator: owner only, from the moment it exists.
    // SAFETY: umask only changes this process's file creation mask.
    let old_mask = unsafe { libc::umask(0o177) };
    let unix = UnixListener::bind(&sock);
    unsafe { libc::umask(old_mask) };
    let unix = unix.map_err(|e| format!("cannot listen on {}: {e}", sock.display()))?;
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("cannot restrict {}: {e}", sock.display()))?;
    let tcp = bind(daemon.cfg.api_listen, API).await?;
    let metrics = bind(daemon.cfg.metrics_listen, METRICS).await?;
    daemon.portals.start()?;
    let nbd = bind(daemon.cfg.nbd_listen, NBD).await?;
    let nbd_addr = nbd.as_ref().and_then(|l| l.local_addr().ok());
    let repl = {
        let d = daemon.clone();
        tokio::task::spawn_blocking(move || crate::replication::start_listener(&d))
            .await
            .map_err(|e| e.to_string())??
    };
    let nbd_tls = match configured_tls {
        Some(t) => t,
        None => nbd_tls(&daemon.cfg)?,
    };
    if let Some(l) = nbd {
        let policy = tessera_nbd::Policy {
            tls: nbd_tls.as_ref().map(|(t, _)| t.clone()),
            require_tls: !daemon.cfg.nbd_insecure,
            max_connections: daemon.cfg.nbd_max_connections,
            ..tessera_nbd::Policy::plain()
        };
        tokio::spawn(tessera_nbd::serve_tcp(l, daemon.nbd.registry.clone(), policy));
    }
    if let Some(path) = &daemon.cfg.nbd_unix_socket {
        let _ = std::fs::remove_file(path);
        // Whoever can open it reads and writes every export: owner only, from the start.
        // SAFETY: umask only changes this process's file creation mask.
        let old_mask = unsafe { libc::umask(0o177) };
        let l = UnixListener::bind(path);
        unsafe { libc::umask(old_mask) };
        let l = l.map_err(|e| format!("cannot listen for NBD on {}: {e}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| format!("cannot restrict {}: {e}", path.display()))?;
        tokio::spawn(tessera_nbd::serve_unix(
            l,
            daemon.nbd.registry.clone(),
            daemon.cfg.nbd_max_connections,
        ));
    }
    println!(
        "{}",
        banner(
            &daemon,
            tcp.as_ref().and_then(|t| t.local_addr().ok()),
            metrics.as_ref().and_then(|t| t.local_addr().ok()),
            nbd_addr,
            nbd_tls.as_ref().map(|(_, psk)| psk.as_deref()),
            repl,
        )
    );

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let mut servers = Vec::new();
    let r = crate::api::router(daemon.clone(), None);
    servers.push(tokio::spawn(
        axum::serve(unix, r.into_make_service())
            .with_graceful_shutdown(stopped(stop_rx.clone()))
            .into_future(),
    ));
    let token = || match daemon.cfg.api_token.clone() {
        Some(t) => Ok(t),
        None => crate::api::auth::load_or_create_token(&daemon.cfg.state_dir),
    };
    let scrape_token = || crate::api::auth::load_or_create_scrape_token(&daemon.cfg.state_dir);
    if let Some(t) = tcp {
        let guard = crate::api::auth::Guard::new(
            token()?,
            t.local_addr().map_err(|e| e.to_string())?,
            daemon.cfg.api_allowed_hosts.clone(),
        )
        .with_scrape_token(scrape_token()?)
        .with_viewer_token(crate::api::auth::load_or_create_viewer_token(&daemon.cfg.state_dir)?)
        .with_public_origins(daemon.cfg.api_public_origins.clone());
        let r = crate::api::router(daemon.clone(), Some(Arc::new(guard)));
        servers.push(tokio::spawn(crate::api::listener::serve(
            t,
            r,
            Default::default(),
            stop_rx.clone(),
        )));
    }
    if let Some(m) = metrics {
        let guard = crate::api::auth::Guard::new(
            token()?,
            m.local_addr().map_err(|e| e.to_string())?,
            daemon.cfg.api_allowed_hosts.clone(),
        )
        .with_scrape_token(scrape_token()?)
        .without_dashboard();
        let r = crate::api::metrics_router(daemon.clone(), Arc::new(guard));
        servers.push(tokio::spawn(crate::api::listener::serve(
            m,
            r,
            Default::default(),
            stop_rx.clone(),
        )));
    }
    // Watch the pools' allocation against the thin provisioning threshold.
    let watched = daemon.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(THIN_CHECK_INTERVAL);
        loop {
            tick.tick().await;
            let d = watched.clone();
            let _ = tokio::task::spawn_blocking(move || d.check_thin_thresholds()).await;
        }
    });
    // Start the repairs that are due (a disk failed, or missing past the delay), go on with
    // scrubs a restart cut short, start the scheduled ones and the scheduled dedup runs, and
    // watch disks' error counts.
    let repairing = daemon.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(crate::auto_repair::CHECK_INTERVAL);
        loop {
            tick.tick().await;
            let d = repairing.clone();
            let _ = tokio::task::spawn_blocking(move || {
                d.health_events_tick();
                d.events.tick();
                d.auto_repair_tick();
                d.scrub_tick();
                d.scan_tick();
                d.dedup_tick();
                d.replication_tick();
                d.targets.copy.expire();
            })
            .await;
        }
    });
    // As a gateway of pools on RADOS: keep the membership, take the pools nobody owns, once a
    // second and at once when another gateway's keys change (an owner gone, a gateway asking).
    if daemon.cfg.gateway.is_some() {
        let gatewaying = daemon.clone();
        let changes = daemon.gateway_changes();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(crate::rados_pools::TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = changes.notified() => {}
                }
                let d = gatewaying.clone();
                let _ = tokio::task::spawn_blocking(move || d.rados_tick()).await;
            }
        });
        // Destructions of pools on RADOS a stop or the cluster cut short: finished beside the
        // ticks, as a removal may take minutes.
        let finishing = daemon.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(crate::rados_pools::TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let d = finishing.clone();
                let _ = tokio::task::spawn_blocking(move || d.finish_destroys()).await;
            }
        });
        // The unit attentions the owners of pools raise for hosts on standby paths here. A
        // watch that ended (etcd went away, this gateway rejoined) is made again from where
        // it stopped, so that the notices sent meanwhile still come.
        let told = daemon.clone();
        tokio::spawn(async move {
            let mut seen = None;
            loop {
                if let Some(mut notices) = told.watch_notices(seen).await {
                    while let Some(batch) = notices.next().await {
                        let d = told.clone();
                        let _ = tokio::task::spawn_blocking(move || d.attentions_from_owners(batch)).await;
                    }
                    seen = Some(notices.seen());
                }
                tokio::time::sleep(crate::rados_pools::TICK).await;
            }
        });
        // Beside the ticks (which may wait on the cluster for as long as a taking takes):
        // the commands standby ports of other gateways forward to the pools owned here, as
        // they come.
        let answering = daemon.clone();
        tokio::spawn(async move {
            loop {
                let coming = answering.watch_asks().await;
                let d = answering.clone();
                let _ = tokio::task::spawn_blocking(move || d.answer_asks()).await;
                match coming {
                    Some(mut c) => {
                        c.wait(crate::rados_pools::TICK).await;
                    }
                    None => tokio::time::sleep(crate::rados_pools::TICK).await,
                }
            }
        });
    }
    // Sample the I/O meters for the dashboard's charts.
    let sampled = daemon.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(crate::io_history::INTERVAL);
        loop {
            tick.tick().await;
            sampled.io_history.sample(&sampled.io_metrics);
        }
    });
    info!(state_dir = %daemon.cfg.state_dir.display(), "ready");

    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    tokio::select! {
        _ = term.recv() => info!("SIGTERM: shutting down"),
        _ = int.recv() => info!("SIGINT: shutting down"),
    }
    let _ = stop_tx.send(true);
    daemon.events.close_followers();
    for s in servers {
        match tokio::time::timeout(Duration::from_secs(10), s).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => error!(error = %e, "API listener failed"),
            Ok(Err(e)) => error!(error = %e, "API listener task failed"),
            Err(_) => error!("API requests still running after 10 s; stopping anyway"),
        }
    }
    let d = daemon.clone();
    tokio::task::spawn_blocking(move || d.shutdown())
        .await
        .map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&sock);
    info!("stopped");
    Ok(())
}

/// TLS for the NBD listener: the configured keys and certificates, or a pre-shared key the
/// daemon makes at its first start in `<state dir>/nbd-psk` (user "tessera"). With the PSK
/// file in use, its path, for the banner. None when NBD is plain and nothing is configured.
#[allow(clippy::type_complexity)]
fn nbd_tls(cfg: &ServerConfig) -> Result<Option<(Arc<tessera_nbd::TlsServer>, Option<std::path::PathBuf>)>, String> {
    if cfg.nbd_listen.is_none() || (cfg.nbd_insecure && cfg.nbd_tls.is_empty()) {
        return Ok(None);
    }
    let mut c = cfg.nbd_tls.clone();
    if c.is_empty() {
        let p = cfg.state_dir.join("nbd-psk");
        if tessera_nbd::tls::create_psk_file(&p, "tessera")? {
            info!(path = %p.display(), "made a pre-shared key for NBD over TLS");
        }
        c.psk_file = Some(p);
    }
    let server = tessera_nbd::TlsServer::new(&c).map_err(|e| format!("NBD TLS: {e}"))?;
    Ok(Some((server, c.psk_file)))
}

/// Binds a configured listener (None: it is off), with an error that says what to change.
/// How a listener is named when its address cannot be had: what it listens for, who else
/// might hold the address, and the setting that chooses another.
type Naming = (&'static str, &'static str, &'static str);
const API: Naming = ("", "daemon", "--api-listen");
const METRICS: Naming = (" for metrics", "daemon", "metrics_listen");
const NBD: Naming = (" for NBD", "server", "--nbd-listen");
const ISCSI: Naming = (" for iSCSI", "target", "--iscsi-listen");
const REPLICATION: Naming = (" for replication", "daemon", "replication_listen");

async fn bind(addr: Option<SocketAddr>, (what, who, flag): Naming) -> Result<Option<TcpListener>, String> {
    let Some(a) = addr else {
        return Ok(None);
    };
    TcpListener::bind(a)
        .await
        .map(Some)
        .map_err(|e| format!("cannot listen{what} on {a}: {e}; is another {who} using it? Choose another with {flag}"))
}

fn banner(
    d: &Daemon,
    tcp: Option<SocketAddr>,
    metrics: Option<SocketAddr>,
    nbd: Option<SocketAddr>,
    tls: Option<Option<&std::path::Path>>,
    repl: Option<SocketAddr>,
) -> String {
    let sock = d.cfg.socket_path();
    let mut s = format!(
        "Tessera {} serving {}\n",
        env!("CARGO_PKG_VERSION"),
        d.cfg.state_dir.display()
    );
    s += &format!("  management API: unix:{}", sock.display());
    if let Some(a) = tcp {
        s += &format!(" and http://{a}");
        if d.cfg.api_token.is_none() {
            s += &format!(
                " (bearer token in {})",
                crate::api::auth::token_path(&d.cfg.state_dir).display()
            );
        } else {
            s += " (bearer token required)";
        }
    }
    s += "\n";
    if let Some(a) = tcp {
        // Listening on every address: this host's loopback one reaches it.
        let ip = match a.ip() {
            ip if ip.is_unspecified() => std::net::IpAddr::from([127, 0, 0, 1]),
            ip => ip,
        };
        let addr = SocketAddr::new(ip, a.port());
        s += &format!(
            "  dashboard: http://{addr}/ (log in with the API's bearer token, or to read only with the one in {})\n",
            crate::api::auth::viewer_token_path(&d.cfg.state_dir).display()
        );
    }
    if let Some(m) = metrics {
        s += &format!(
            "  metrics: http://{m}/metrics (bearer token in {}, or the API's)\n",
            crate::api::auth::scrape_token_path(&d.cfg.state_dir).display()
        );
    }
    let pools = d.list_pools();
    if pools.is_empty() {
        s += "  no pools yet: 'tessera pool create NAME --disk PATH...' makes one\n";
    }
    for p in &pools {
        let cap = p
            .capacity
            .map(|c| format_size(c.total_bytes))
            .unwrap_or_else(|| "-".into());
        s += &format!("  pool {}: {}, {} disk(s), {cap}\n", p.name, p.health, p.disks);
    }
    if let Ok(vs) = d.list_vdisks(None) {
        for v in vs {
            s += &format!(
                "  vdisk {}/{}: {}, {}, {}\n",
                v.pool,
                v.name,
                format_size(v.size),
                v.layout_description,
                v.provisioning.as_str()
            );
        }
    }
    let portals = d.portals.listening();
    for &a in &portals {
        s += &format!("  iSCSI portal: {a}\n");
    }
    match portals.first() {
        Some(a) => {
            for t in d.list_targets() {
                for l in &t.luns {
                    s += &format!("    iscsi://{a}/{}/{}  ->  {}\n", t.iqn, l.lun, l.vdisk);
                }
                if t.allow_any_initiator {
                    s += &format!(
                        "    {} admits any initiator that reaches a portal{}\n",
                        t.iqn,
                        if t.chap.is_some() {
                            " and passes CHAP"
                        } else {
                            " (no ACL, no CHAP)"
                        }
                    );
                } else if t.acl.is_empty() {
                    s += &format!("    {} admits no initiator yet: 'tessera target acl add'\n", t.iqn);
                }
            }
        }
        None => s += "  iSCSI portal: off\n",
    }
    for p in d.portals.list() {
        if let Some(e) = &p.error {
            s += &format!("  iSCSI portal {} is not listening: {e}\n", p.address);
        }
        if let Some(w) = &p.warning {
            s += &format!("  iSCSI portal {}: {w}\n", p.address);
        }
    }
    match nbd {
        Some(a) => {
            s += &format!("  NBD server: {a}\n");
            let insecure = d.cfg.nbd_insecure;
            if insecure {
                s += "    plain NBD, no TLS: anyone who can reach this address reads and writes every export\n";
            } else {
                match tls {
                    Some(Some(psk)) => {
                        s += &format!(
                            "    TLS required: nbds://tessera@{a}/NAME?tls-psk-file={}\n",
                            psk.display()
                        )
                    }
                    _ => s += &format!("    TLS required: nbds://{a}/NAME\n"),
                }
            }
            for e in d.list_nbd_exports() {
                let ro = if e.read_only { " (read-only)" } else { "" };
                if insecure {
                    s += &format!("    nbd://{a}/{}  ->  {}{ro}\n", e.name, e.vdisk);
                }
                match tls {
                    Some(Some(psk)) => {
                        s += &format!(
                            "    nbds://tessera@{a}/{}?tls-psk-file={}  ->  {}{ro}\n",
                            e.name,
                            psk.display(),
                            e.vdisk
                        )
                    }
                    Some(None) => s += &format!("    nbds://{a}/{}  ->  {}{ro}\n", e.name, e.vdisk),
                    None => {}
                }
            }
        }
        None => s += "  NBD server: off\n",
    }
    if let Some(p) = &d.cfg.nbd_unix_socket {
        s += &format!(
            "  NBD on {} (local clients): nbd+unix:///NAME?socket={}\n",
            p.display(),
            p.display()
        );
    }
    if let Some(a) = repl {
        s += &format!(
            "  replication: {a} (peers holding the key in {})\n",
            d.cfg.replication_psk_file.display()
        );
    }
    s += &format!(
        "Connect with:\n  export TESSERA_API=unix:{}\n  tessera pool list\n",
        sock.display()
    );
    s
}
