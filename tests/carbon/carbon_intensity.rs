//! `vgpu carbon intensity`: every source, against a local HTTP server serving recorded
//! response bodies (tests/fixtures/carbon), including errors, a timeout, a 500, malformed
//! JSON and a null `actual`; the remembered reading and the fallback.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::common::{files_below, Sim};

fn fixture(name: &str) -> String {
    let path = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join("tests/fixtures/carbon").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()))
}

#[derive(Clone)]
struct Reply {
    status: u16,
    body: String,
    delay: Duration,
}

fn ok(body: String) -> Reply {
    Reply { status: 200, body, delay: Duration::ZERO }
}

fn status(status: u16, body: String) -> Reply {
    Reply { status, body, delay: Duration::ZERO }
}

/// A one-thread HTTP/1.1 server on 127.0.0.1 that answers by request path (query included)
/// and records every request head. It stops when dropped, or by itself after 30 s.
struct Server {
    addr: SocketAddr,
    routes: Arc<Mutex<Vec<(String, Reply)>>>,
    requests: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    fn start(routes: Vec<(&str, Reply)>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("address");
        let routes = Arc::new(Mutex::new(routes.into_iter().map(|(p, r)| (p.to_string(), r)).collect::<Vec<_>>()));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, q, s) = (routes.clone(), requests.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(30);
            while !s.load(Ordering::SeqCst) && Instant::now() < deadline {
                match listener.accept() {
                    Ok((stream, _)) => serve(stream, &r, &q),
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Server { addr, routes, requests, stop, thread: Some(thread) }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn set(&self, path: &str, reply: Reply) {
        let mut routes = self.routes.lock().unwrap();
        routes.retain(|(p, _)| p != path);
        routes.push((path.to_string(), reply));
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(stream: TcpStream, routes: &Mutex<Vec<(String, Reply)>>, requests: &Mutex<Vec<String>>) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let mut reader = BufReader::new(stream);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) if line == "\r\n" => break,
            Ok(_) => head.push_str(&line),
        }
    }
    requests.lock().unwrap().push(head.clone());
    let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
    let reply = routes.lock().unwrap().iter().find(|(p, _)| *p == path).map(|(_, r)| r.clone());
    let reply = reply.unwrap_or_else(|| status(404, "{\"error\":\"no such route\"}".into()));
    std::thread::sleep(reply.delay);
    let mut stream = reader.into_inner();
    let text = format!(
        "HTTP/1.1 {} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
        reply.status,
        reply.body.len(),
        reply.body
    );
    let _ = stream.write_all(text.as_bytes());
    let _ = stream.flush();
    let mut rest = [0u8; 64];
    let _ = stream.set_read_timeout(Some(Duration::from_millis(50)));
    let _ = stream.read(&mut rest);
}

fn sim_with(config: &str) -> Sim {
    let sim = Sim::new(&[("NVIDIA H100 80GB HBM3", "80GiB")]);
    sim.write_vgpu_config(config);
    sim
}

/// stderr of a failing `vgpu carbon intensity`, checked to be one line.
fn failure(sim: &Sim, code: i32) -> String {
    let out = sim.vgpu(&["carbon", "intensity", "--json"]).output().expect("run vgpu");
    assert_eq!(out.status.code(), Some(code), "stdout: {}", String::from_utf8_lossy(&out.stdout));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    err
}

#[test]
fn electricitymaps_latest_with_token() {
    let server =
        Server::start(vec![("/v3/carbon-intensity/latest?zone=DE", ok(fixture("electricitymaps-latest-DE.json")))]);
    let sim = Sim::new(&[("NVIDIA H100 80GB HBM3", "80GiB")]);
    std::fs::write(sim.path("token"), "s3cret\n").unwrap();
    sim.write_vgpu_config(&format!(
        "[carbon]\nsource = \"electricitymaps\"\nzone = \"DE\"\ntoken_file = \"{}\"\nbase_url = \"{}\"\n",
        sim.path("token").display(),
        server.url()
    ));
    let got = sim.json(&["carbon", "intensity", "--json"]);
    assert_eq!(got["intensity_g_per_kwh"], 302.0);
    assert_eq!(got["source"], "electricitymaps zone DE");
    assert_eq!(got["status"], "fresh");
    assert_eq!(got["timestamp_unix_ms"], 1_524_679_620_350i64, "2018-04-25T18:07:00.350Z");
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    assert!(requests[0].to_ascii_lowercase().contains("auth-token: s3cret\r\n"), "{}", requests[0]);
}

#[test]
fn electricitymaps_errors() {
    let server = Server::start(vec![
        ("/v3/carbon-intensity/latest?zone=DE", status(401, fixture("electricitymaps-401.json"))),
        ("/v3/carbon-intensity/latest?zone=XX", ok(fixture("electricitymaps-latest-null.json"))),
    ]);
    let sim =
        sim_with(&format!("[carbon]\nsource = \"electricitymaps\"\nzone = \"DE\"\nbase_url = \"{}\"\n", server.url()));
    let err = failure(&sim, 1);
    assert!(err.contains("HTTP 401: Invalid auth-token: The provided token is invalid"), "{err}");
    assert!(err.contains("set [carbon] fallback, or pass --intensity"), "{err}");
    sim.write_vgpu_config(&format!(
        "[carbon]\nsource = \"electricitymaps\"\nzone = \"XX\"\nbase_url = \"{}\"\n",
        server.url()
    ));
    let err = failure(&sim, 1);
    assert!(err.contains("carbonIntensity is null: no value for zone XX"), "{err}");
}

#[test]
fn uk_grid_national_regional_and_null_actual() {
    let server = Server::start(vec![
        ("/intensity", ok(fixture("uk-intensity.json"))),
        ("/regional/postcode/RG10", ok(fixture("uk-regional-postcode-RG10.json"))),
        ("/regional/regionid/13", ok(fixture("uk-regional-regionid-13.json"))),
    ]);
    let base = format!("[carbon]\nsource = \"uk-grid\"\nbase_url = \"{}\"\n", server.url());
    let sim = sim_with(&base);
    let got = sim.json(&["carbon", "intensity", "--json"]);
    assert_eq!((got["intensity_g_per_kwh"].as_f64(), got["source"].as_str()), (Some(263.0), Some("uk-grid national")), "actual wins");
    assert_eq!(got["timestamp_unix_ms"], 1_516_449_600_000i64, "2018-01-20T12:00:00Z");

    server.set("/intensity", ok(fixture("uk-intensity-actual-null.json")));
    assert_eq!(sim.json(&["carbon", "intensity", "--json"])["intensity_g_per_kwh"], 146.0, "null actual: the forecast");

    sim.write_vgpu_config(&format!("{base}postcode = \"rg10\"\n"));
    let got = sim.json(&["carbon", "intensity", "--json"]);
    assert_eq!((got["intensity_g_per_kwh"].as_f64(), got["source"].as_str()), (Some(198.0), Some("uk-grid postcode RG10")));

    sim.write_vgpu_config(&format!("{base}region_id = 13\n"));
    let got = sim.json(&["carbon", "intensity", "--json"]);
    assert_eq!((got["intensity_g_per_kwh"].as_f64(), got["source"].as_str()), (Some(231.0), Some("uk-grid region 13")));
}

#[test]
fn uk_grid_error_body_500_malformed_and_timeout() {
    let server = Server::start(vec![("/regional/postcode/ZZ99", status(400, fixture("uk-error-400.json")))]);
    let base = format!("[carbon]\nsource = \"uk-grid\"\nbase_url = \"{}\"\ntimeout = \"300ms\"\n", server.url());
    let sim = sim_with(&format!("{base}postcode = \"ZZ99\"\n"));
    let err = failure(&sim, 1);
    assert!(err.contains("HTTP 400: 400 Bad Request: Please enter a valid postcode"), "{err}");

    sim.write_vgpu_config(&base);
    server.set("/intensity", status(500, "<html><body>Internal Server Error</body></html>".into()));
    let err = failure(&sim, 1);
    assert!(err.contains("/intensity answered HTTP 500: <html><body>Internal Server Error"), "{err}");

    server.set("/intensity", ok(fixture("malformed.json")));
    let err = failure(&sim, 1);
    assert!(err.contains("malformed response from http://127.0.0.1:"), "{err}");

    server.set("/intensity", Reply { delay: Duration::from_millis(1500), ..ok(fixture("uk-intensity.json")) });
    let started = Instant::now();
    let err = failure(&sim, 1);
    assert!(err.contains("did not answer within 300ms"), "{err}");
    assert!(started.elapsed() < Duration::from_millis(1400), "the client gave up at its timeout");
}

#[test]
fn unreachable_api() {
    // A port nobody listens on: bind, note it, close.
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let sim = sim_with(&format!("[carbon]\nsource = \"uk-grid\"\nbase_url = \"http://127.0.0.1:{port}\"\n"));
    let err = failure(&sim, 1);
    assert!(err.contains(&format!("cannot reach http://127.0.0.1:{port}/intensity")), "{err}");
}

#[test]
fn failing_source_falls_back_to_the_remembered_reading_then_the_fallback() {
    let server = Server::start(vec![("/intensity", ok(fixture("uk-intensity.json")))]);
    let base = format!("[carbon]\nsource = \"uk-grid\"\nbase_url = \"{}\"\n", server.url());
    let sim = sim_with(&base);
    assert_eq!(sim.json(&["carbon", "intensity", "--json"])["status"], "fresh");
    assert!(sim.path("lib/carbon-intensity.json").is_file(), "the good reading is remembered");

    server.set("/intensity", status(500, "oops".into()));
    let out = sim.vgpu(&["carbon", "intensity", "--json"]).output().unwrap();
    assert!(out.status.success());
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((got["intensity_g_per_kwh"].as_f64(), got["status"].as_str()), (Some(263.0), Some("cached")));
    assert!(got["note"].as_str().unwrap().contains("HTTP 500"), "{got}");
    let warning = String::from_utf8_lossy(&out.stderr);
    assert!(
        warning.contains("using the value read") && warning.contains("ago (max_age 1h)"),
        "said on stderr: {warning}"
    );

    // Too old a reading: the fallback, and said so.
    sim.write_vgpu_config(&format!("{base}max_age = \"0s\"\nfallback = 420\n"));
    std::thread::sleep(Duration::from_millis(1100));
    let got = sim.json(&["carbon", "intensity", "--json"]);
    assert_eq!((got["intensity_g_per_kwh"].as_f64(), got["status"].as_str()), (Some(420.0), Some("fallback")));
    assert!(got["note"].as_str().unwrap().contains("old (max_age 0s)"), "{got}");

    // Neither: a clear error.
    sim.write_vgpu_config(&format!("{base}max_age = \"0s\"\n"));
    let err = failure(&sim, 1);
    assert!(err.contains("the last good reading is") && err.contains("set [carbon] fallback"), "{err}");
}

#[test]
fn file_and_command_sources() {
    let sim = Sim::new(&[("NVIDIA H100 80GB HBM3", "80GiB")]);
    let csv = sim.path("intensity.csv");
    std::fs::write(
        &csv,
        "timestamp,gco2_per_kwh\n2020-01-01T00:00:00Z,500\n2020-01-01T01:00:00Z,180\n2999-01-01T00:00:00Z,1\n",
    )
    .unwrap();
    sim.write_vgpu_config(&format!("[carbon]\nsource = \"file\"\npath = \"{}\"\n", csv.display()));
    let got = sim.json(&["carbon", "intensity", "--json"]);
    assert_eq!((got["intensity_g_per_kwh"].as_f64(), got["timestamp_unix_ms"].as_i64()), (Some(180.0), Some(1_577_840_400_000)));

    sim.write_vgpu_config("[carbon]\nsource = \"command\"\ncommand = \"echo 77.5\"\n");
    assert_eq!(sim.json(&["carbon", "intensity", "--json"])["intensity_g_per_kwh"], 77.5);

    sim.write_vgpu_config("[carbon]\nsource = \"command\"\ncommand = \"echo nope\"\n");
    let err = failure(&sim, 1);
    assert!(err.contains("command `echo nope`: printed \"nope\", not a number"), "{err}");

    sim.write_vgpu_config("[carbon]\nsource = \"static\"\nvalue = 123\n");
    let out = sim.vgpu(&["carbon", "intensity"]).output().unwrap();
    assert!(out.status.success());
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("123 gCO2/kWh") && table.contains("static"), "{table}");
}

#[test]
fn override_needs_no_source_and_bad_values_are_usage_errors() {
    let sim = sim_with("");
    let got = sim.json(&["carbon", "intensity", "--json", "--intensity", "640"]);
    assert_eq!((got["intensity_g_per_kwh"].as_f64(), got["status"].as_str()), (Some(640.0), Some("override")));

    let err = failure(&sim, 2);
    assert!(err.contains("no intensity source configured"), "{err}");

    let out = sim.vgpu(&["carbon", "intensity", "--intensity=-4"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--intensity must be a carbon intensity from 0 to 5000"));

    for (config, key) in [
        ("[carbon]\nbudget_g_per_hour = -1\n", "[carbon] budget_g_per_hour: must be a non-negative number, got -1"),
        ("[carbon]\nsource = \"electricitymaps\"\n", "[carbon] zone: is required with source = \"electricitymaps\""),
        ("[carbon]\nmax_age = \"later\"\n", "[carbon] max_age: cannot read \"later\""),
    ] {
        sim.write_vgpu_config(config);
        let err = failure(&sim, 2);
        assert!(err.contains(key), "{err} (wanted {key})");
    }
    sim.write_vgpu_config("[carbon]\nbudget_per_hour = 1\n");
    let err = failure(&sim, 2);
    assert!(err.contains("budget_per_hour"), "unknown key named: {err}");
}

#[test]
fn plan_only_looks() {
    let server = Server::start(vec![("/intensity", ok(fixture("uk-intensity.json")))]);
    let sim = sim_with(&format!(
        "[carbon]\nsource = \"uk-grid\"\nbase_url = \"{}\"\nbudget_g_per_hour = 300\n",
        server.url()
    ));
    sim.json(&["devices", "--json"]);
    let before = files_below(&sim.path("lib"));
    let plan = sim.json(&["carbon", "plan", "--json"]);
    assert_eq!(plan["intensity_g_per_kwh"], 263.0);
    assert_eq!(plan["intensity_source"]["source"], "uk-grid national");
    assert_eq!(files_below(&sim.path("lib")), before, "plan writes nothing, not even the remembered reading");
}

/// `vgpu carbon intensity --json`, killed (and the test failed) if it runs past `limit`: a
/// source that hangs fails the test instead of hanging it.
fn intensity_within(sim: &Sim, limit: Duration) -> std::process::Output {
    sim.vgpu(&["carbon", "intensity", "--json"])
        .timeout(limit)
        .output()
        .unwrap_or_else(|e| panic!("vgpu carbon intensity did not finish within {limit:?}: {e}"))
}

/// The pids of the live (not zombie) processes of process group `pgid`.
fn live_members(pgid: u32) -> Vec<u32> {
    let mut live = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid pgrp …; comm may hold spaces, so split after its ')'.
        let fields: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect();
        if fields.get(2).and_then(|g| g.parse::<u32>().ok()) == Some(pgid) && fields.first() != Some(&"Z") {
            live.push(pid);
        }
    }
    live
}

fn read_pid(path: &std::path::Path) -> u32 {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).trim().parse().unwrap()
}

#[test]
fn command_with_a_lingering_child_gives_its_value_and_its_group_is_killed() {
    let sim = Sim::new(&[("NVIDIA H100 80GB HBM3", "80GiB")]);
    let dir = sim.path("cmd");
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.display();
    // The background child would write `ended` after 30 s; the shell exits at once.
    sim.write_vgpu_config(&format!(
        "[carbon]\nsource = \"command\"\ntimeout = \"1s\"\n\
         command = '(sleep 30; echo natural > {d}/ended) & echo $! > {d}/bg.pid; echo $$ > {d}/sh.pid; echo 300'\n"
    ));
    let out = intensity_within(&sim, Duration::from_secs(60));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got["intensity_g_per_kwh"], 300.0);

    // SIGKILL is delivered asynchronously: wait (boundedly) for the group to be gone.
    let (group, bg) = (read_pid(&dir.join("sh.pid")), read_pid(&dir.join("bg.pid")));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !live_members(group).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(live_members(group), Vec::<u32>::new(), "the command's process group (background child {bg}) lives on");
    assert!(!dir.join("ended").exists(), "the background child ran to its end instead of being killed");
}

#[test]
fn command_printing_too_much_is_refused() {
    let sim = sim_with("[carbon]\nsource = \"command\"\ntimeout = \"5s\"\ncommand = \"head -c 10485760 /dev/zero\"\n");
    let err = failure(&sim, 1);
    assert!(err.contains("printed more than 64 KiB, the cap on a command's output"), "{err}");
}

#[test]
fn file_source_refuses_devices_fifos_and_large_files() {
    let sim = Sim::new(&[("NVIDIA H100 80GB HBM3", "80GiB")]);
    let one_line = |out: &std::process::Output| {
        assert_eq!(out.status.code(), Some(1), "stdout: {}", String::from_utf8_lossy(&out.stdout));
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
        err
    };

    sim.write_vgpu_config("[carbon]\nsource = \"file\"\npath = \"/dev/zero\"\n");
    let err = one_line(&intensity_within(&sim, Duration::from_secs(20)));
    assert!(err.contains("/dev/zero: not a regular file but a character device"), "{err}");

    let fifo = sim.path("fifo.csv");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    sim.write_vgpu_config(&format!("[carbon]\nsource = \"file\"\npath = \"{}\"\n", fifo.display()));
    let err = one_line(&intensity_within(&sim, Duration::from_secs(20)));
    assert!(err.contains(&format!("{}: not a regular file but a FIFO", fifo.display())), "{err}");
    // The library call too, on a thread: it must not block on the FIFO nobody writes.
    let (tx, rx) = std::sync::mpsc::channel();
    let path = fifo.clone();
    std::thread::spawn(move || {
        use vgpu_carbon::intensity::Source as _;
        let _ = tx.send(vgpu_carbon::intensity::file::File { path }.read(chrono::Utc::now()).map_err(|e| e.to_string()));
    });
    let got = rx.recv_timeout(Duration::from_secs(20)).expect("reading a FIFO blocked");
    assert!(got.unwrap_err().contains("not a regular file but a FIFO"));

    let big = sim.path("big.csv");
    let mut text = String::from("2020-01-01T00:00:00Z,180\n");
    text.push_str(&"# padding\n".repeat(5 << 20 >> 4 << 1));
    assert!(text.len() > 5 << 20);
    std::fs::write(&big, &text).unwrap();
    sim.write_vgpu_config(&format!("[carbon]\nsource = \"file\"\npath = \"{}\"\n", big.display()));
    let err = one_line(&intensity_within(&sim, Duration::from_secs(20)));
    assert!(err.contains(&format!("{}: larger than 4 MiB, the cap on a file source", big.display())), "{err}");

    // A normal file still works.
    std::fs::write(&big, "2020-01-01T00:00:00Z,180\n").unwrap();
    assert_eq!(sim.json(&["carbon", "intensity", "--json"])["intensity_g_per_kwh"], 180.0);
}

/// `vgpu carbon intensity --forecast --json` at the time `now`.
fn forecast_at(sim: &Sim, now: &str) -> std::process::Output {
    sim.vgpu(&["carbon", "intensity", "--forecast", "--json"]).env("VGPU_NOW", now).output().expect("run vgpu")
}

fn forecast_json(sim: &Sim, now: &str) -> serde_json::Value {
    let out = forecast_at(sim, now);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON")
}

fn slots(got: &serde_json::Value) -> Vec<(i64, f64)> {
    got["slots"].as_array().unwrap().iter().map(|s| (s["start_unix_ms"].as_i64().unwrap(), s["intensity_g_per_kwh"].as_f64().unwrap())).collect()
}

#[test]
fn uk_grid_and_electricitymaps_forecasts() {
    let server = Server::start(vec![
        ("/intensity/2018-01-20T12:10Z/fw48h", ok(fixture("uk-fw48h-national.json"))),
        ("/regional/intensity/2018-01-20T12:10Z/fw48h/postcode/RG10", ok(fixture("uk-fw48h-postcode-RG10.json"))),
        ("/regional/intensity/2018-01-20T12:10Z/fw48h/regionid/13", ok(fixture("uk-fw48h-regionid-13.json"))),
        ("/v3/carbon-intensity/forecast?zone=DE", ok(fixture("electricitymaps-forecast-DE.json"))),
        ("/v3/carbon-intensity/forecast?zone=XX", ok(fixture("electricitymaps-forecast-bad.json"))),
        // The value now, which a forecast falls back to.
        ("/intensity", ok(fixture("uk-intensity.json"))),
        ("/regional/postcode/RG10", ok(fixture("uk-regional-postcode-RG10.json"))),
        ("/regional/regionid/13", ok(fixture("uk-regional-regionid-13.json"))),
        ("/v3/carbon-intensity/latest?zone=DE", ok(fixture("electricitymaps-latest-DE.json"))),
    ]);
    let now = "2018-01-20T12:10:00Z";
    let t0 = 1_516_450_200_000i64; // 12:10
    let base = format!("[carbon]\nsource = \"uk-grid\"\nbase_url = \"{}\"\n", server.url());
    let sim = sim_with(&base);
    let got = forecast_json(&sim, now);
    assert_eq!((got["schema"].as_i64(), got["source"].as_str(), got["status"].as_str()), (Some(1), Some("uk-grid national"), Some("fresh")));
    assert_eq!(got["fetched_unix_ms"], t0);
    let s = slots(&got);
    // The period in force at 12:10 (from 12:00) from now, then one every half hour up to 48 h.
    assert_eq!(s.len(), 96, "{s:?}");
    assert_eq!(s[0], (t0, 230.0));
    assert_eq!(s[1], (t0 + 20 * 60_000, 236.0));

    sim.write_vgpu_config(&format!("{base}postcode = \"RG10\"\n"));
    let got = forecast_json(&sim, now);
    assert_eq!((got["source"].as_str(), slots(&got)[0].1, slots(&got).len()), (Some("uk-grid postcode RG10"), 195.0, 96));
    sim.write_vgpu_config(&format!("{base}region_id = 13\n"));
    assert_eq!(slots(&forecast_json(&sim, now)).len(), 6);

    sim.write_vgpu_config(&format!("[carbon]\nsource = \"electricitymaps\"\nzone = \"DE\"\nbase_url = \"{}\"\n", server.url()));
    let got = forecast_json(&sim, "2018-04-25T18:30:00Z");
    assert_eq!((got["source"].as_str(), slots(&got).len(), slots(&got)[0].1), (Some("electricitymaps zone DE"), 24, 383.0));

    // A malformed forecast: the current value, flat, and said so (the current reading of
    // this zone has no route: the fallback).
    sim.write_vgpu_config(&format!("[carbon]\nsource = \"electricitymaps\"\nzone = \"XX\"\nfallback = 333\nbase_url = \"{}\"\n", server.url()));
    let out = forecast_at(&sim, "2018-04-25T18:30:00Z");
    assert!(out.status.success());
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((got["status"].as_str(), slots(&got)), (Some("fallback"), vec![(1_524_681_000_000, 333.0)]));
    let note = got["note"].as_str().unwrap();
    assert!(note.contains("forecast entry 2: carbonIntensity is null") && note.contains("a flat forecast at the current intensity (333"), "{note}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("a flat forecast"), "said on stderr too");

    // The table.
    sim.write_vgpu_config(&base);
    let out = sim.vgpu(&["carbon", "intensity", "--forecast"]).env("VGPU_NOW", now).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("forecast: uk-grid national") && text.contains("2018-01-20T12:10:00Z") && text.contains("230 gCO2/kWh"), "{text}");
}

#[test]
fn a_failing_forecast_falls_back_to_the_remembered_one_then_flat() {
    let server = Server::start(vec![("/intensity/2018-01-20T12:10Z/fw48h", ok(fixture("uk-fw48h-national.json")))]);
    let base = format!("[carbon]\nsource = \"uk-grid\"\nfallback = 250\nbase_url = \"{}\"\n", server.url());
    let sim = sim_with(&base);
    assert_eq!(forecast_json(&sim, "2018-01-20T12:10:00Z")["status"], "fresh");
    assert!(sim.path("lib/carbon-forecast.json").is_file(), "the good forecast is remembered");
    // Recorded in the history too.
    let db = rusqlite::Connection::open(sim.path("lib/history.db")).unwrap();
    let n: i64 = db.query_row("SELECT COUNT(*) FROM intensity WHERE kind = 'forecast'", [], |r| r.get(0)).unwrap();
    assert_eq!(n, 96);

    // Twenty minutes on the API is down (no route for that time): the remembered one, from now.
    let got = forecast_json(&sim, "2018-01-20T12:30:00Z");
    assert_eq!(got["status"], "cached");
    let s = slots(&got);
    assert_eq!((s.len(), s[0]), (95, (1_516_451_400_000, 236.0)));
    assert!(got["note"].as_str().unwrap().contains("using the forecast fetched 20m ago"), "{got}");

    // Past max_age: flat at the current intensity (here the fallback).
    let got = forecast_json(&sim, "2018-01-20T13:11:00Z");
    assert_eq!((got["status"].as_str(), slots(&got).len(), slots(&got)[0].1), (Some("fallback"), 1, 250.0));
    assert!(got["note"].as_str().unwrap().contains("the last good forecast is 1h 1m old"), "{got}");

    // --intensity: flat at it, no source asked.
    let requests = server.requests().len();
    let got = serde_json::from_slice::<serde_json::Value>(
        &sim.vgpu(&["carbon", "intensity", "--forecast", "--json", "--intensity", "99"]).output().unwrap().stdout,
    )
    .unwrap();
    assert_eq!((got["status"].as_str(), slots(&got)[0].1), (Some("override"), 99.0));
    assert_eq!(server.requests().len(), requests);
}

#[test]
fn file_source_forecast_and_vgpu_now_only_under_simulation() {
    let sim = Sim::new(&[("NVIDIA H100 80GB HBM3", "80GiB")]);
    let csv = sim.path("intensity.csv");
    std::fs::write(&csv, "2020-01-01T00:00:00Z,500\n2020-01-01T01:00:00Z,180\n2020-01-01T03:00:00Z,90\n2020-01-05T00:00:00Z,1\n").unwrap();
    sim.write_vgpu_config(&format!("[carbon]\nsource = \"file\"\npath = \"{}\"\n", csv.display()));
    let got = forecast_json(&sim, "2020-01-01T01:30:00Z");
    assert_eq!(slots(&got), vec![(1_577_842_200_000, 180.0), (1_577_847_600_000, 90.0)], "from now, within 48 h");
    let out = sim.vgpu(&["carbon", "intensity", "--json"]).env("VGPU_NOW", "tomorrow").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "a bad VGPU_NOW is a usage error");
    // Without the simulated driver VGPU_NOW is ignored: the value now (the last row).
    let out = sim.vgpu_real(&["carbon", "intensity", "--json"]).env("VGPU_NOW", "2020-01-01T01:30:00Z").output().unwrap();
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got["intensity_g_per_kwh"], 1.0);
}
