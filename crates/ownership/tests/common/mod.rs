//! What the ownership tests share: the etcd `scripts/test-scale-out.sh` starts.

/// The endpoints of the etcd to test against, or None (the test then says it was skipped, and
/// why).
pub fn endpoints(test: &str) -> Option<Vec<String>> {
    match std::env::var("TESSERA_ETCD_ENDPOINTS") {
        Ok(e) if !e.is_empty() => Some(e.split(',').map(String::from).collect()),
        _ => {
            tessera_disk::skip(
                test,
                "no etcd (TESSERA_ETCD_ENDPOINTS is empty: scripts/test-scale-out.sh sets it to the etcd it starts)",
            );
            None
        }
    }
}
