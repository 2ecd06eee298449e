//! Which etcd members a gateway's requests go to. etcd-client spreads them over every
//! endpoint it was given, whether its member can serve them or not: with one member of three
//! killed, a share of the gateway's requests failed at once ("connection refused"), taking a
//! pool over among them. Every member is asked for its status each second, all at once, each
//! on a connection of its own. A member that cannot serve is taken out of the spread, and put
//! back once it can again. With none that can, every member is in the spread: requests then
//! fail, or wait for a member to come back, rather than have nowhere to go.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use tokio::task::JoinHandle;

/// How often each member is asked, and how long its answer may take.
const EVERY: Duration = Duration::from_secs(1);
const ANSWER: Duration = Duration::from_millis(800);

/// The endpoint as etcd-client keys it in its spread: with its scheme, as it adds one to an
/// endpoint given without (`https://` when TLS is set up).
pub(crate) fn full_endpoint(e: &str, tls: bool) -> String {
    if e.starts_with("http://") || e.starts_with("https://") {
        e.to_string()
    } else if tls {
        format!("https://{e}")
    } else {
        format!("http://{e}")
    }
}

/// The newest raft term in which a leader is known to this gateway: heard from the members
/// when asked how they stand, or in the answer to a renewal of the lease. An answer in an older
/// term comes from a member that has not heard of that leader: a leader deposed while it
/// stalled, or a follower that still sends what it is asked to one, which renews the lease
/// in its own memory only (the new leader never sees the renewal).
#[derive(Clone, Debug, Default)]
pub(crate) struct Terms(Arc<AtomicU64>);

impl Terms {
    /// A leader is known in `term`.
    pub(crate) fn heard(&self, term: u64) {
        self.0.fetch_max(term, Ordering::Relaxed);
    }

    /// Whether an answer in `term` may be trusted (and then its term is heard).
    pub(crate) fn current(&self, term: u64) -> bool {
        self.0.fetch_max(term, Ordering::Relaxed) <= term
    }
}

/// What a member said to a status request.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Heard {
    /// It is a voting member that knows a leader, in raft term `term`; `leads` if it is that
    /// leader.
    Serves { term: u64, leads: bool },
    /// etcd refused to say (etcd 3.5.28 and later want a login for a member's status): the
    /// member is up, though how it stands is not known.
    Refuses,
    /// Nothing in time, no connection; or it knows no leader, or is a learner (which takes
    /// almost no request).
    Cannot,
}

/// Which members requests should go to: those that serve, but a leader in a term older than
/// one heard (resumed from a stall, it answers in the term it was stopped in until it hears
/// of the new one, and may answer a lease's renewal that the new leader never sees; a
/// follower that has not heard of the new term yet serves all the same), and those that
/// refuse to say; every member when none of them does.
fn spread_to(heard: &[Heard]) -> Vec<bool> {
    let newest = heard
        .iter()
        .filter_map(|h| match h {
            Heard::Serves { term, .. } => Some(*term),
            _ => None,
        })
        .max();
    let to: Vec<bool> = heard
        .iter()
        .map(|h| match h {
            Heard::Serves { term, leads } => !leads || Some(*term) == newest,
            Heard::Refuses => true,
            Heard::Cannot => false,
        })
        .collect();
    if to.iter().any(|&t| t) {
        to
    } else {
        vec![true; heard.len()]
    }
}

/// Keeps `client`'s spread to the members of `endpoints` that can serve, asking each through
/// a client of its own made with `options` (TLS, no user).
pub(crate) fn keep_members(
    client: Client,
    endpoints: Vec<String>,
    options: Option<ConnectOptions>,
    terms: Terms,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut probes: Vec<Option<Client>> = vec![None; endpoints.len()];
        let mut spread = vec![true; endpoints.len()];
        let mut none_served = false;
        loop {
            let round = tokio::time::Instant::now();
            let asked = endpoints
                .iter()
                .zip(probes.iter_mut())
                .map(|(e, probe)| hear(e, probe, &options));
            let heard = futures_util::future::join_all(asked).await;
            for h in &heard {
                if let Heard::Serves { term, .. } = h {
                    terms.heard(*term);
                }
            }
            let to = spread_to(&heard);
            let none_serves = heard.iter().all(|h| *h == Heard::Cannot);
            if none_serves != none_served {
                if none_serves {
                    tracing::warn!("no etcd member answers as one that serves: requests go to every one of them");
                } else {
                    tracing::info!("an etcd member serves again");
                }
                none_served = none_serves;
            }
            // Adds before removes, so that the spread is never empty between the two; no
            // removes if the adds failed and none would be left.
            for add in [true, false] {
                if !add && !(0..endpoints.len()).any(|k| spread[k] && to[k]) {
                    break;
                }
                for (k, e) in endpoints.iter().enumerate() {
                    if to[k] != add || spread[k] == add {
                        continue;
                    }
                    // The change waits for room in a channel that the client drains only as
                    // requests flow: an idle gateway must not hang here.
                    let change = if add {
                        tokio::time::timeout(ANSWER, client.add_endpoint(e)).await
                    } else {
                        tokio::time::timeout(ANSWER, client.remove_endpoint(e)).await
                    };
                    match change {
                        Ok(Ok(())) => {
                            spread[k] = add;
                            tracing::info!(endpoint = %e, heard = ?heard[k], "etcd member {}", if add { "can serve: requests go to it" } else { "cannot serve: requests go to the others" });
                        }
                        Ok(Err(err)) => {
                            tracing::warn!(endpoint = %e, error = %err, "cannot change which etcd members requests go to")
                        }
                        Err(_) => tracing::warn!(endpoint = %e, "changing which etcd members requests go to timed out"),
                    }
                }
            }
            tokio::time::sleep_until(round + EVERY).await;
        }
    })
}

/// What the member at `endpoint` says to a status request within `ANSWER`.
async fn hear(endpoint: &str, probe: &mut Option<Client>, options: &Option<ConnectOptions>) -> Heard {
    if probe.is_none() {
        let connect = Client::connect([endpoint], options.clone());
        match tokio::time::timeout(ANSWER, connect).await {
            Ok(Ok(c)) => *probe = Some(c),
            _ => return Heard::Cannot,
        }
    }
    let c = probe.as_mut().expect("made above");
    match tokio::time::timeout(ANSWER, c.status()).await {
        // An alarm (a full disk, a corrupt store) is the cluster's, listed by every member:
        // it tells none from another.
        Ok(Ok(s)) if s.leader() != 0 && !s.is_learner() => Heard::Serves {
            term: s.raft_term(),
            leads: s.header().is_some_and(|h| h.member_id() == s.leader()),
        },
        Ok(Err(e)) if refused(&e) => Heard::Refuses,
        _ => Heard::Cannot,
    }
}

/// Whether `e` is etcd's refusal, not the want of an answer: a member without a login gets
/// "user name is empty" (InvalidArgument; Unknown from etcds that pass the error on as it
/// is), one whose certificate names no user "user name not found" (FailedPrecondition), a
/// user who is not root PermissionDenied.
fn refused(e: &etcd_client::Error) -> bool {
    use tonic::Code;
    match e {
        etcd_client::Error::GRpcStatus(s) => match s.code() {
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => false,
            Code::Unknown => s.message().starts_with("etcdserver:") || s.message().starts_with("auth:"),
            _ => true,
        },
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Heard::*;

    fn follows(term: u64) -> Heard {
        Serves { term, leads: false }
    }

    fn leads(term: u64) -> Heard {
        Serves { term, leads: true }
    }

    #[test]
    fn requests_go_to_the_members_that_serve_but_a_deposed_leader() {
        assert_eq!(spread_to(&[leads(7), Cannot, follows(7)]), [true, false, true]);
        // A leader resumed from a stall, still in the term it was stopped in.
        assert_eq!(spread_to(&[leads(7), leads(8), follows(8)]), [false, true, true]);
        // A follower that has not heard of the new term yet serves all the same.
        assert_eq!(spread_to(&[follows(7), leads(8), follows(8)]), [true, true, true]);
        // A member that wants a login to say how it stands is up: it keeps its requests.
        assert_eq!(spread_to(&[Refuses, Refuses, Cannot]), [true, true, false]);
        assert_eq!(spread_to(&[leads(3), Refuses, Cannot]), [true, true, false]);
    }

    #[test]
    fn an_answer_in_a_term_older_than_a_known_leaders_is_not_trusted() {
        let terms = Terms::default();
        assert!(terms.current(7));
        // The members say a leader was elected in term 8: an answer from a member that has
        // not heard of it is not trusted, one from a member that has is.
        terms.clone().heard(8);
        assert!(!terms.current(7));
        assert!(terms.current(8));
        // A later answer's term is heard too; a member's older one changes nothing.
        assert!(terms.current(9));
        terms.heard(8);
        assert!(!terms.current(8));
        assert!(terms.current(9));
    }

    #[test]
    fn a_refusal_is_told_from_the_want_of_an_answer() {
        use tonic::{Code, Status};
        let said = |code, message: &str| etcd_client::Error::GRpcStatus(Status::new(code, message));
        for e in [
            said(Code::InvalidArgument, "etcdserver: user name is empty"),
            said(Code::Unknown, "auth: user name is empty"),
            said(Code::FailedPrecondition, "etcdserver: user name not found"),
            said(Code::PermissionDenied, "etcdserver: permission denied"),
            said(Code::Unauthenticated, "etcdserver: invalid auth token"),
        ] {
            assert!(refused(&e), "{e}");
        }
        for e in [
            said(Code::Unavailable, "tcp connect error: Connection refused"),
            said(Code::DeadlineExceeded, "deadline has elapsed"),
            said(Code::Cancelled, "operation was canceled"),
            said(Code::Unknown, "transport error"),
            etcd_client::Error::EndpointError("no endpoint".into()),
        ] {
            assert!(!refused(&e), "{e}");
        }
    }

    #[test]
    fn with_no_member_that_serves_requests_go_to_every_one() {
        assert_eq!(spread_to(&[Cannot, Cannot, Cannot]), [true, true, true]);
        assert_eq!(spread_to(&[Cannot]), [true]);
    }

    /// The spread is keyed by the endpoint's URI: the one given to `remove_endpoint` must be
    /// the one etcd-client made of the endpoint it was given (it adds `http://`, or
    /// `https://` with TLS set up, to one given without a scheme).
    #[test]
    fn endpoints_are_named_as_the_client_names_them() {
        for (given, tls, full) in [
            ("h:1", false, "http://h:1"),
            ("h:1", true, "https://h:1"),
            ("http://h:1", false, "http://h:1"),
            ("https://h:1", true, "https://h:1"),
        ] {
            assert_eq!(full_endpoint(given, tls), full);
        }
    }
}
