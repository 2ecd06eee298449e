//! What each command does: build the request, call the API, print the answer.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use tessera_server::config::LogFormat;
use tessera_server::jobs::{JobState, JobView};
use tessera_server::model::*;
use tessera_server::units::format_size;
use tessera_server::{Overrides, ServerConfig};

use crate::client::{encode_segment, Client, ClientError, Endpoint};
use crate::output::{kv, opt, opt_size, percent, size, table, when};
use crate::*;

mod dedup;
mod events;
mod exports;
mod jobs;
mod pools;
mod replicas;
mod vdisks;

use dedup::dedup;
use events::events;
use exports::{nbd, target};
use jobs::{follow, job};
use pools::{disk, pool};
use replicas::replica;
use vdisks::{snapshot, vdisk, vdisk_table};

pub fn run(cli: Cli) -> Result<(), String> {
    let Cli {
        api,
        client_state_dir,
        token,
        json,
        command,
    } = cli;
    if let Command::Serve(a) = command {
        return serve(a, client_state_dir);
    }
    if let Command::Bench(a) = command {
        return crate::bench::bench(*a, client_state_dir, json);
    }
    if let Command::Copy(a) = command {
        return crate::copy::copy(a, json);
    }
    let endpoint = endpoint(api.as_deref(), client_state_dir.as_deref())?;
    let token = match (&endpoint, token) {
        (Endpoint::Tcp(_), None) => token_from_state_dir(client_state_dir.as_deref()),
        (_, t) => t,
    };
    let c = Ctx {
        client: Client::new(endpoint, token)?,
        json,
    };
    let r = match command {
        Command::Serve(_) | Command::Bench(_) | Command::Copy(_) => unreachable!(),
        Command::Pool(p) => pool(&c, p),
        Command::Disk(d) => disk(&c, d),
        Command::Vdisk(v) => vdisk(&c, v),
        Command::Snapshot(v) => snapshot(&c, v),
        Command::Target(t) => target(&c, t),
        Command::Nbd(n) => nbd(&c, n),
        Command::Job(j) => job(&c, j),
        Command::Dedup(d) => dedup(&c, d),
        Command::Replica(r) => replica(&c, r),
        Command::Events(a) => events(&c, a),
    };
    r.map_err(|e| match e {
        ClientError::Api { message, code, .. } if code == "unauthorized" => message,
        e => e.to_string(),
    })
}

fn serve(a: ServeArgs, state_dir: Option<PathBuf>) -> Result<(), String> {
    let o = Overrides {
        state_dir,
        api_listen: a.api_listen,
        api_token: a.api_token,
        iscsi_listen: a.iscsi_listen,
        nbd_listen: a.nbd_listen,
        nbd_insecure: a.nbd_insecure,
        log_format: a.log_format.map(|f| match f {
            LogFormatArg::Text => LogFormat::Text,
            LogFormatArg::Json => LogFormat::Json,
        }),
        demo: a.demo,
    };
    let cfg = ServerConfig::load(a.config.as_deref(), o)?;
    tessera_server::serve::run(cfg)
}

fn endpoint(api: Option<&str>, state_dir: Option<&Path>) -> Result<Endpoint, String> {
    if let Some(a) = api {
        return Endpoint::parse(a);
    }
    if let Some(d) = state_dir {
        return Ok(Endpoint::Unix(d.join("api.sock")));
    }
    let candidates = [
        PathBuf::from("/var/lib/tessera/api.sock"),
        PathBuf::from("tessera-demo/api.sock"),
    ];
    for p in &candidates {
        if p.exists() {
            return Ok(Endpoint::Unix(std::path::absolute(p).unwrap_or(p.clone())));
        }
    }
    Err(
        "no tessera daemon found: neither /var/lib/tessera/api.sock nor ./tessera-demo/api.sock exists. \
         Start one with 'tessera serve' (or 'make demo'), or point at it with --api or TESSERA_API"
            .into(),
    )
}

/// The token a daemon made for its TCP listener, if this user can read it: in --state-dir,
/// else in the default state directories.
fn token_from_state_dir(state_dir: Option<&Path>) -> Option<String> {
    let dirs: Vec<PathBuf> = match state_dir {
        Some(d) => vec![d.to_path_buf()],
        None => vec![PathBuf::from("/var/lib/tessera"), PathBuf::from("tessera-demo")],
    };
    dirs.iter()
        .find_map(|d| std::fs::read_to_string(tessera_server::api::auth::token_path(d)).ok())
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
}

struct Ctx {
    client: Client,
    json: bool,
}

type R = Result<(), ClientError>;

impl Ctx {
    fn print_json(&self, v: &Value) {
        println!("{}", serde_json::to_string_pretty(v).expect("serializable"));
    }

    /// With --json, prints the daemon's answer as it came (fields a newer daemon adds
    /// included); otherwise reads it as the API's type and hands it to `human`.
    fn answer<T: DeserializeOwned>(&self, v: Value, human: impl FnOnce(T) -> R) -> R {
        if self.json {
            self.print_json(&v);
            return Ok(());
        }
        human(read(v)?)
    }
}

/// Reads an answer as the type the API documents for it.
fn read<T: DeserializeOwned>(v: Value) -> Result<T, ClientError> {
    serde_json::from_value(v).map_err(|e| {
        ClientError::Transport(format!(
            "the daemon's answer is not what this tessera expects ({e}); are the daemon and this client the same version?"
        ))
    })
}

/// A request body, from the API's type.
fn body<T: Serialize>(request: &T) -> Option<Value> {
    Some(serde_json::to_value(request).expect("request bodies serialize"))
}

/// Splits POOL/NAME.
fn pool_vdisk(s: &str) -> Result<(String, String), ClientError> {
    match s.split_once('/') {
        Some((p, v)) if !p.is_empty() && !v.is_empty() && !v.contains('/') => Ok((p.to_string(), v.to_string())),
        _ => Err(ClientError::Transport(format!(
            "'{s}' does not name a vdisk: write POOL/NAME, e.g. demo/vol1"
        ))),
    }
}

/// The daemon resolves paths itself: send them absolute.
fn abs(p: &Path) -> Result<String, ClientError> {
    std::path::absolute(p)
        .map(|p| p.display().to_string())
        .map_err(|e| ClientError::Transport(format!("{}: {e}", p.display())))
}
