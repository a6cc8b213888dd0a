//! `vgpu watch`'s metrics, end to end (as root, real cgroups, the simulated driver): the
//! endpoint is scraped with a real HTTP client (`ureq`), parsed with a Prometheus text-format
//! parser (`prometheus-parse`), and its figures are `vgpu ps --json`'s, `vgpu devices
//! --json`'s and `vgpu pool --json`'s; the node_exporter textfile says the same; only
//! `/metrics` answers; `listen = ""` listens nowhere; a port in use stops the start with one
//! line; SIGHUP moves the endpoint and the textfile; the memory audit's kills are counted.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use crate::common::{wait_for, Sim};
use prometheus_parse::{Sample, Scrape, Value};
use serde_json::Value as Json;

const TWO_A100: &[(&str, &str)] = &[("NVIDIA A100-SXM4-40GB", "40GiB"), ("NVIDIA A100-SXM4-40GB", "40GiB")];

fn hold_script() -> String {
    format!("{}/tests/fixtures/cuda_hold.py", concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

fn command(sim: &Sim, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vgpu"));
    cmd.arg("--simulate").args(args).env_remove("VGPU_SIMULATE").env("VGPU_LOG", "vgpu=warn");
    for (k, v) in sim.env() {
        cmd.env(k, v);
    }
    cmd
}

/// A workload holding `gib` GiB of device memory (through the shim, unless `prefix` runs it
/// without), until dropped.
struct Holder {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Holder {
    fn start(sim: &Sim, name: &str, run_args: &[&str], prefix: &[&str], gib: u32) -> Holder {
        let ready = sim.path(&format!("{name}.ready"));
        let (script, gib, ready_arg) = (hold_script(), gib.to_string(), ready.to_str().unwrap().to_string());
        let mut args = vec!["run", "--name", name];
        args.extend_from_slice(run_args);
        args.push("--");
        args.extend_from_slice(prefix);
        args.extend_from_slice(&["python3", &script, &gib, &ready_arg]);
        let mut child = command(sim, &args).stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        let stdin = child.stdin.take();
        // The fixture touches its ready file once it holds the memory.
        wait_for(&format!("{name} to allocate"), || ready.exists());
        Holder { child, stdin }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

/// A running `vgpu watch`, its stderr read line by line.
struct Watch {
    child: Child,
    lines: Receiver<String>,
    seen: Vec<String>,
    addr: Option<SocketAddr>,
}

impl Watch {
    /// Start it and wait for its `ready` line (printed after its first round, whose
    /// figures are then published).
    fn start(sim: &Sim) -> Watch {
        let mut child = command(sim, &["watch"]).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut watch = Watch { child, lines, seen: Vec::new(), addr: None };
        watch.expect("vgpu watch: ready");
        watch.addr = watch.seen.iter().find_map(|l| metrics_addr(l));
        watch
    }

    /// Wait for a line containing `needle` (20 s at most); returns it.
    fn expect(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => panic!("no line with {needle:?} from vgpu watch; it said:\n{}", self.seen.join("\n")),
            }
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr.expect("the watch serves metrics"))
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, signal) }, 0);
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.signal(libc::SIGTERM);
        let _ = self.child.wait();
    }
}

/// The address in `vgpu watch: metrics on http://ADDR/metrics`.
fn metrics_addr(line: &str) -> Option<SocketAddr> {
    line.split("metrics on http://").nth(1)?.strip_suffix("/metrics")?.parse().ok()
}

fn parse(text: &str) -> Scrape {
    Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("Prometheus text format")
}

/// A real HTTP client that gives up instead of hanging a test.
fn http() -> ureq::Agent {
    ureq::AgentBuilder::new().timeout(Duration::from_secs(10)).build()
}

fn scrape(url: &str) -> Scrape {
    let response = http().get(url).call().unwrap_or_else(|e| panic!("GET {url}: {e}"));
    assert_eq!(response.status(), 200);
    assert!(response.content_type().starts_with("text/plain"), "{}", response.content_type());
    parse(&response.into_string().unwrap())
}

fn find<'a>(s: &'a Scrape, metric: &str, labels: &[(&str, &str)]) -> Option<&'a Sample> {
    let matching: Vec<&Sample> =
        s.samples.iter().filter(|x| x.metric == metric && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v))).collect();
    assert!(matching.len() <= 1, "{metric}{labels:?} matches {} series", matching.len());
    matching.first().copied()
}

fn value(s: &Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    match find(s, metric, labels).unwrap_or_else(|| panic!("no {metric}{labels:?}")).value {
        Value::Gauge(v) | Value::Counter(v) | Value::Untyped(v) => v,
        ref other => panic!("{metric}: {other:?}"),
    }
}

fn config(listen: &str, textfile: &Path) -> String {
    format!(
        "[watch]\ninterval = \"200ms\"\nlisten = \"{listen}\"\ntextfile = \"{}\"\n\n[carbon]\nsource = \"static\"\nvalue = 250\nbudget_g_per_hour = 500\n",
        textfile.display()
    )
}

/// The listening TCP sockets process `pid` holds (from /proc: its socket inodes in LISTEN).
fn listening_sockets(pid: u32) -> usize {
    let inodes: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| l.to_str()?.strip_prefix("socket:[")?.strip_suffix(']').map(String::from))
        .collect();
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|t| std::fs::read_to_string(t).ok())
        .flat_map(|t| t.lines().skip(1).map(String::from).collect::<Vec<_>>())
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 9 && f[3] == "0A" && inodes.contains(f[9])
        })
        .count()
}

/// Every workload figure the scrape must share with `vgpu ps --json`.
fn assert_workloads_match_ps(s: &Scrape, ps: &[Json]) {
    assert!(!ps.is_empty());
    let ids: HashSet<&str> = s.samples.iter().filter(|x| x.metric == "vgpu_workload_info").filter_map(|x| x.labels.get("id")).collect();
    assert_eq!(ids, ps.iter().map(|w| w["id"].as_str().unwrap()).collect::<HashSet<_>>());
    for w in ps {
        let (id, name, user) = (w["id"].as_str().unwrap(), w["name"].as_str().unwrap(), w["user"].as_str().unwrap());
        let who = [("id", id), ("name", name), ("user", user)];
        let info = [("id", id), ("name", name), ("user", user), ("compute_policy", w["compute_policy"].as_str().unwrap())];
        assert_eq!(value(s, "vgpu_workload_info", &info), 1.0);
        for state in ["waiting", "starting", "running", "suspended"] {
            let want = if w["state"] == state { 1.0 } else { 0.0 };
            assert_eq!(value(s, "vgpu_workload_state", &[("id", id), ("user", user), ("state", state)]), want, "{name} {state}");
        }
        assert_eq!(value(s, "vgpu_workload_priority", &who), w["priority"].as_f64().unwrap());
        assert_eq!(value(s, "vgpu_workload_processes", &who), w["pids"].as_array().unwrap().len() as f64);
        match w["pool_blocks"].as_f64() {
            Some(blocks) => assert_eq!(value(s, "vgpu_workload_pool_blocks", &who), blocks),
            None => assert!(find(s, "vgpu_workload_pool_blocks", &who).is_none()),
        }
        for g in w["gpus"].as_array().unwrap() {
            let gpu = g["gpu_index"].to_string();
            let l = [("id", id), ("name", name), ("user", user), ("gpu", gpu.as_str())];
            assert_eq!(value(s, "vgpu_workload_memory_quota_bytes", &l), g["memory_quota_bytes"].as_f64().unwrap(), "{name}");
            assert_eq!(value(s, "vgpu_workload_memory_used_bytes", &l), g["memory_used_bytes"].as_f64().unwrap(), "{name}");
            assert_eq!(value(s, "vgpu_workload_memory_peak_bytes", &l), g["memory_peak_bytes"].as_f64().unwrap(), "{name}");
            assert_eq!(value(s, "vgpu_workload_compute_share_target_ratio", &l), g["compute_pct"].as_f64().unwrap() / 100.0, "{name}");
            // Both idle: no measured share on either side.
            assert!(g["compute_measured_pct"].is_null());
            assert!(find(s, "vgpu_workload_compute_share_measured_ratio", &l).is_none());
            assert_eq!(value(s, "vgpu_workload_gpu_time_seconds_total", &l), g["gpu_time_ns"].as_f64().unwrap() / 1e9);
        }
    }
}

#[test]
fn the_endpoint_and_the_textfile_say_what_ps_devices_and_pool_say() {
    let sim = Sim::new(TWO_A100);
    let textfile = sim.path("textfile/vgpu.prom");
    std::fs::create_dir(sim.path("textfile")).unwrap();
    sim.write_vgpu_config(&config("127.0.0.1:0", &textfile));
    let _held = Holder::start(&sim, "holder", &["--gpu", "1", "--mem", "4G", "--compute", "40"], &[], 2);
    let _pooled = Holder::start(&sim, "pooled", &["--mem", "2G", "--tflops", "10", "--priority", "60"], &[], 1);
    wait_for("both to be recorded running", || {
        sim.json(&["ps", "--json"])["workloads"].as_array().unwrap().iter().filter(|w| w["state"] == "running").count() == 2
    });
    // Caps set by carbon apply, which the metrics report (NVML cannot read them back). Once
    // the workloads run: starting one re-plans the caps for the config's budget.
    sim.json(&["carbon", "apply", "--json", "--intensity", "400", "--budget", "200"]);
    let applied: Json = serde_json::from_slice(&std::fs::read(sim.path("run/carbon-applied.json")).unwrap()).unwrap();
    let watch = Watch::start(&sim);
    assert_eq!(watch.seen.iter().filter(|l| metrics_addr(l).is_some()).count(), 1, "{:?}", watch.seen);
    assert_eq!(listening_sockets(watch.child.id()), 1);

    // The first round's figures are served as soon as the watch is ready; the workloads are
    // idle, so every figure compared is stable.
    let s = scrape(&watch.url("/metrics"));
    let ps = sim.json(&["ps", "--json"])["workloads"].clone();
    assert_workloads_match_ps(&s, ps.as_array().unwrap());

    let devices = sim.json(&["devices", "--json"])["gpus"].clone();
    let devices = devices.as_array().unwrap();
    assert_eq!(devices.len(), 2);
    for d in devices {
        let (gpu, uuid) = (d["index"].to_string(), d["uuid"].as_str().unwrap());
        let l = [("gpu", gpu.as_str()), ("uuid", uuid)];
        assert_eq!(value(&s, "vgpu_gpu_info", &[("gpu", gpu.as_str()), ("uuid", uuid), ("name", d["name"].as_str().unwrap())]), 1.0);
        assert_eq!(value(&s, "vgpu_gpu_memory_total_bytes", &l), d["memory_total_bytes"].as_f64().unwrap());
        assert_eq!(value(&s, "vgpu_gpu_memory_used_bytes", &l), d["memory_used_bytes"].as_f64().unwrap());
        assert_eq!(value(&s, "vgpu_gpu_sm_clock_max_hertz", &l), d["sm_clock_max_mhz"].as_f64().unwrap() * 1e6);
        assert_eq!(value(&s, "vgpu_gpu_processes", &l), d["processes"].as_array().unwrap().len() as f64);
        assert_eq!(value(&s, "vgpu_gpu_unmanaged_processes", &l), 0.0);
        let cap = applied.as_array().unwrap().iter().find(|a| a["uuid"] == uuid).expect("apply capped every GPU");
        assert_eq!(cap["cap"]["kind"], "locked-clocks", "{cap}");
        assert_eq!(value(&s, "vgpu_gpu_capped", &l), 1.0);
        assert_eq!(value(&s, "vgpu_gpu_clock_cap_hertz", &l), cap["cap"]["max_mhz"].as_f64().unwrap() * 1e6);
    }

    let pool = sim.json(&["pool", "--json"]);
    assert_eq!(value(&s, "vgpu_pool_blocks", &[]), pool["total_blocks"].as_f64().unwrap());
    assert_eq!(value(&s, "vgpu_pool_used_blocks", &[]), pool["used_blocks"].as_f64().unwrap());
    assert_eq!(value(&s, "vgpu_pool_used_blocks", &[]), 10.0);
    assert_eq!(value(&s, "vgpu_pool_priority_used_blocks", &[("priority", "60")]), 10.0);
    assert_eq!(value(&s, "vgpu_pool_workloads", &[("state", "running")]), 1.0);

    // Carbon: the budget from the config at once; the intensity once the background reading
    // is in, and with it the emission rate: the GPUs' power × the intensity.
    assert_eq!(value(&s, "vgpu_carbon_budget_grams_per_hour", &[]), 500.0);
    let mut s = s;
    wait_for("the carbon intensity to be read", || {
        s = scrape(&watch.url("/metrics"));
        find(&s, "vgpu_carbon_intensity_grams_per_kwh", &[]).is_some()
    });
    assert_eq!(value(&s, "vgpu_carbon_intensity_grams_per_kwh", &[("source", "static"), ("status", "fresh")]), 250.0);
    let power: f64 = s.samples.iter().filter(|x| x.metric == "vgpu_gpu_power_watts").map(|x| value(&s, &x.metric, &[("uuid", x.labels.get("uuid").unwrap())])).sum();
    assert!(power > 0.0);
    let rate = value(&s, "vgpu_carbon_emission_rate_grams_per_hour", &[]);
    assert!((rate - power / 1000.0 * 250.0).abs() < 1e-9, "{rate} vs {power} W");

    // The textfile: the same figures, mode 0644, nothing else left in its directory.
    let text = parse(&std::fs::read_to_string(&textfile).unwrap());
    assert_workloads_match_ps(&text, sim.json(&["ps", "--json"])["workloads"].clone().as_array().unwrap());
    assert_eq!(value(&text, "vgpu_pool_used_blocks", &[]), 10.0);
    assert_eq!(std::fs::metadata(&textfile).unwrap().permissions().mode() & 0o7777, 0o644);
    let names: Vec<_> = std::fs::read_dir(sim.path("textfile")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["vgpu.prom"]);
}

#[test]
fn only_get_and_head_of_metrics_answer_and_prometheus_gets_openmetrics() {
    let sim = Sim::new(TWO_A100);
    sim.write_vgpu_config(&config("127.0.0.1:0", &sim.path("vgpu.prom")));
    let watch = Watch::start(&sim);
    let url = watch.url("/metrics");
    for path in ["/", "/metric", "/metrics/x", "/other"] {
        match http().get(&watch.url(path)).call() {
            Err(ureq::Error::Status(404, _)) => {}
            other => panic!("GET {path}: {other:?}"),
        }
    }
    match http().post(&url).call() {
        Err(ureq::Error::Status(405, r)) => assert_eq!(r.header("Allow"), Some("GET, HEAD")),
        other => panic!("POST: {other:?}"),
    }
    let head = http().head(&url).call().unwrap();
    assert_eq!(head.status(), 200);
    assert!(head.into_string().unwrap().is_empty());
    let query = http().get(&format!("{url}?x=1")).call().unwrap();
    assert_eq!(query.status(), 200);
    // What Prometheus sends.
    let om = http().get(&url)
        .set("Accept", "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3,*/*;q=0.2")
        .call()
        .unwrap();
    assert!(om.content_type().starts_with("application/openmetrics-text"), "{}", om.content_type());
    let body = om.into_string().unwrap();
    assert!(body.ends_with("# EOF\n"));
    assert_eq!(value(&parse(&body), "vgpu_gpu_memory_total_bytes", &[("gpu", "0")]), (40u64 << 30) as f64);
}

#[test]
fn an_empty_listen_serves_nothing_but_the_textfile_is_written() {
    let sim = Sim::new(TWO_A100);
    let textfile = sim.path("vgpu.prom");
    sim.write_vgpu_config(&config("", &textfile));
    let watch = Watch::start(&sim);
    assert!(watch.seen.iter().all(|l| !l.contains("metrics on")), "{:?}", watch.seen);
    assert_eq!(listening_sockets(watch.child.id()), 0);
    let text = parse(&std::fs::read_to_string(&textfile).unwrap());
    assert_eq!(value(&text, "vgpu_gpu_memory_total_bytes", &[("gpu", "1")]), (40u64 << 30) as f64);
}

#[test]
fn a_port_in_use_stops_the_start_with_one_line() {
    let sim = Sim::new(TWO_A100);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    sim.write_vgpu_config(&config(&addr.to_string(), &sim.path("vgpu.prom")));
    let mut child = command(&sim, &["watch"]).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let mut exited = None;
    wait_for("vgpu watch to give up", || {
        exited = child.try_wait().unwrap();
        exited.is_some()
    });
    let out = child.wait_with_output().unwrap();
    assert_eq!(exited, Some(out.status));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains(&format!("cannot serve metrics on {addr}")) && stderr.contains("[watch] listen"), "{stderr}");
    assert!(!sim.path("vgpu.prom").exists());
}

#[test]
fn sighup_moves_the_endpoint_and_the_textfile() {
    let sim = Sim::new(TWO_A100);
    let (first, second) = (sim.path("first.prom"), sim.path("second.prom"));
    sim.write_vgpu_config(&config("127.0.0.1:0", &first));
    let mut watch = Watch::start(&sim);
    let old = watch.url("/metrics");
    scrape(&old);
    assert!(first.exists());

    sim.write_vgpu_config(&config("", &second));
    watch.signal(libc::SIGHUP);
    watch.expect("metrics endpoint stopped");
    watch.expect("reloaded the config");
    assert!(!first.exists(), "the old textfile is removed");
    // The endpoint's thread closes the port once it has seen the stop (nothing waits for it).
    wait_for("the old port to close", || listening_sockets(watch.child.id()) == 0);
    assert!(http().get(&old).call().is_err(), "the old endpoint is closed");
    wait_for("the new textfile", || second.exists());

    sim.write_vgpu_config(&config("127.0.0.1:0", &second));
    watch.signal(libc::SIGHUP);
    let line = watch.expect("metrics on http://");
    let addr = metrics_addr(&line).unwrap();
    let s = scrape(&format!("http://{addr}/metrics"));
    assert_eq!(value(&s, "vgpu_gpu_memory_total_bytes", &[("gpu", "0")]), (40u64 << 30) as f64);
}

#[test]
fn memory_kills_of_the_audit_are_counted_per_workload() {
    let sim = Sim::new(TWO_A100);
    sim.write_vgpu_config(&config("127.0.0.1:0", &sim.path("vgpu.prom")));
    let mut watch = Watch::start(&sim);
    // 3 GiB in a 1 GiB vGPU, unseen by the shim (LD_PRELOAD cleared): the audit kills it.
    let escaper = Holder::start(&sim, "escaper", &["--gpu", "0", "--mem", "1G"], &["env", "-u", "LD_PRELOAD"], 3);
    // "SIGKILL to pid N of workload escaper (ID): over memory quota …"
    let line = watch.expect("SIGKILL to pid");
    let id = line.split("workload escaper (").nth(1).and_then(|rest| rest.split(')').next()).expect("the workload's id").to_string();
    // The counter is bumped in the round that signalled, before its events are printed.
    let s = scrape(&watch.url("/metrics"));
    let labels = [("action", "kill"), ("reason", "memory"), ("id", id.as_str()), ("name", "escaper"), ("user", "root")];
    assert_eq!(value(&s, "vgpu_enforcements_total", &labels), 1.0);
    assert!(matches!(find(&s, "vgpu_enforcements_total", &labels).unwrap().value, Value::Counter(_)));
    drop(escaper);
}

/// What the endpoint answers to `request` sent raw on a fresh connection, read until it
/// closes the connection (10 s at most; a reset after an answer ends it too).
fn raw(addr: SocketAddr, request: &[u8]) -> String {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // The endpoint may answer and close before it has read all of a request it refuses.
    let _ = stream.write_all(request);
    let mut answer = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && !answer.is_empty() => break,
            Err(e) => panic!("{}: no answer, or the connection was kept open: {e}", String::from_utf8_lossy(request)),
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}

/// The status lines in a raw answer.
fn statuses(answer: &str) -> Vec<&str> {
    answer.lines().filter(|l| l.starts_with("HTTP/1.")).collect()
}

#[test]
fn sixteen_keep_alive_scrapers_are_all_answered() {
    let sim = Sim::new(TWO_A100);
    sim.write_vgpu_config(&config("127.0.0.1:0", &sim.path("vgpu.prom")));
    let watch = Watch::start(&sim);
    let url = watch.url("/metrics");
    let scrapers: Vec<_> = (0..16)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || {
                // One agent, one kept-alive connection, many requests.
                let agent = http();
                for _ in 0..25 {
                    let response = agent.get(&url).call().unwrap_or_else(|e| panic!("GET {url}: {e}"));
                    assert_eq!(response.status(), 200);
                    let text = response.into_string().unwrap();
                    assert_eq!(value(&parse(&text), "vgpu_gpu_memory_total_bytes", &[("gpu", "0")]), (40u64 << 30) as f64);
                }
            })
        })
        .collect();
    for s in scrapers {
        s.join().expect("a scraper failed");
    }
}

#[test]
fn smuggled_and_malformed_requests_are_refused_and_end_their_connection() {
    let sim = Sim::new(TWO_A100);
    sim.write_vgpu_config(&config("127.0.0.1:0", &sim.path("vgpu.prom")));
    let watch = Watch::start(&sim);
    let addr = watch.addr.expect("the watch serves metrics");
    // Content-Length and Transfer-Encoding together (CL.TE): one answer, then the
    // connection ends; the request hidden in the body is never answered.
    let answer = raw(
        addr,
        b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n",
    );
    assert_eq!(statuses(&answer).len(), 1, "{answer}");
    assert!(!answer.contains("404"), "{answer}");
    // Two different lengths: refused.
    let answer = raw(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 7\r\n\r\nGET / HTTP/1.1\r\n\r\n");
    assert_eq!(statuses(&answer), ["HTTP/1.1 400 Bad Request"], "{answer}");
    // Malformed: refused with a 4xx or 5xx, and the connection ends.
    for request in [
        &b"GARBAGE\r\n\r\n"[..],
        b"GET /metrics HTTP/9.9\r\nHost: x\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nNo colon here\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nX-Bad: a\0b\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
    ] {
        let answer = raw(addr, request);
        let found = statuses(&answer);
        assert!(
            found.len() == 1 && (found[0].starts_with("HTTP/1.1 4") || found[0].starts_with("HTTP/1.1 5")),
            "{}: {answer}",
            String::from_utf8_lossy(request)
        );
    }
    // A head longer than the endpoint reads: 431, closed.
    let mut long = b"GET /metrics HTTP/1.1\r\nX-Long: ".to_vec();
    long.resize(64 * 1024, b'a');
    long.extend_from_slice(b"\r\n\r\n");
    let answer = raw(addr, &long);
    assert!(answer.is_empty() || statuses(&answer) == ["HTTP/1.1 431 Request Header Fields Too Large"], "{answer}");
    // And the endpoint still serves.
    scrape(&watch.url("/metrics"));
}
