//! The event log over HTTP: `GET /api/events` lists, `GET /api/events/stream` follows as
//! server-sent events (`text/event-stream`: one `id:`/`data:` block per event, the data the
//! event's JSON), the backlog after `?after=SEQ` first. Both take `after`,
//! `severity` (the least one), `pool`; the list also `limit`.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::Json;
use futures_util::Stream;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast::error::RecvError;

use crate::daemon::Daemon;
use crate::error::{ApiError, ApiResult};
use crate::events::{Event, Filter, Severity, KEEP_IN_MEMORY};

/// Events listed when no limit is given.
pub const DEFAULT_LIMIT: usize = 100;

/// What `GET /api/events` answers.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct EventList {
    /// Oldest first.
    pub events: Vec<Event>,
    /// The number the next event will have: `?after=` it, less one, lists only newer ones.
    pub next_seq: u64,
}

fn parse(q: Option<&str>, with_limit: bool) -> ApiResult<(Filter, usize)> {
    let mut f = Filter::default();
    let mut limit = DEFAULT_LIMIT;
    for pair in q.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let bad = |what: &str| ApiError::invalid(format!("query parameter {k}={v}: {what}"));
        match k {
            "after" => f.after = Some(v.parse().map_err(|_| bad("not an event number"))?),
            "limit" if with_limit => {
                limit = match v.parse() {
                    Ok(n @ 1..=KEEP_IN_MEMORY) => n,
                    _ => return Err(bad(&format!("a number from 1 to {KEEP_IN_MEMORY}"))),
                }
            }
            "severity" => f.min_severity = Some(Severity::parse(v).map_err(|e| bad(&e))?),
            // The dashboard's session key, for the guard (an EventSource sets no headers).
            "key" => {}
            "pool" => {
                tessera_pool::validate_name("pool", v).map_err(|e| bad(&e))?;
                f.pool = Some(v.to_string());
            }
            _ => {
                let known = if with_limit {
                    "after, limit, severity, pool"
                } else {
                    "after, severity, pool"
                };
                return Err(ApiError::invalid(format!("unknown query parameter '{k}' ({known})")));
            }
        }
    }
    Ok((f, limit))
}

pub async fn list_events(State(d): State<Arc<Daemon>>, RawQuery(q): RawQuery) -> ApiResult<Json<EventList>> {
    let (f, limit) = parse(q.as_deref(), true)?;
    Ok(Json(EventList {
        events: d.events.list(&f, limit),
        next_seq: d.events.next_seq(),
    }))
}

struct Following {
    d: Arc<Daemon>,
    filter: Filter,
    /// Events to send before waiting for new ones.
    backlog: std::vec::IntoIter<Event>,
    live: tokio::sync::broadcast::Receiver<Event>,
    closing: tokio::sync::watch::Receiver<bool>,
    /// The last event sent or passed over: nothing at or before it is sent again.
    last: u64,
}

impl Following {
    /// The events after `last` still in memory: for the start, and for a follower too slow
    /// for the live channel.
    fn refill(&mut self) {
        let f = Filter {
            after: Some(self.last),
            ..self.filter.clone()
        };
        self.backlog = self.d.events.list(&f, KEEP_IN_MEMORY).into_iter();
    }

    async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(e) = self.backlog.next() {
                self.last = e.seq;
                return Some(e);
            }
            let e = tokio::select! {
                r = self.live.recv() => r,
                _ = self.closing.wait_for(|c| *c) => return None,
            };
            match e {
                Ok(e) if e.seq <= self.last => {}
                Ok(e) => {
                    self.last = e.seq;
                    if self.filter.admits(&e) {
                        return Some(e);
                    }
                }
                Err(RecvError::Lagged(_)) => self.refill(),
                Err(RecvError::Closed) => return None,
            }
        }
    }
}

pub async fn stream_events(
    State(d): State<Arc<Daemon>>,
    headers: axum::http::HeaderMap,
    RawQuery(q): RawQuery,
) -> ApiResult<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>> {
    let (filter, _) = parse(q.as_deref(), false)?;
    // A browser's EventSource that reconnects says what it saw last: go on from there.
    let seen = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    // Where to start, then listen, then read the backlog from that start: an event recorded
    // in between is in the backlog, and its copy on the live channel is passed over.
    let last = match (filter.after, seen) {
        (Some(a), Some(s)) => a.max(s),
        (a, s) => a.or(s).unwrap_or_else(|| d.events.next_seq() - 1),
    };
    let live = d.events.follow();
    let closing = d.events.closing();
    let mut f = Following {
        last,
        d,
        filter,
        backlog: Vec::new().into_iter(),
        live,
        closing,
    };
    f.refill();
    let stream = futures_util::stream::unfold(f, |mut f| async move {
        let e = f.next().await?;
        let sse = SseEvent::default()
            .id(e.seq.to_string())
            .json_data(&e)
            .expect("serializable");
        Some((Ok(sse), f))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_checked() {
        let (f, l) = parse(Some("after=5&limit=20&severity=error&pool=tank"), true).unwrap();
        assert_eq!(
            (f.after, l, f.min_severity, f.pool.as_deref()),
            (Some(5), 20, Some(Severity::Error), Some("tank"))
        );
        for bad in [
            "after=x",
            "limit=0",
            "limit=100000",
            "severity=loud",
            "pool=a/b",
            "colour=red",
        ] {
            assert!(parse(Some(bad), true).is_err(), "{bad}");
        }
        assert!(parse(Some("limit=5"), false).is_err(), "a stream has no limit");
    }
}
