//! A real browser for the console tests: Debian's headless Chromium,
//! driven over the DevTools protocol (JSON over a WebSocket) with the
//! smallest client that does: launch with `--remote-debugging-port=0`,
//! read the port and the browser's WebSocket path from the
//! `DevToolsActivePort` file Chromium writes, open a page target and attach
//! to it (`Target.createTarget`, `Target.attachToTarget` with `flatten`),
//! then send commands and read their answers on that one WebSocket
//! (RFC 6455 framing: masked client frames, unmasked server frames, no
//! extensions).
//!
//! `CHROMIUM` names another binary (default `/usr/bin/chromium`;
//! `scripts/ensure-services.sh --ops-tools` installs it).

#![allow(dead_code)]

use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One headless Chromium with one page, removed (process and profile) on
/// drop.
pub struct Browser {
    child: Child,
    profile: PathBuf,
    socket: TcpStream,
    next_id: u64,
    /// The DevTools session of the page.
    session: Option<String>,
}

impl Browser {
    /// Starts Chromium on a fresh profile and connects to its page.
    pub async fn launch() -> Self {
        Self::launch_with(&[]).await
    }

    /// [`Browser::launch`] with more command-line switches (say
    /// `--host-resolver-rules=MAP name 127.0.0.1`, a DNS name of the
    /// test's choosing for the console's address).
    pub async fn launch_with(switches: &[&str]) -> Self {
        let binary = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
        assert!(
            std::path::Path::new(&binary).exists(),
            "{binary} not found: run scripts/ensure-services.sh --ops-tools (installs Debian's chromium)"
        );
        let profile =
            std::env::temp_dir().join(format!("ot-chromium-{}", uuid::Uuid::new_v4().simple()));
        // Chromium's own temporary files (its process-singleton socket
        // directory, which only a graceful exit removes) go inside the
        // profile, so they are removed with it.
        let tmp = profile.join("tmp");
        std::fs::create_dir_all(&tmp).unwrap();
        let child = Command::new(&binary)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-dev-shm-usage",
                "--remote-debugging-port=0",
                "--window-size=1280,900",
            ])
            .args(switches)
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .env("TMPDIR", &tmp)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own process group, so that its helpers (zygote, renderer,
            // GPU) are stopped with it and none writes to the profile
            // after it is removed.
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("start {binary}: {e}"));
        let (port, path) = devtools_endpoint(&profile).await;
        let socket = websocket_connect(port, &path).await;
        let mut browser = Self {
            child,
            profile,
            socket,
            next_id: 0,
            session: None,
        };
        let target = browser
            .call("Target.createTarget", json!({"url": "about:blank"}))
            .await;
        let attached = browser
            .call(
                "Target.attachToTarget",
                json!({"targetId": target["targetId"], "flatten": true}),
            )
            .await;
        browser.session = Some(
            attached["sessionId"]
                .as_str()
                .expect("a session id")
                .to_owned(),
        );
        browser
    }

    /// Sends one DevTools command (to the page once attached) and returns
    /// its `result` (events that arrive meanwhile are skipped).
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        let reply = self.reply(method, params).await;
        assert!(reply["error"].is_null(), "{method} failed: {reply}");
        reply["result"].clone()
    }

    /// Sends one DevTools command and returns the whole reply, an error
    /// included.
    async fn reply(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({"id": id, "method": method, "params": params});
        if let Some(session) = &self.session {
            message["sessionId"] = json!(session);
        }
        let message = message.to_string();
        send_text(&mut self.socket, message.as_bytes()).await;
        loop {
            let text = tokio::time::timeout(Duration::from_secs(60), read_text(&mut self.socket))
                .await
                .unwrap_or_else(|_| panic!("no answer to {method} within 60 s"));
            let reply: Value = serde_json::from_str(&text).expect("DevTools sends JSON");
            if reply["id"] == id {
                return reply;
            }
        }
    }

    /// Evaluates `expression` in the page and returns its value. An
    /// evaluation the page cut short by navigating (a click's or a form's
    /// navigation still under way: "Inspected target navigated or closed")
    /// is tried again on the new page, a few times.
    pub async fn eval(&mut self, expression: &str) -> Value {
        let params = json!({"expression": expression, "returnByValue": true});
        for _ in 0..50 {
            let reply = self.reply("Runtime.evaluate", params.clone()).await;
            let navigated = reply["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("navigated or closed"));
            if navigated {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            assert!(reply["error"].is_null(), "Runtime.evaluate failed: {reply}");
            let result = &reply["result"];
            assert!(
                result["exceptionDetails"].is_null(),
                "{expression}: {result}"
            );
            return result["result"]["value"].clone();
        }
        panic!("{expression}: the page kept navigating for 5 s");
    }

    /// Navigates to `url` and waits until the page there has loaded.
    pub async fn goto(&mut self, url: &str) {
        self.call("Page.navigate", json!({"url": url})).await;
        self.wait_loaded(url).await;
    }

    /// Waits until the page's text contains `needle`.
    pub async fn wait_text(&mut self, needle: &str) {
        for _ in 0..600 {
            if self.text().await.contains(needle) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let at = self.eval("location.href").await;
        panic!("the page never said {needle:?} within 60 s (at {at})");
    }

    /// Waits until the page at an address starting with `prefix` has loaded
    /// (after a navigation or a form submission). A page already at such an
    /// address counts: after a form on `/console/parked` that leads to
    /// `/console`, wait for what the new page says instead
    /// ([`Browser::wait_text`]).
    pub async fn wait_loaded(&mut self, prefix: &str) {
        let check = format!(
            "location.href.startsWith({}) && document.readyState === 'complete'",
            json!(prefix)
        );
        for _ in 0..600 {
            if self.eval(&check).await == Value::Bool(true) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let at = self.eval("location.href").await;
        panic!("the page did not load {prefix} within 60 s (at {at})");
    }

    /// The page's visible text (empty while a navigation has no body yet).
    pub async fn text(&mut self) -> String {
        self.eval("document.body ? document.body.innerText : ''")
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// How many elements match a CSS selector.
    pub async fn count(&mut self, selector: &str) -> u64 {
        self.eval(&format!(
            "document.querySelectorAll({}).length",
            json!(selector)
        ))
        .await
        .as_u64()
        .unwrap_or(0)
    }

    /// Clicks the first element matching `selector` (as a user would: the
    /// element's own click, so a submit button submits its form with its
    /// name and value).
    pub async fn click(&mut self, selector: &str) {
        let clicked = self
            .eval(&format!(
                "(() => {{ const e = document.querySelector({}); if (!e) return false; e.click(); return true; }})()",
                json!(selector)
            ))
            .await;
        assert_eq!(clicked, Value::Bool(true), "nothing matches {selector}");
    }

    /// Types `value` into the first input matching `selector`.
    pub async fn fill(&mut self, selector: &str, value: &str) {
        let filled = self
            .eval(&format!(
                "(() => {{ const e = document.querySelector({}); if (!e) return false; e.value = {}; return true; }})()",
                json!(selector),
                json!(value)
            ))
            .await;
        assert_eq!(filled, Value::Bool(true), "no input matches {selector}");
    }

    /// Runs `source` in every page this browser loads from now on, before
    /// the page's own content (DevTools' injection, which the page's
    /// Content-Security-Policy does not stop).
    pub async fn before_each_page(&mut self, source: &str) {
        self.call("Page.enable", json!({})).await;
        self.call(
            "Page.addScriptToEvaluateOnNewDocument",
            json!({ "source": source }),
        )
        .await;
    }

    /// A PNG of the page as it is, at `width` x `height` CSS pixels.
    pub async fn screenshot(&mut self, width: u32, height: u32) -> Vec<u8> {
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false}),
        )
        .await;
        let shot = self
            .call("Page.captureScreenshot", json!({"format": "png"}))
            .await;
        // Back to the window's own size for what follows.
        self.call("Emulation.clearDeviceMetricsOverride", json!({}))
            .await;
        base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().expect("screenshot data"))
            .expect("screenshot is base64")
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The whole group: killing Chromium alone left its helpers to write
        // into the profile after it was removed, so a profile directory
        // stayed behind in /tmp now and then.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
        for _ in 0..20 {
            if std::fs::remove_dir_all(&self.profile).is_ok() || !self.profile.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Where Chromium's DevTools endpoint listens: it writes the port and the
/// browser's WebSocket path to `DevToolsActivePort` in the profile once
/// the endpoint is up.
async fn devtools_endpoint(profile: &std::path::Path) -> (u16, String) {
    let file = profile.join("DevToolsActivePort");
    for _ in 0..600 {
        if let Ok(text) = std::fs::read_to_string(&file) {
            let mut lines = text.lines();
            if let (Some(Ok(port)), Some(path)) = (lines.next().map(str::parse), lines.next()) {
                return (port, path.to_owned());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("Chromium did not open its DevTools endpoint within 60 s");
}

/// Opens the WebSocket: an HTTP/1.1 upgrade answered with 101.
async fn websocket_connect(port: u16, path: &str) -> TcpStream {
    let mut socket = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n\
         Connection: Upgrade\r\nSec-WebSocket-Key: b3JkZXItdGltZW91dC10ZXN0\r\n\
         Sec-WebSocket-Version: 13\r\n\r\n"
    );
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        socket.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "no WebSocket: {head}");
    socket
}

/// Sends one text frame (FIN, opcode 1), masked as a client must.
async fn send_text(socket: &mut TcpStream, payload: &[u8]) {
    let mut frame = vec![0x81u8];
    let mask_bit = 0x80u8;
    match payload.len() {
        n if n < 126 => frame.push(mask_bit | n as u8),
        n if n <= 0xffff => {
            frame.push(mask_bit | 126);
            frame.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            frame.push(mask_bit | 127);
            frame.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    let mask: [u8; 4] = rand_mask();
    frame.extend_from_slice(&mask);
    frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    socket.write_all(&frame).await.unwrap();
}

fn rand_mask() -> [u8; 4] {
    let bytes = uuid::Uuid::new_v4().into_bytes();
    [bytes[0], bytes[1], bytes[2], bytes[3]]
}

/// Reads one whole text message (joining continuation frames; control
/// frames in between are skipped).
async fn read_text(socket: &mut TcpStream) -> String {
    let mut message = Vec::new();
    loop {
        let mut head = [0u8; 2];
        socket.read_exact(&mut head).await.expect("DevTools socket");
        let fin = head[0] & 0x80 != 0;
        let opcode = head[0] & 0x0f;
        let len = match head[1] & 0x7f {
            126 => {
                let mut n = [0u8; 2];
                socket.read_exact(&mut n).await.unwrap();
                u64::from(u16::from_be_bytes(n))
            }
            127 => {
                let mut n = [0u8; 8];
                socket.read_exact(&mut n).await.unwrap();
                u64::from_be_bytes(n)
            }
            n => u64::from(n),
        };
        let mut payload = vec![0u8; len as usize];
        socket.read_exact(&mut payload).await.unwrap();
        match opcode {
            0x8 => panic!("Chromium closed the DevTools socket"),
            0x9 | 0xa => continue,
            _ => message.extend_from_slice(&payload),
        }
        if fin {
            return String::from_utf8(message).expect("text frames are UTF-8");
        }
    }
}
