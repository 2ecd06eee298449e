//! Which etcd members a gateway's requests go to. etcd-client spreads them over every
//! endpoint it was given, whether its member answers or not: with one member of three
//! killed, a share of the gateway's requests failed at once ("connection refused"), taking a
//! pool over among them. Each member is asked for its status every second, on a connection
//! of its own; one that does not answer is taken out of the spread, and put back once it
//! answers again. The last one is never taken out: with every member down, requests fail at
//! once rather than wait for one to come back.

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

/// Keeps `client`'s spread to the members of `endpoints` that answer, asking each through a
/// client of its own made with `options` (TLS, no user: a member's status needs none).
pub(crate) fn keep_members(client: Client, endpoints: Vec<String>, options: Option<ConnectOptions>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut probes: Vec<Option<Client>> = vec![None; endpoints.len()];
        let mut spread = vec![true; endpoints.len()];
        loop {
            tokio::time::sleep(EVERY).await;
            let mut answers = Vec::with_capacity(endpoints.len());
            for (e, probe) in endpoints.iter().zip(probes.iter_mut()) {
                answers.push(answers_now(e, probe, &options).await);
            }
            let any = answers.iter().any(|&a| a);
            for (k, e) in endpoints.iter().enumerate() {
                let change = match (spread[k], answers[k]) {
                    (true, false) if any => client.remove_endpoint(e).await,
                    (false, true) => client.add_endpoint(e).await,
                    _ => continue,
                };
                match change {
                    Ok(()) => {
                        spread[k] = answers[k];
                        tracing::info!(endpoint = %e, answers = answers[k], "etcd member {}", if answers[k] { "answers again: requests go to it" } else { "does not answer: requests go to the others" });
                    }
                    Err(err) => {
                        tracing::warn!(endpoint = %e, error = %err, "cannot change which etcd members requests go to")
                    }
                }
            }
            // Every member down: all of them back in the spread, so that requests fail at
            // once, and go through as soon as any member comes back.
            if !any {
                for (k, e) in endpoints.iter().enumerate() {
                    if !spread[k] && client.add_endpoint(e).await.is_ok() {
                        spread[k] = true;
                    }
                }
            }
        }
    })
}

/// Whether the member at `endpoint` answers a status request within `ANSWER`.
async fn answers_now(endpoint: &str, probe: &mut Option<Client>, options: &Option<ConnectOptions>) -> bool {
    if probe.is_none() {
        let connect = Client::connect([endpoint], options.clone());
        match tokio::time::timeout(ANSWER, connect).await {
            Ok(Ok(c)) => *probe = Some(c),
            _ => return false,
        }
    }
    let c = probe.as_mut().expect("made above");
    matches!(tokio::time::timeout(ANSWER, c.status()).await, Ok(Ok(_)))
}
