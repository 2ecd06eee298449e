//! TLS for NBD, started by NBD_OPT_STARTTLS as nbdkit and qemu-nbd offer it and libnbd speaks
//! it (`nbds://` URIs): pre-shared keys in the format of GnuTLS's psktool (`user:hexkey`
//! lines; libnbd's `tls-psk-file`), and X.509 certificates, with client certificates required
//! when a CA is given. OpenSSL does the work: rustls has no external pre-shared keys, which
//! are what the NBD tools use most.

use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::Arc;

use openssl::ssl::{SslAcceptor, SslFiletype, SslMethod, SslStream, SslVerifyMode, SslVersion};
pub use tessera_psk::{create_psk_file, read_psk_file};

/// Where the keys and certificates are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsConfig {
    /// `user:hexkey` lines, as `psktool -u USER -p FILE` writes them.
    pub psk_file: Option<PathBuf>,
    /// The server's certificate chain and private key, PEM.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// When set, clients must present a certificate this CA signed.
    pub ca: Option<PathBuf>,
}

impl TlsConfig {
    pub fn is_empty(&self) -> bool {
        self.psk_file.is_none() && self.cert.is_none()
    }
}

/// Ready to take TLS connections.
pub struct TlsServer {
    acceptor: SslAcceptor,
    /// The users of the pre-shared keys, for messages.
    pub psk_users: Vec<String>,
}

/// TLS 1.2 suites that use a pre-shared key (TLS 1.3's suites work with one as they are),
/// then the usual certificate suites.
const CIPHERS: &str = "ECDHE-PSK-CHACHA20-POLY1305:PSK-AES256-GCM-SHA384:PSK-AES128-GCM-SHA256:\
                       PSK-CHACHA20-POLY1305:ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:\
                       ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:\
                       ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305";

impl TlsServer {
    pub fn new(c: &TlsConfig) -> Result<Arc<TlsServer>, String> {
        if c.is_empty() {
            return Err("TLS needs a pre-shared key file or a certificate and its key".into());
        }
        if c.cert.is_some() && c.ca.is_none() {
            // A client may then choose a certificate suite, which checks nobody: any client
            // that completes TLS would be let in, a pre-shared key or not.
            return Err("a TLS certificate needs a CA to check the clients' certificates by (without one, any client that completes TLS would be let in); a pre-shared key alone needs no certificate".into());
        }
        let ssl = |what: &str, e: openssl::error::ErrorStack| format!("{what}: {e}");
        let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server()).map_err(|e| ssl("TLS", e))?;
        b.set_min_proto_version(Some(SslVersion::TLS1_2))
            .map_err(|e| ssl("TLS", e))?;
        b.set_cipher_list(CIPHERS).map_err(|e| ssl("TLS ciphers", e))?;
        let mut psk_users = Vec::new();
        if let Some(p) = &c.psk_file {
            let keys = read_psk_file(p)?;
            psk_users = keys.keys().cloned().collect();
            psk_users.sort();
            tessera_psk::set_server_keys(&mut b, keys);
        }
        match (&c.cert, &c.key) {
            (Some(cert), Some(key)) => {
                b.set_certificate_chain_file(cert)
                    .map_err(|e| ssl(&format!("certificate {}", cert.display()), e))?;
                b.set_private_key_file(key, SslFiletype::PEM)
                    .map_err(|e| ssl(&format!("private key {}", key.display()), e))?;
                b.check_private_key()
                    .map_err(|e| ssl("the private key does not match the certificate", e))?;
            }
            (None, None) => {}
            _ => return Err("a TLS certificate needs its private key, and the key its certificate".into()),
        }
        if let Some(ca) = &c.ca {
            b.set_ca_file(ca).map_err(|e| ssl(&format!("CA {}", ca.display()), e))?;
            b.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
        }
        Ok(Arc::new(TlsServer {
            acceptor: b.build(),
            psk_users,
        }))
    }

    /// The server side of a TLS handshake on `s`.
    pub fn accept(&self, s: TcpStream) -> Result<SslStream<TcpStream>, String> {
        self.acceptor.accept(s).map_err(|e| format!("TLS handshake: {e}"))
    }
}
