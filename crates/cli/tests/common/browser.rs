//! A headless Chromium driven over WebDriver (Debian `chromium` and `chromium-driver`), for
//! the tests that look at the dashboard.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};

use super::Resp;

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// One WebDriver request. chromedriver keeps connections open whatever the request asks, so
/// the answer is read to its Content-Length, not to the end of the stream.
pub fn wd(addr: &str, method: &str, path: &str, body: Option<&str>) -> Resp {
    use std::io::{BufRead, BufReader, Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let body = body.unwrap_or("");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut r = BufReader::new(s);
    let mut status_line = String::new();
    r.read_line(&mut status_line).unwrap();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut len = 0usize;
    loop {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().unwrap();
            }
        }
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf).unwrap();
    Resp {
        status,
        body: String::from_utf8_lossy(&buf).into_owned(),
        head: String::new(),
    }
}

/// A WebDriver session with chromedriver: the few W3C WebDriver commands the test needs,
/// spoken as JSON over HTTP.
pub struct Browser {
    driver: Child,
    addr: String,
    session: String,
}

impl Browser {
    pub fn start() -> Browser {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (Debian chromium-driver) is installed by scripts/install-deps.sh test");
        let addr = format!("127.0.0.1:{port}");
        let t = Instant::now();
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(t.elapsed() < Duration::from_secs(20), "chromedriver did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut b = Browser {
            driver,
            addr,
            session: String::new(),
        };
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1400,1000", "--lang=en-GB"]
            }
        }}});
        let v = b.call("POST", "/session", Some(caps));
        b.session = v["sessionId"].as_str().expect("a session").to_string();
        b
    }

    /// Logs in to the dashboard at `api` with `token`, and waits for the overview.
    pub fn log_in(&self, api: &str, token: &str) {
        self.go(&format!("http://{api}/"));
        self.type_in("#token", token);
        self.click("#login");
        self.find("#health");
    }

    pub fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let body = body.map(|b| b.to_string());
        let r = wd(&self.addr, method, path, body.as_deref());
        let v: Value = serde_json::from_str(&r.body).unwrap_or(Value::Null);
        assert_eq!(r.status, 200, "WebDriver {method} {path}: {}", r.body);
        v["value"].clone()
    }

    pub fn cmd(&self, method: &str, what: &str, body: Option<Value>) -> Value {
        self.call(method, &format!("/session/{}{what}", self.session), body)
    }

    pub fn go(&self, url: &str) {
        self.cmd("POST", "/url", Some(json!({ "url": url })));
    }

    pub fn script(&self, js: &str) -> Value {
        self.cmd("POST", "/execute/sync", Some(json!({"script": js, "args": []})))
    }

    /// The element `css` selects, waiting up to 20 s for it.
    pub fn find(&self, css: &str) -> String {
        let t = Instant::now();
        loop {
            let body = json!({"using": "css selector", "value": css}).to_string();
            let path = format!("/session/{}/element", self.session);
            let r = wd(&self.addr, "POST", &path, Some(&body));
            if r.status == 200 {
                let v: Value = serde_json::from_str(&r.body).unwrap();
                return v["value"][ELEMENT].as_str().unwrap().to_string();
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "no element '{css}' on the page: {}",
                self.text("body")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Clicks `css`; again if the page redrew it between finding and clicking (it redraws
    /// every 2 s).
    pub fn click(&self, css: &str) {
        for _ in 0..20 {
            let e = self.find(css);
            let path = format!("/session/{}/element/{e}/click", self.session);
            let r = wd(&self.addr, "POST", &path, Some("{}"));
            if r.status == 200 {
                return;
            }
            assert!(r.body.contains("stale element"), "click {css}: {}", r.body);
        }
        panic!("'{css}' kept being redrawn");
    }

    pub fn type_in(&self, css: &str, text: &str) {
        let e = self.find(css);
        self.cmd("POST", &format!("/element/{e}/clear"), Some(json!({})));
        self.cmd("POST", &format!("/element/{e}/value"), Some(json!({ "text": text })));
    }

    pub fn select(&self, css: &str, value: &str) {
        self.find(css);
        let js = format!(
            "const s = document.querySelector({css:?}); s.value = {value:?}; s.dispatchEvent(new Event('change')); return s.value;"
        );
        assert_eq!(self.script(&js), json!(value));
    }

    /// The text of `css`, or "" when nothing matches.
    pub fn text(&self, css: &str) -> String {
        let js = format!("const e = document.querySelector({css:?}); return e ? e.innerText : '';");
        self.script(&js).as_str().unwrap_or_default().to_string()
    }

    /// Waits up to `secs` for the text of `css` to contain `want`.
    pub fn wait_text(&self, css: &str, want: &str, secs: u64) {
        let t = Instant::now();
        loop {
            let got = self.text(css);
            if got.contains(want) {
                return;
            }
            assert!(
                t.elapsed() < Duration::from_secs(secs),
                "'{css}' never showed '{want}'; it shows '{got}'; the page: {}",
                self.text("body")
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn screenshot(&self, name: &str, dir: &std::path::Path) {
        let png = self.cmd("GET", "/screenshot", None);
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap())
            .unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        std::fs::write(dir.join(format!("{name}.png")), bytes).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = wd(&self.addr, "DELETE", &format!("/session/{}", self.session), None);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
