//! A gateway that proves itself to etcd with a user and password (etcd's RBAC), rather than
//! with a client certificate. The password buys a token, which etcd lets lapse (its
//! `--auth-token-ttl`, 5 minutes by default, counted from the last request that used it for
//! simple tokens, from the authentication for JWT ones), and etcd-client never buys another:
//! a gateway that owned its pools quietly for longer found its first transaction refused, at
//! the moment it had to take a pool over. The token is bought again on a period well inside
//! etcd's default TTL, and every request of the gateway's client carries the newest one.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::Client;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// How often a new token is bought by default: a tenth of etcd's default token TTL, so that
/// a few failures in a row (etcd electing a leader) still leave a valid one.
pub const TOKEN_PERIOD: Duration = Duration::from_secs(30);

/// An etcd user and its password.
#[derive(Clone)]
pub struct EtcdUser {
    pub name: String,
    pub password: String,
    /// How often a new token is bought: below etcd's `--auth-token-ttl`.
    pub token_period: Duration,
}

impl EtcdUser {
    pub fn new(name: impl Into<String>, password: impl Into<String>) -> EtcdUser {
        EtcdUser {
            name: name.into(),
            password: password.into(),
            token_period: TOKEN_PERIOD,
        }
    }
}

impl std::fmt::Debug for EtcdUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdUser")
            .field("name", &self.name)
            .field("token_period", &self.token_period)
            .finish_non_exhaustive()
    }
}

/// Whether `endpoint` (`http://host:port`, or `host:port`) is on this machine, where a
/// password sent in plain text does not cross a network.
pub fn is_loopback(endpoint: &str) -> bool {
    let authority = endpoint
        .strip_prefix("http://")
        .or_else(|| endpoint.strip_prefix("https://"))
        .unwrap_or(endpoint);
    let authority = authority.split('/').next().unwrap_or_default();
    if authority.contains('@') {
        return false; // user information: the host is after it, and whatever it is, refuse
    }
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// How soon a renewal that failed is tried again (etcd electing a leader, a timeout).
const RETRY: Duration = Duration::from_secs(2);

/// Buys `user` a new token every `token_period`, and soon when `now` is notified (etcd may
/// have restarted and forgotten it), for every clone of `client` (they share it). A failure
/// is logged and tried again soon; the token bought before still serves until it lapses.
pub fn keep_token(client: &Client, user: &EtcdUser, now: Arc<Notify>) -> JoinHandle<()> {
    let mut auth = client.auth_client();
    let user = user.clone();
    tokio::spawn(async move {
        let mut wait = user.token_period;
        let mut last = tokio::time::Instant::now();
        loop {
            // Until the period is up, or etcd may have forgotten the token; but not more
            // often than every RETRY, however often the lease's stream breaks (each token
            // costs etcd a proposal and a password hash).
            if tokio::time::timeout(wait, now.notified()).await.is_ok() {
                tokio::time::sleep_until(last + RETRY.min(user.token_period)).await;
            }
            last = tokio::time::Instant::now();
            let mut renewed = renew(&mut auth, &user).await;
            if renewed.as_ref().is_err_and(|e| token_unknown(e)) {
                // etcd refuses a request that carries a token it no longer knows (one that
                // lapsed while etcd did not answer, or that etcd forgot as it restarted), the
                // asking for a new one included: ask again with none. Only then, so that a
                // token that still works is not dropped for a failure that passes.
                auth.remove_client_auth();
                renewed = renew(&mut auth, &user).await;
            }
            wait = match renewed {
                Ok(()) => user.token_period,
                Err(e) => {
                    tracing::warn!(user = %user.name, error = %e, "cannot renew this gateway's etcd token; trying again");
                    RETRY.min(user.token_period)
                }
            };
        }
    })
}

/// How long the asking for a token may take: one that went to a member that stalls must not
/// hold the renewals up for as long as it stalls.
const ASKING: Duration = Duration::from_secs(4);

async fn renew(auth: &mut etcd_client::AuthClient, user: &EtcdUser) -> Result<(), String> {
    let asking = auth.set_client_auth(user.name.clone(), user.password.clone());
    match tokio::time::timeout(ASKING, asking).await {
        Ok(done) => done.map_err(|e| e.to_string()),
        Err(_) => Err(format!("etcd did not answer within {} s", ASKING.as_secs())),
    }
}

/// Whether etcd refused a request for its token: one it does not know, or no longer.
fn token_unknown(said: &str) -> bool {
    said.contains("invalid auth token") || said.contains("Unauthenticated")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_endpoints_are_told_apart() {
        for e in [
            "http://127.0.0.1:2379",
            "http://127.0.0.5:2379",
            "http://localhost:2379",
            "http://[::1]:2379",
            "https://127.0.0.1:2379/",
            "127.0.0.1:2379",
        ] {
            assert!(is_loopback(e), "{e}");
        }
        for e in [
            "http://10.0.0.5:2379",
            "http://etcd.example:2379",
            "http://[2001:db8::1]:2379",
            "http://127.0.0.1.example:2379",
            "10.0.0.5:2379",
            "unix://127.0.0.1:2379",
            "http://[::1]@10.0.0.5:2379",
            "http://127.0.0.1@10.0.0.5:2379",
        ] {
            assert!(!is_loopback(e), "{e}");
        }
    }

    #[test]
    fn a_user_does_not_show_its_password() {
        let u = EtcdUser::new("gw-a", "s3cret");
        assert!(!format!("{u:?}").contains("s3cret"));
    }
}
