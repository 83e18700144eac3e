use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use createos_sim::{SimConfig, Simulator};
use reqwest::blocking::{Client, RequestBuilder, Response};
use serde_json::Value;

/// The soak test takes this exclusively (it counts process-wide fds and
/// children); every other test shares it.
static SERIAL: RwLock<()> = RwLock::new(());

pub fn shared() -> RwLockReadGuard<'static, ()> {
    SERIAL.read().unwrap_or_else(|e| e.into_inner())
}

pub fn exclusive() -> RwLockWriteGuard<'static, ()> {
    SERIAL.write().unwrap_or_else(|e| e.into_inner())
}

pub fn fast_config() -> SimConfig {
    SimConfig {
        create_delay: Duration::from_millis(20),
        pause_delay: Duration::from_millis(20),
        resume_delay: Duration::from_millis(20),
        rate_limit: None,
        ..SimConfig::default()
    }
}

pub struct Api {
    pub sim: Simulator,
    pub client: Client,
    pub base: String,
}

impl Api {
    pub fn start(cfg: SimConfig) -> Api {
        let sim = Simulator::start(cfg).expect("start simulator");
        let base = format!("{}/v1", sim.url());
        let client = Client::builder()
            .timeout(Duration::from_secs(30))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        Api { sim, client, base }
    }

    pub fn req(&self, method: reqwest::Method, path: &str) -> RequestBuilder {
        self.client.request(method, format!("{}{}", self.base, path)).header("X-Api-Key", self.sim.api_key())
    }

    pub fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut r = self.req(method, path);
        if let Some(b) = body {
            r = r.json(&b);
        }
        let resp = r.send().expect("request");
        let status = resp.status().as_u16();
        let v = resp.json::<Value>().unwrap_or(Value::Null);
        (status, v)
    }

    pub fn get(&self, path: &str) -> (u16, Value) {
        self.call(reqwest::Method::GET, path, None)
    }
    pub fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.call(reqwest::Method::POST, path, Some(body))
    }
    pub fn delete(&self, path: &str) -> (u16, Value) {
        self.call(reqwest::Method::DELETE, path, None)
    }

    pub fn status(&self, id: &str) -> String {
        let (s, v) = self.get(&format!("/sandboxes/{id}"));
        assert_eq!(s, 200, "{v}");
        v["data"]["status"].as_str().unwrap().to_string()
    }

    pub fn wait_status(&self, id: &str, want: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let s = self.status(id);
            if s == want {
                return;
            }
            assert!(Instant::now() < deadline, "{id} stuck in {s}, wanted {want}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn create_running(&self) -> String {
        let (s, v) =
            self.post("/sandboxes", serde_json::json!({"shape": "s-1vcpu-1gb", "ingress_enabled": false}));
        assert_eq!(s, 200, "{v}");
        let id = v["data"]["id"].as_str().unwrap().to_string();
        self.wait_status(&id, "running");
        id
    }

    pub fn exec(&self, id: &str, script: &str) -> Value {
        let (s, v) = self.post(
            &format!("/sandboxes/{id}/exec"),
            serde_json::json!({"cmd": "/bin/bash", "args": ["-c", script]}),
        );
        assert_eq!(s, 200, "{v}");
        v["data"]["result"].clone()
    }

    pub fn spawn(&self, id: &str, script: &str) -> String {
        let (s, v) = self.post(
            &format!("/sandboxes/{id}/processes"),
            serde_json::json!({"cmd": "/bin/bash", "args": ["-c", script]}),
        );
        assert_eq!(s, 200, "{v}");
        v["data"]["process_id"].as_str().unwrap().to_string()
    }

    pub fn connect(&self, id: &str, pid: &str, after: u64) -> Response {
        self.req(reqwest::Method::GET, &format!("/sandboxes/{id}/processes/{pid}/connect?after={after}"))
            .send()
            .expect("connect")
    }
}

/// Read an NDJSON stream to its end: the frames, and whether it ended cleanly.
pub fn read_frames(resp: Response) -> (Vec<Value>, bool) {
    let body = resp.bytes();
    match body {
        Ok(b) => {
            let frames = b
                .split(|c| *c == b'\n')
                .filter(|l| !l.is_empty())
                .map(|l| serde_json::from_slice(l).expect("frame"))
                .collect();
            (frames, true)
        }
        Err(_) => (Vec::new(), false),
    }
}

/// Concatenated decoded data of `stream` frames.
pub fn data_of(frames: &[Value], stream: &str) -> String {
    use base64::Engine as _;
    let mut out = Vec::new();
    for f in frames {
        if f["type"] == "data" && f["stream"] == stream {
            out.extend(
                base64::engine::general_purpose::STANDARD.decode(f["data_base64"].as_str().unwrap()).unwrap(),
            );
        }
    }
    String::from_utf8(out).unwrap()
}

/// Poll `f` until true or the deadline.
pub fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Pids of processes whose command line starts with `needle`.
pub fn pids_with_cmdline(needle: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if let Ok(c) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            let c = String::from_utf8_lossy(&c).replace('\0', " ");
            if c.starts_with(needle) {
                out.push(pid);
            }
        }
    }
    out
}
