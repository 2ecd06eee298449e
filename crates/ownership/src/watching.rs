//! Watches that notice when their etcd member stalls. A member that stops (SIGSTOP, a disk
//! that hangs, a machine paused) keeps its connections open and says nothing: a watch on it
//! waits for good, while the gateway's other requests go to the members that serve
//! (members.rs). A watch quiet for a while therefore asks its member how far it is (a
//! progress request, etcd 3.4 and later), which a member that serves answers at once; one
//! that does not answer in time is taken for stalled, and the watch ends, for its holder to
//! make again through the members that serve (or read what it waited for instead).
//!
//! etcd answers no progress request on a watch that starts ahead of its newest revision
//! (since its pull request 20229, backported to 3.4): every watch here made from a revision
//! starts at one already written, and passes over the events it saw before, but for the
//! watch of an answer, whose revision the ask's put writes at once (courier.rs).
//!
//! The answer to a progress request carries no event, and its revision is not used: etcd
//! 3.4 (before 3.4.25) answers with its newest revision even while the watch still catches
//! up, so it does not say that every event up to it was told.

use std::time::Duration;

use etcd_client::{Client, WatchOptions, WatchResponse, WatchStream, Watcher};

/// How long a watch that follows keys for as long as the gateway lives may be quiet before
/// it asks its member, and how long the member may take to answer.
pub(crate) const FOLLOWING: Patience = Patience {
    quiet: Duration::from_secs(2),
    answer: Duration::from_secs(1),
};

/// How long a watch may be quiet before it asks, and how long its member may then take.
#[derive(Clone, Copy, Debug)]
pub struct Patience {
    pub quiet: Duration,
    pub answer: Duration,
}

/// How long etcd may take to make a watch (or answer the request before one): the member a
/// new watch goes to may have stalled before the gateway found it so.
pub(crate) const MAKING: Duration = Duration::from_secs(3);

/// Watches `key` with `options`, or fails if etcd does not make the watch within `MAKING`.
pub(crate) async fn watch(client: &mut Client, key: &str, options: Option<WatchOptions>) -> crate::Result<Watch> {
    match tokio::time::timeout(MAKING, client.watch(key, options)).await {
        Ok(made) => Ok(made?.into()),
        Err(_) => Err(crate::OwnershipError::new(format!(
            "etcd did not make a watch of {key} within {MAKING:?}"
        ))),
    }
}

/// A watch, as made by `Client::watch`, and when its member last said something.
pub struct Watch {
    watcher: Watcher,
    events: WatchStream,
    heard: tokio::time::Instant,
    /// When the progress request not answered yet was sent.
    asked: Option<tokio::time::Instant>,
}

impl From<(Watcher, WatchStream)> for Watch {
    fn from((watcher, events): (Watcher, WatchStream)) -> Watch {
        Watch {
            watcher,
            events,
            heard: tokio::time::Instant::now(),
            asked: None,
        }
    }
}

impl Watch {
    /// The watch's next response (events, or the answer to a progress request, which has
    /// none); None once it ended, failed, or its member said nothing for `p.quiet` and then
    /// did not answer a progress request within `p.answer`. A caller may drop the future at
    /// any await (in a `select!`): the times run from the last response and the request
    /// sent, not from each call.
    pub async fn next(&mut self, p: Patience) -> Option<WatchResponse> {
        loop {
            let until = match self.asked {
                Some(at) => at + p.answer,
                None => self.heard + p.quiet,
            };
            match tokio::time::timeout_at(until, self.events.message()).await {
                Ok(r) => {
                    self.heard = tokio::time::Instant::now();
                    self.asked = None;
                    return r.ok().flatten();
                }
                Err(_) if self.asked.is_some() => {
                    tracing::warn!(
                        quiet = ?p.quiet,
                        "an etcd member answers neither events nor a progress request on a watch: taken for stalled"
                    );
                    return None;
                }
                // Into the stream's queue; a queue that stays full is a member that reads
                // nothing.
                Err(_) => match tokio::time::timeout(p.answer, self.watcher.request_progress()).await {
                    Ok(Ok(())) => self.asked = Some(tokio::time::Instant::now()),
                    _ => return None,
                },
            }
        }
    }
}
