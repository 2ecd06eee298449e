//! A small blocking client of the management API, over the daemon's unix socket or TCP.

use std::path::PathBuf;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tessera_server::ErrorBody;

/// Where the daemon is.
#[derive(Debug, Clone)]
pub enum Endpoint {
    Unix(PathBuf),
    Tcp(String),
}

impl Endpoint {
    /// `unix:/path/api.sock`, a bare path to a socket, or `http://HOST:PORT`.
    pub fn parse(s: &str) -> Result<Endpoint, String> {
        if let Some(p) = s.strip_prefix("unix:") {
            return Ok(Endpoint::Unix(PathBuf::from(p)));
        }
        if let Some(rest) = s.strip_prefix("http://") {
            let authority = rest.trim_end_matches('/');
            if authority.is_empty() || authority.contains('/') {
                return Err(format!("'{s}' is not an API address: write http://HOST:PORT"));
            }
            return Ok(Endpoint::Tcp(authority.to_string()));
        }
        if s.starts_with("https://") {
            return Err("the API speaks plain HTTP; put a TLS proxy in front of it for remote use".into());
        }
        if s.starts_with('/') {
            return Ok(Endpoint::Unix(PathBuf::from(s)));
        }
        Err(format!(
            "'{s}' is not an API address: write unix:/path/to/api.sock or http://HOST:PORT"
        ))
    }

    pub fn describe(&self) -> String {
        match self {
            Endpoint::Unix(p) => format!("unix:{}", p.display()),
            Endpoint::Tcp(a) => format!("http://{a}"),
        }
    }
}

#[derive(Debug)]
pub enum ClientError {
    /// The daemon answered with an error.
    Api { code: String, message: String },
    /// The daemon could not be reached or answered nonsense.
    Transport(String),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Api { message, .. } => write!(f, "{message}"),
            ClientError::Transport(m) => write!(f, "{m}"),
        }
    }
}

pub struct Client {
    rt: tokio::runtime::Runtime,
    endpoint: Endpoint,
    token: Option<String>,
}

impl Client {
    pub fn new(endpoint: Endpoint, token: Option<String>) -> Result<Client, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the runtime: {e}"))?;
        Ok(Client { rt, endpoint, token })
    }

    pub fn get(&self, path: &str) -> Result<Value, ClientError> {
        self.call("GET", path, None)
    }

    pub fn post(&self, path: &str, body: Option<Value>) -> Result<Value, ClientError> {
        self.call("POST", path, body)
    }

    pub fn put(&self, path: &str, body: Option<Value>) -> Result<Value, ClientError> {
        self.call("PUT", path, body)
    }

    pub fn delete(&self, path: &str) -> Result<Value, ClientError> {
        self.call("DELETE", path, None)
    }

    /// Sends one request on a fresh connection; returns the JSON body (`null` for none).
    pub fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, ClientError> {
        self.rt.block_on(self.call_async(method, path, body))
    }

    /// GETs `path` and hands each line of the answer to `line` as it arrives, until the
    /// daemon ends the answer or `line` returns false. For streams (server-sent events).
    pub fn stream_lines(&self, path: &str, mut line: impl FnMut(&str) -> bool) -> Result<(), ClientError> {
        self.rt.block_on(async {
            let resp = self.send("GET", path, None).await?;
            let status = resp.status().as_u16();
            let mut body = resp.into_body();
            if !(200..300).contains(&status) {
                let data = body
                    .collect()
                    .await
                    .map_err(|e| ClientError::Transport(format!("reading the daemon's answer: {e}")))?
                    .to_bytes();
                return Err(error_of(status, &data));
            }
            let mut pending: Vec<u8> = Vec::new();
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| ClientError::Transport(format!("the stream broke: {e}")))?;
                let Some(data) = frame.data_ref() else { continue };
                pending.extend_from_slice(data);
                while let Some(i) = pending.iter().position(|&b| b == b'\n') {
                    let l: Vec<u8> = pending.drain(..=i).collect();
                    let text = String::from_utf8_lossy(&l[..i]);
                    if !line(text.trim_end_matches('\r')) {
                        return Ok(());
                    }
                }
            }
            Ok(())
        })
    }

    /// Sends one request on a fresh connection and returns the response, its body unread.
    async fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, ClientError> {
        let unreachable = |e: &dyn std::fmt::Display| {
            ClientError::Transport(format!(
                "cannot reach the tessera daemon at {}: {e}. Is it running ('tessera serve')? \
                 Choose another with --api or TESSERA_API",
                self.endpoint.describe()
            ))
        };
        let (host, mut sender) = match &self.endpoint {
            Endpoint::Unix(p) => {
                let s = tokio::net::UnixStream::connect(p).await.map_err(|e| unreachable(&e))?;
                let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
                    .await
                    .map_err(|e| unreachable(&e))?;
                tokio::spawn(conn);
                ("localhost".to_string(), sender)
            }
            Endpoint::Tcp(a) => {
                let s = tokio::net::TcpStream::connect(a.as_str())
                    .await
                    .map_err(|e| unreachable(&e))?;
                let _ = s.set_nodelay(true);
                let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
                    .await
                    .map_err(|e| unreachable(&e))?;
                tokio::spawn(conn);
                (a.clone(), sender)
            }
        };
        let mut req = Request::builder().method(method).uri(path).header("host", host);
        if let Some(t) = &self.token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let bytes = match body {
            Some(v) => {
                req = req.header("content-type", "application/json");
                Bytes::from(serde_json::to_vec(&v).expect("serializable"))
            }
            None => Bytes::new(),
        };
        let req = req
            .body(Full::new(bytes))
            .map_err(|e| ClientError::Transport(e.to_string()))?;
        sender.send_request(req).await.map_err(|e| unreachable(&e))
    }

    async fn call_async(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, ClientError> {
        let resp = self.send(method, path, body).await?;
        let status = resp.status().as_u16();
        let data = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| ClientError::Transport(format!("reading the daemon's answer: {e}")))?
            .to_bytes();
        if (200..300).contains(&status) {
            if data.is_empty() {
                return Ok(Value::Null);
            }
            return serde_json::from_slice(&data)
                .map_err(|e| ClientError::Transport(format!("the daemon's answer is not JSON: {e}")));
        }
        Err(error_of(status, &data))
    }
}

/// The error an answer other than 2xx carries.
fn error_of(status: u16, data: &[u8]) -> ClientError {
    match serde_json::from_slice::<ErrorBody>(data) {
        Ok(b) => ClientError::Api {
            code: b.error.code,
            message: b.error.message,
        },
        Err(_) => ClientError::Transport(format!(
            "the daemon answered HTTP {status}: {}",
            String::from_utf8_lossy(data).trim()
        )),
    }
}

/// Percent-encodes a path segment (a disk path used as a disk name, say).
pub fn encode_segment(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert!(matches!(
            Endpoint::parse("unix:/run/t.sock").unwrap(),
            Endpoint::Unix(_)
        ));
        assert!(matches!(Endpoint::parse("/run/t.sock").unwrap(), Endpoint::Unix(_)));
        match Endpoint::parse("http://127.0.0.1:8484/").unwrap() {
            Endpoint::Tcp(a) => assert_eq!(a, "127.0.0.1:8484"),
            e => panic!("{e:?}"),
        }
        assert!(Endpoint::parse("https://x").unwrap_err().contains("TLS"));
        assert!(Endpoint::parse("ftp://x").is_err());
        assert!(Endpoint::parse("http://h/x").is_err());
    }

    #[test]
    fn encoding() {
        assert_eq!(encode_segment("/srv/d 1.img"), "%2Fsrv%2Fd%201.img");
        assert_eq!(encode_segment("3f2a-b"), "3f2a-b");
    }
}
