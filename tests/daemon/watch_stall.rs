//! Nothing a local user does to the metrics endpoint or the history stalls `vgpu watch`
//! (issue 24, items 5 and 6; SPEC 4.7). Each test is the attack, by user nobody
//! (`tests/fixtures/stall_attacker.py` under `setpriv`), against a watch started with the
//! descriptor limit systemd gives a service (soft 1024): a bypasser (3 GiB through no shim
//! in a 1 GiB vGPU) is still killed, the endpoint still answers, reloads and the stop still
//! happen while the attacker holds on, memory stays bounded, and the history is written and
//! published whatever locks the attacker takes. Needs root (cgroups) and the simulated
//! driver.

use std::io::{BufRead, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

use crate::common::{wait_for, workload, Sim};
use crate::common::watch::Watch;

const H100: (&str, &str) = ("NVIDIA H100 80GB HBM3", "80GiB");

/// Short rounds and a small context allowance (as tests/daemon/watch_memory.rs), an endpoint on a
/// free port, plus `extra` (more `[watch]` keys, then other tables).
fn config(extra: &str) -> String {
    format!("[watch]\ninterval = \"200ms\"\ngrace = \"200ms\"\nkill_after = \"3s\"\ncontext_allowance = \"64MiB\"\nlisten = \"127.0.0.1:0\"\n{extra}")
}

/// A simulation whose directory user nobody may enter (to run the attacker's script from
/// it and reach the public copy of the history).
fn sim() -> Sim {
    let sim = Sim::new(&[H100]);
    std::fs::set_permissions(sim.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::copy(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join("tests/fixtures/stall_attacker.py"), sim.path("stall_attacker.py")).unwrap();
    sim
}

/// The attacker, as user nobody; killed when dropped.
struct Attacker {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Attacker {
    fn start(sim: &Sim, args: &[&str]) -> Attacker {
        let mut child = Command::new("setpriv")
            .args(["--reuid", "65534", "--regid", "65534", "--clear-groups", "--", "/usr/bin/python3"])
            .arg(sim.path("stall_attacker.py"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("setpriv python3");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        Attacker { child, stdin, lines }
    }

    /// Its next line (60 s at most).
    fn line(&self) -> String {
        self.lines.recv_timeout(Duration::from_secs(60)).expect("a line from the attacker")
    }

    fn tell(&mut self, command: &str) {
        writeln!(self.stdin.as_mut().expect("stdin"), "{command}").expect("tell the attacker");
    }
}

impl Drop for Attacker {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The endpoint's address, from the watch's `metrics on http://ADDR/metrics` line.
fn metrics_addr(watch: &Watch) -> SocketAddr {
    watch
        .log
        .iter()
        .find_map(|l| l.split("metrics on http://").nth(1)?.strip_suffix("/metrics")?.parse().ok())
        .unwrap_or_else(|| panic!("no metrics line: {:#?}", watch.log))
}

/// `GET /metrics` from the loopback address `source` (another peer than the attacker's);
/// the status line and the body.
fn scrape_from(addr: SocketAddr, source: &str) -> (String, String) {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.bind(&format!("{source}:0").parse::<SocketAddr>().unwrap().into()).unwrap();
    socket.connect_timeout(&addr.into(), Duration::from_secs(10)).expect("connect to the endpoint");
    let mut stream = TcpStream::from(socket);
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: vgpu\r\nConnection: close\r\n\r\n").unwrap();
    // Until the endpoint closes the connection (a refusal may end in a reset once its 503
    // is sent: what came before it counts).
    let mut answer = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && !answer.is_empty() => break,
            // A signal to this test process (another test's child ending) is not the endpoint.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => panic!("no answer from the endpoint within 10 s: {e}"),
        }
    }
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    (head.lines().next().unwrap_or_default().to_string(), body.to_string())
}

/// A workload that escapes the shim and holds 3 GiB in a 1 GiB vGPU; returns once the
/// watch has logged its SIGKILL (and it is gone).
fn bypasser_is_killed(sim: &Sim, watch: &mut Watch, name: &str) {
    struct Run(Child);
    impl Drop for Run {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let ready = sim.path(&format!("{name}.ready"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vgpu"));
    cmd.args(["--simulate", "run", "--name", name, "--mem", "1G", "--", "env", "-u", "LD_PRELOAD"])
        .arg(workload::workload_bin())
        .args(["idle", "60", "--alloc-mib", "3072", "--ready"])
        .arg(&ready)
        .env_remove("VGPU_SIMULATE");
    for (k, v) in sim.env() {
        cmd.env(k, v);
    }
    let mut run = Run(cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("vgpu run"));
    wait_for("the bypasser to hold its memory", || ready.exists());
    watch.wait_line("the bypasser's SIGKILL", |l| l.contains("SIGKILL to pid") && l.contains(&format!("of workload {name} (")));
    run.0.wait().expect("vgpu run ends");
}

/// Descriptors process `pid` holds.
fn descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// Resident memory of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn idle_connections_of_a_user_neither_delay_a_kill_nor_end_the_endpoint() {
    let sim = sim();
    // Idle connections are closed after 3 s here (30 s by default), so that the test sees it.
    sim.write_vgpu_config(&config("metrics_idle_timeout = \"3s\"\n"));
    let mut watch = Watch::start_as_service(&sim, &[]);
    let addr = metrics_addr(&watch);
    let port = addr.port().to_string();
    // 600 idle connections from 20 addresses: past the cap per peer and the cap in all.
    let mut attacker = Attacker::start(&sim, &["idle", "127.0.0.1", &port, "600", "20"]);
    assert_eq!(attacker.line(), "opened 600");
    // The watch holds at most its cap of them: its descriptors stay far from the 1024 a
    // service gets (before this fix: 1023, and the pool could not be settled).
    let held = descriptors(watch.pid());
    assert!(held < 1024 - 256, "the watch holds {held} descriptors");
    bypasser_is_killed(&sim, &mut watch, "bypass-idle");
    // Another peer is answered at once, with the figures or a 503 while the cap is reached.
    let (status, _) = scrape_from(addr, "127.0.0.250");
    assert!(status.starts_with("HTTP/1.1 200") || status.starts_with("HTTP/1.1 503"), "{status}");
    // The watch itself closes the idle connections, and scrapers get the figures again.
    attacker.tell("wait-closed");
    assert_eq!(attacker.line(), "all closed");
    let (status, body) = scrape_from(addr, "127.0.0.1");
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert!(body.contains("vgpu_gpu_memory_total_bytes"), "{body}");
    watch.drain();
    assert!(watch.log.iter().any(|l| l.contains("metrics endpoint: ") && l.contains("refusing more")), "the caps are said: {:#?}", watch.log);
    assert!(watch.stop().success());
}

#[test]
fn a_client_that_pipelines_and_never_reads_delays_neither_a_reload_nor_the_stop() {
    let sim = sim();
    // The attacker's connection is held for a minute whatever happens (10 s by default).
    sim.write_vgpu_config(&config("metrics_write_timeout = \"60s\"\n"));
    let mut watch = Watch::start_as_service(&sim, &[]);
    let addr = metrics_addr(&watch);
    let attacker = Attacker::start(&sim, &["pipeline", "127.0.0.1", &addr.port().to_string(), "50000"]);
    assert_eq!(attacker.line(), "stalled");
    // A SIGHUP that moves the endpoint is done while the attacker holds its connection
    // (before this fix the reload joined the old server's thread, which waited for this
    // client as long as it held on).
    sim.write_vgpu_config(&config("metrics_write_timeout = \"60s\"\n").replace("127.0.0.1:0", "127.0.0.2:0"));
    watch.signal(libc::SIGHUP);
    let line = watch.wait_line("the new endpoint", |l| l.contains("metrics on http://127.0.0.2:"));
    watch.wait_line("the reload", |l| l.contains("reloaded the config"));
    let moved: SocketAddr = line.split("metrics on http://").nth(1).and_then(|a| a.strip_suffix("/metrics")).and_then(|a| a.parse().ok()).expect("the new address");
    // Enforcement goes on.
    bypasser_is_killed(&sim, &mut watch, "bypass-pipeline");
    // The same against the new endpoint, then the stop: it ends well within the minute the
    // attacker holds its connection.
    let mut attacker = Attacker::start(&sim, &["pipeline", "127.0.0.2", &moved.port().to_string(), "50000"]);
    assert_eq!(attacker.line(), "stalled");
    attacker.tell("state");
    assert_eq!(attacker.line(), "state 1", "the attacker's connection is established");
    watch.signal(libc::SIGTERM);
    watch.wait_line("the stop", |l| l.contains("vgpu watch: stopped (signal 15)"));
    assert!(watch.wait_exit().success());
}

#[test]
fn a_header_line_without_end_is_cut_off_and_memory_stays_bounded() {
    let sim = sim();
    sim.write_vgpu_config(&config(""));
    let watch = Watch::start_as_service(&sim, &[]);
    let addr = metrics_addr(&watch);
    let before = rss_kib(watch.pid());
    // 4 × 400 MiB of one header line (before this fix: 1.1 GB of resident memory).
    let attacker = Attacker::start(&sim, &["header", "127.0.0.1", &addr.port().to_string(), "400", "4"]);
    for _ in 0..4 {
        let line = attacker.line();
        let sent: u64 = line.strip_prefix("sent ").and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{line}"));
        // Closed long before: the kernel's buffers take a few MiB at most.
        assert!(sent < 64 << 20, "the watch took {sent} bytes of one header");
    }
    assert_eq!(attacker.line(), "done");
    let after = rss_kib(watch.pid());
    assert!(after < before + 100 * 1024, "resident memory grew from {before} KiB to {after} KiB");
    let (status, _) = scrape_from(addr, "127.0.0.1");
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert!(watch.stop().success());
}

#[test]
fn a_user_cannot_open_the_history_and_locks_on_its_public_copy_stall_nothing() {
    let sim = sim();
    sim.write_vgpu_config(&config("[history]\ninterval = \"0s\"\n"));
    let mut watch = Watch::start_as_service(&sim, &[]);
    let lib = sim.path("lib");
    let copy = lib.join("history-snapshot.db");
    wait_for("the public copy", || copy.exists());
    let (db, shm) = (lib.join("history.db"), lib.join("history.db-shm"));
    assert!(shm.exists(), "the watch holds the database open");
    // The attack of issue 24: F_RDLCK on history.db's SHARED range and on -shm's WAL write
    // lock. Now the files cannot even be opened; the public copy can, and is locked.
    let mut attacker = Attacker::start(&sim, &["lock", db.to_str().unwrap(), shm.to_str().unwrap(), copy.to_str().unwrap()]);
    assert_eq!(attacker.line(), format!("refused {} {}", db.display(), libc::EACCES));
    assert_eq!(attacker.line(), format!("refused {} {}", shm.display(), libc::EACCES));
    assert_eq!(attacker.line(), format!("locked {}", copy.display()));
    let locked = std::fs::metadata(&copy).unwrap().ino();
    bypasser_is_killed(&sim, &mut watch, "bypass-locks");
    // Recorded (root reads the live database), and published again: a new copy beside the
    // locked one, which the watch never opens again.
    wait_for("the bypasser's end in the history", || {
        let conn = vgpu_history::reader::open_ro(&lib).unwrap().unwrap();
        conn.query_row("SELECT count(*) FROM workloads WHERE name = 'bypass-locks' AND ended_ms IS NOT NULL", [], |r| r.get::<_, i64>(0)).unwrap() == 1
    });
    wait_for("a new public copy", || std::fs::metadata(&copy).is_ok_and(|m| m.ino() != locked));
    watch.drain();
    assert!(!watch.log.iter().any(|l| l.contains("history: cannot")), "{:#?}", watch.log);
    attacker.tell("");
    assert!(watch.stop().success());
}

#[test]
fn a_database_an_old_install_left_readable_is_made_private_while_a_user_holds_its_locks() {
    let sim = sim();
    sim.write_vgpu_config(&config("[history]\ninterval = \"0s\"\n"));
    let lib = sim.path("lib");
    let (db, wal, shm) = (lib.join("history.db"), lib.join("history.db-wal"), lib.join("history.db-shm"));
    // An old install's database: 0644 with its -wal and -shm, a row in the WAL.
    let old = vgpu_history::db::open_rw(&lib).unwrap();
    old.execute_batch("PRAGMA wal_autocheckpoint = 0; INSERT INTO workloads (id, name, uid, user, command, gpus, started_ms) VALUES ('old', 'before', 0, 'root', 'x', '', 1);").unwrap();
    for f in [&db, &wal, &shm] {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let old_inode = std::fs::metadata(&db).unwrap().ino();
    // A user took the locks that stalled the watch, and keeps them.
    let attacker = Attacker::start(&sim, &["lock", db.to_str().unwrap(), shm.to_str().unwrap()]);
    assert_eq!(attacker.line(), format!("locked {}", db.display()));
    assert_eq!(attacker.line(), format!("locked {}", shm.display()));
    // The old writer goes (its WAL stays: the user's lock keeps it from checkpointing).
    drop(old);
    let mut watch = Watch::start_as_service(&sim, &[]);
    bypasser_is_killed(&sim, &mut watch, "bypass-old");
    wait_for("the bypasser's end in the history", || {
        let Ok(Some(conn)) = vgpu_history::reader::open_ro(&lib) else { return false };
        conn.query_row("SELECT count(*) FROM workloads WHERE name = 'bypass-old' AND ended_ms IS NOT NULL", [], |r| r.get::<_, i64>(0)).is_ok_and(|n| n == 1)
    });
    let meta = std::fs::metadata(&db).unwrap();
    assert_ne!(meta.ino(), old_inode, "a new inode: the user's descriptor is on the old one");
    assert_eq!(meta.mode() & 0o7777, 0o600);
    for f in [&wal, &shm] {
        if let Ok(m) = std::fs::metadata(f) {
            assert_eq!(m.mode() & 0o7777, 0o600, "{}", f.display());
        }
    }
    // Nothing was lost: the old WAL's row is there.
    let conn = vgpu_history::reader::open_ro(&lib).unwrap().unwrap();
    assert_eq!(conn.query_row("SELECT count(*) FROM workloads WHERE id = 'old'", [], |r| r.get::<_, i64>(0)).unwrap(), 1);
    drop(conn);
    watch.drain();
    assert!(!watch.log.iter().any(|l| l.contains("history: cannot")), "{:#?}", watch.log);
    drop(attacker);
    assert!(watch.stop().success());
}
