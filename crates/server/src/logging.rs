//! Structured logs on stderr: readable on a terminal, plain under journald (which adds its own
//! timestamps), or JSON lines. `TESSERA_LOG` filters, as `RUST_LOG` does (default `info`).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_env("TESSERA_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let under_journald = std::env::var_os("JOURNAL_STREAM").is_some();
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let r = match format {
        LogFormat::Json => b.json().flatten_event(true).try_init(),
        LogFormat::Text if under_journald => b.without_time().with_ansi(false).with_target(false).try_init(),
        LogFormat::Text => b
            .with_ansi(std::io::stderr().is_terminal())
            .with_target(false)
            .try_init(),
    };
    // A second init (tests) keeps the first subscriber.
    let _ = r;
}
