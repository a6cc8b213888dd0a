//! How long the history's readers take against a big history, and what they use (issue 28,
//! item 4; goal, release build: `vgpu ps -a` ≤ 100 ms, a 90-day `vgpu carbon report` of 8
//! GPUs ≤ 1 s, the figures exact).
//!
//! A synthetic history of 8 GPUs at the default 10 s rows, made straight in SQL in a
//! database of schema version 1 (`crates/vgpu-history/src/schema/v1.sql`, as vgpu 0.1 made
//! it), ending now:
//!
//! * per GPU three workloads at a time: a service that runs the whole history and ended an
//!   hour ago, jobs of 6 h back to back, and jobs of 2 h with an hour's pause between (each
//!   busy in about 2 rows of 3, so 2 to 3 GPU-time rows per GPU per 10 s);
//! * a GPU row per 10 s (the energy of 60 W idle plus 240 W × the busy share, its busy
//!   time), the counter's reading;
//! * an intensity reading per hour (at 7 minutes past) and a fallback every 5 hours;
//! * GPUs 0–3 with a measured power model (idle 60 W), GPUs 4–7 with the config's
//!   `[carbon] power_idle_w = 60`.
//!
//! Then, each the median of up to 5 runs of a real binary against that lib dir (root reads
//! history.db itself; fewer runs where they take over 10 s; the runs of 1 and 2 below
//! interleaved), with the largest peak RSS (of a forked child):
//! `vgpu ps -a --json` and `vgpu carbon report --json` over the last 24 h, 8 days and (the
//! 90-day history) 90 days,
//!
//! 1. "before": `VGPU_BENCH_BEFORE`'s binary (an earlier vgpu, e.g. one built at the commit
//!    before the rollups), when given;
//! 2. "rows": this vgpu on the version-1 database (no rollups: every hour from its rows);
//! 3. the migration to version 2 (`History::open`) and the rollups of hours and days made as
//!    `vgpu watch`'s history thread makes them (passes of `ROLLUP_BUDGET`), timed;
//! 4. "rollups": this vgpu again.
//!
//! The reports of 2 and 4 must be the same text, byte for byte (it stops otherwise); 1's
//! total energy the same.
//!
//!     cargo build --release --workspace && cargo bench --bench history_queries [-- week|90d|both]
//!
//! The 90-day history is about 20 million rows (about 3 GB, in a temporary directory under
//! `TMPDIR`, removed at the end unless `VGPU_BENCH_KEEP` is set).

use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::os::unix::process::ExitStatusExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use vgpu_daemon::watch::history::writer::ROLLUP_BUDGET;

#[path = "support/rng.rs"]
mod rng;

const GPUS: usize = 8;
const TICK_MS: i64 = 10_000;
const HOUR_MS: i64 = 3_600_000;
const DAY_MS: i64 = 24 * HOUR_MS;
const RUNS: usize = 5;
/// Past this much time in one command's runs, no more runs of it.
const RUNS_FOR: Duration = Duration::from_secs(10);
const IDLE_W: f64 = 60.0;

fn fail(message: impl std::fmt::Display) -> ! {
    eprintln!("history_queries: {message}");
    std::process::exit(1)
}

fn uuid(g: usize) -> String {
    format!("GPU-{g:08x}-5a1e-4c2b-9d3e-0000000000{g:02x}")
}

/// One workload of the synthetic history.
struct Job {
    id: String,
    name: String,
    gpu: usize,
    from_ms: i64,
    /// Exclusive; `None`: still running.
    until_ms: Option<i64>,
}

/// The workloads of a history from `t0` to `now`.
fn jobs(t0: i64, now: i64) -> Vec<Job> {
    let mut out = Vec::new();
    let mut n = 0u64;
    let mut id = || {
        n += 1;
        format!("{:012x}", 0x5eed_0000_0000u64 + n)
    };
    for g in 0..GPUS {
        out.push(Job { id: id(), name: format!("service-{g}"), gpu: g, from_ms: t0, until_ms: Some(now - HOUR_MS) });
        let mut t = t0;
        while t < now {
            let end = t + 6 * HOUR_MS;
            out.push(Job { id: id(), name: format!("train-{g}"), gpu: g, from_ms: t, until_ms: (end <= now).then_some(end) });
            t = end;
        }
        let mut t = t0 + (g as i64) * 10 * 60_000;
        while t < now {
            let end = t + 2 * HOUR_MS;
            out.push(Job { id: id(), name: format!("eval-{g}"), gpu: g, from_ms: t, until_ms: (end <= now).then_some(end) });
            t = end + HOUR_MS;
        }
    }
    out
}

/// Fill `lib`'s history.db with `days` of history ending at `now`; returns the rows written.
fn generate(lib: &Path, days: i64, now: i64) -> u64 {
    let t_end = now / TICK_MS * TICK_MS;
    let t0 = t_end - days * DAY_MS;
    std::fs::create_dir_all(lib).unwrap_or_else(|e| fail(e));
    let mut conn = rusqlite::Connection::open(lib.join(vgpu_history::DB_FILE)).unwrap_or_else(|e| fail(e));
    // Made fast: one writer, nothing to survive; the indexes built once at the end.
    conn.execute_batch(&format!(
        "PRAGMA journal_mode = DELETE; PRAGMA synchronous = OFF; PRAGMA cache_size = -262144;
         {SCHEMA_V1} PRAGMA user_version = 1;
         DROP INDEX gpu_samples_t1; DROP INDEX workload_gpu_time_t1;"
    ))
    .unwrap_or_else(|e| fail(e));
    let jobs = jobs(t0, t_end);
    let mut rng = rng::Rng(0x9e37_79b9_7f4a_7c15);
    let mut rows = 0u64;
    let tx = conn.transaction().unwrap_or_else(|e| fail(e));
    {
        // Busy shares per GPU per tick, in thousandths, by job (same draw order always).
        let ticks = ((t_end - t0) / TICK_MS) as usize;
        let mut gpu_busy = vec![vec![0u64; ticks]; GPUS];
        let mut work = tx
            .prepare("INSERT INTO workload_gpu_time (t0_ms, t1_ms, workload_id, gpu_uuid, busy_ms, source) VALUES (?1, ?2, ?3, ?4, ?5, 'ledger')")
            .unwrap_or_else(|e| fail(e));
        for job in &jobs {
            let first = ((job.from_ms - t0) / TICK_MS) as usize;
            let last = ((job.until_ms.unwrap_or(t_end) - t0) / TICK_MS) as usize;
            let uuid = uuid(job.gpu);
            for (k, busy) in gpu_busy[job.gpu].iter_mut().enumerate().take(last).skip(first) {
                if rng.below(3) == 0 {
                    continue;
                }
                let share = 50 + rng.below(280);
                *busy = (*busy + share).min(1000);
                let t = t0 + k as i64 * TICK_MS;
                work.execute(rusqlite::params![t, t + TICK_MS, job.id, uuid, share as i64 * TICK_MS / 1000]).unwrap_or_else(|e| fail(e));
                rows += 1;
            }
        }
        let mut gpu = tx
            .prepare(
                "INSERT INTO gpu_samples (t0_ms, t1_ms, gpu_uuid, gpu_index, gpu_name, energy_mj, energy_source, busy_ms, sm_clock_mhz, power_w, energy_counter_mj)
                 VALUES (?1, ?2, ?3, ?4, 'NVIDIA H100 80GB HBM3', ?5, 'counter', ?6, 1980, ?7, ?8)",
            )
            .unwrap_or_else(|e| fail(e));
        for (g, busy) in gpu_busy.iter().enumerate() {
            let uuid = uuid(g);
            let mut counter = 1_000_000_000i64;
            for (k, &b) in busy.iter().enumerate() {
                let watts = IDLE_W + 240.0 * b as f64 / 1000.0;
                let energy = (watts * TICK_MS as f64) as i64 + rng.below(1000) as i64;
                counter += energy;
                let t = t0 + k as i64 * TICK_MS;
                gpu.execute(rusqlite::params![t, t + TICK_MS, uuid, g as i64, energy, b as i64 * TICK_MS / 1000, watts, counter]).unwrap_or_else(|e| fail(e));
                rows += 1;
            }
        }
        let mut wl = tx
            .prepare("INSERT INTO workloads (id, name, uid, user, service, command, gpus, started_ms, ended_ms, outcome) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)")
            .unwrap_or_else(|e| fail(e));
        for job in &jobs {
            let user = ["alice", "bob", "carol"][job.gpu % 3];
            let service = job.name.starts_with("service").then_some("inference");
            let outcome = job.until_ms.map(|_| "exit 0");
            wl.execute(rusqlite::params![job.id, job.name, 1000 + job.gpu as i64 % 3, user, service, "python3 job.py", uuid(job.gpu), job.from_ms, job.until_ms, outcome])
                .unwrap_or_else(|e| fail(e));
        }
        let mut intensity = tx
            .prepare("INSERT INTO intensity (ts_ms, kind, g_per_kwh, source, fetched_ms) VALUES (?1, ?2, ?3, 'bench', ?1)")
            .unwrap_or_else(|e| fail(e));
        let mut h = t0 / HOUR_MS * HOUR_MS - HOUR_MS;
        let mut n = 0;
        while h < t_end {
            let g = 100.0 + rng.below(400_000) as f64 / 1000.0;
            intensity.execute(rusqlite::params![h + 7 * 60_000, "reading", g]).unwrap_or_else(|e| fail(e));
            if n % 5 == 0 {
                intensity.execute(rusqlite::params![h + 41 * 60_000, "fallback", 300.0]).unwrap_or_else(|e| fail(e));
            }
            n += 1;
            h += HOUR_MS;
        }
        let mut model = tx
            .prepare("INSERT INTO power_models VALUES (?1, 'NVIDIA H100 80GB HBM3', ?2, 1980, ?3, 700, 2, 0.9, 1.5, '[]')")
            .unwrap_or_else(|e| fail(e));
        for g in 0..GPUS / 2 {
            model.execute(rusqlite::params![uuid(g), t0, IDLE_W]).unwrap_or_else(|e| fail(e));
        }
    }
    tx.commit().unwrap_or_else(|e| fail(e));
    conn.execute_batch(SCHEMA_V1).unwrap_or_else(|e| fail(e));
    conn.execute_batch("PRAGMA journal_mode = WAL;").unwrap_or_else(|e| fail(e));
    drop(conn);
    // Root's alone, as vgpu makes it (a readable one would be copied to a new private file
    // at the first open: not what is measured here).
    std::fs::set_permissions(lib.join(vgpu_history::DB_FILE), std::fs::Permissions::from_mode(0o600)).unwrap_or_else(|e| fail(e));
    // The page cache and the busy shares back to the system: a forked child's peak RSS
    // counts this process's resident pages at the fork.
    // SAFETY: malloc_trim only returns free memory of glibc's heap to the system.
    unsafe { libc::malloc_trim(0) };
    rows
}

/// This process's resident set, KiB (/proc/self/status VmRSS).
fn own_rss() -> i64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()).unwrap_or(0)
}

/// The schema vgpu 0.1 made (version 1).
const SCHEMA_V1: &str = include_str!("../crates/vgpu-history/src/schema/v1.sql");

/// Wall time and peak RSS (KiB) of one run of `vgpu ARGS` (its output checked to be JSON).
fn run_once(vgpu: &str, dir: &Path, args: &[&str]) -> (Duration, i64, String) {
    let start = Instant::now();
    let mut cmd = Command::new(vgpu);
    // A fork, not a vfork (posix_spawn): a vforked child shares this process's memory until
    // it executes, and its peak RSS would count this process's peak (the generation's).
    // SAFETY: the closure only returns; nothing runs in the forked child but exec.
    unsafe {
        cmd.pre_exec(|| Ok(()));
    }
    // Waited for below with wait4(2), for its rusage (the Child's own wait gives none).
    #[allow(clippy::zombie_processes)]
    let child = cmd
        .args(args)
        .env("VGPU_STATE_DIR", dir.join("run"))
        .env("VGPU_LIB_DIR", dir.join("lib"))
        .env("VGPU_CONFIG", dir.join("config.toml"))
        .env_remove("VGPU_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| fail(format!("{vgpu}: {e}")));
    let pid = child.id() as libc::pid_t;
    let mut stdout = child.stdout.unwrap_or_else(|| fail("no stdout"));
    let mut out = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut out).unwrap_or_else(|e| fail(e));
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid value for wait4 to fill in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 on our own child's pid, with pointers to live locals.
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let took = start.elapsed();
    if waited != pid {
        fail(format!("wait4: {}", std::io::Error::last_os_error()));
    }
    let status = std::process::ExitStatus::from_raw(status);
    if !status.success() {
        fail(format!("vgpu {args:?}: {status}"));
    }
    if serde_json::from_str::<serde_json::Value>(&out).is_err() {
        fail(format!("vgpu {args:?}: not JSON: {out}"));
    }
    (took, usage.ru_maxrss, out)
}

/// One command's figures.
struct Measured {
    median: Duration,
    runs: usize,
    /// KiB.
    rss: i64,
    out: String,
}

/// For each binary, the median time and largest peak RSS of up to `RUNS` runs of `args`
/// (fewer past `RUNS_FOR`), the binaries' runs interleaved (the machine's load falls on all
/// alike), and the last run's output.
fn measure(binaries: &[&str], dir: &Path, args: &[&str]) -> Vec<Measured> {
    let mut times = vec![Vec::new(); binaries.len()];
    let mut rss = vec![0; binaries.len()];
    let mut out = vec![String::new(); binaries.len()];
    while times[0].len() < RUNS && times.iter().flatten().sum::<Duration>() < RUNS_FOR * binaries.len() as u32 {
        for (i, vgpu) in binaries.iter().enumerate() {
            let (t, r, o) = run_once(vgpu, dir, args);
            times[i].push(t);
            rss[i] = rss[i].max(r);
            out[i] = o;
        }
    }
    times
        .into_iter()
        .zip(rss)
        .zip(out)
        .map(|((mut times, rss), out)| {
            times.sort();
            Measured { median: times[times.len() / 2], runs: times.len(), rss, out }
        })
        .collect()
}

/// Each command's figures with each binary (labelled), printed; by binary, by command.
fn measure_all(binaries: &[(&str, &str)], dir: &Path, commands: &[(String, Vec<String>)]) -> Vec<Vec<Measured>> {
    let mut by_binary: Vec<Vec<Measured>> = binaries.iter().map(|_| Vec::new()).collect();
    for (_, args) in commands {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let paths: Vec<&str> = binaries.iter().map(|b| b.1).collect();
        for (i, m) in measure(&paths, dir, &args).into_iter().enumerate() {
            by_binary[i].push(m);
        }
    }
    for ((label, _), measured) in binaries.iter().zip(&by_binary) {
        println!("  {label}:");
        for ((name, _), m) in commands.iter().zip(measured) {
            println!(
                "    {name:<34} {:>10.1} ms  peak RSS {:>7.1} MB  ({} run{})  {}",
                m.median.as_secs_f64() * 1e3,
                m.rss as f64 / 1024.0,
                m.runs,
                if m.runs == 1 { "" } else { "s" },
                summary(&m.out)
            );
        }
    }
    by_binary
}

fn scenario(vgpu: &str, before: Option<&str>, label: &str, days: i64) {
    let mut dir = tempfile::tempdir().unwrap_or_else(|e| fail(e));
    if std::env::var_os("VGPU_BENCH_KEEP").is_some() {
        dir.disable_cleanup(true);
        println!("{label}: in {} (kept: VGPU_BENCH_KEEP)", dir.path().display());
    }
    let lib = dir.path().join("lib");
    std::fs::create_dir_all(dir.path().join("run")).unwrap_or_else(|e| fail(e));
    std::fs::write(dir.path().join("config.toml"), format!("[carbon]\npower_idle_w = {IDLE_W}\n")).unwrap_or_else(|e| fail(e));
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0);
    let start = Instant::now();
    let rows = generate(&lib, days, now);
    let db = lib.join(vgpu_history::DB_FILE);
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0) as f64 / 1e6;
    println!("{label}: {days} days, {GPUS} GPUs, {rows} rows, {:.0} MB (schema version 1), made in {:.1} s", size(&db), start.elapsed().as_secs_f64());
    // A forked child's peak RSS (wait4's ru_maxrss) includes the pages it had from this
    // process until it executed the binary: the floor under every figure below.
    println!("  (this bench's own RSS: {:.1} MB, the floor of every peak RSS below)", own_rss() as f64 / 1024.0);
    // Fixed windows (the reports of two runs are compared byte for byte), ending now.
    let at = |ms: i64| chrono::DateTime::from_timestamp_millis(ms).unwrap_or_default().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let report = |name: &str, span_ms: i64| -> (String, Vec<String>) {
        let args = ["carbon", "report", "--json", "--since", &at(now - span_ms), "--until", &at(now)];
        (format!("carbon report --json ({name})"), args.iter().map(|a| a.to_string()).collect())
    };
    let mut commands: Vec<(String, Vec<String>)> = vec![("ps -a --json".into(), ["ps", "-a", "--json"].iter().map(|a| a.to_string()).collect()), report("24 h", DAY_MS), report("8 days", 8 * DAY_MS)];
    if days >= 90 {
        commands.push(report("90 days", 90 * DAY_MS));
    }
    let before_label = before.map(|b| format!("before ({b})"));
    let mut binaries = Vec::new();
    if let (Some(label), Some(b)) = (&before_label, before) {
        binaries.push((label.as_str(), b));
    }
    binaries.push(("this vgpu, every hour from its rows (schema version 1)", vgpu));
    let mut measured = measure_all(&binaries, dir.path(), &commands);
    let rows_only = measured.pop().unwrap_or_default();
    let old = measured.pop();

    // As `vgpu watch` does: the migration at its open, then passes of rollups.
    let start = Instant::now();
    let mut history = vgpu_history::History::open(&lib).unwrap_or_else(|e| fail(e));
    let migrated = start.elapsed();
    let idle = vgpu_history::query::IdlePowers { configured_w: Some(IDLE_W), driver_w: Default::default() };
    let start = Instant::now();
    let (mut passes, mut made, mut longest) = (0, 0, Duration::ZERO);
    loop {
        let pass_start = Instant::now();
        let pass = history.roll_up(&idle.defaults(), passes == 0, ROLLUP_BUDGET).unwrap_or_else(|e| fail(e));
        longest = longest.max(pass_start.elapsed());
        passes += 1;
        made += pass.made;
        if pass.left == 0 {
            break;
        }
    }
    let rolled = start.elapsed();
    drop(history);
    println!(
        "  migration to schema version {}: {:.1} ms; rollups of {made} hours and days in {:.1} s ({passes} passes of at most {} ms, the longest {:.0} ms); {:.0} MB",
        vgpu_history::SCHEMA_VERSION,
        migrated.as_secs_f64() * 1e3,
        rolled.as_secs_f64(),
        ROLLUP_BUDGET.as_millis(),
        longest.as_secs_f64() * 1e3,
        size(&db)
    );
    let rolled_up = measure_all(&[("this vgpu, whole days and hours from their rollups", vgpu)], dir.path(), &commands).pop().unwrap_or_default();

    for (i, (name, _)) in commands.iter().enumerate() {
        let (a, b) = (&rows_only[i], &rolled_up[i]);
        let speedup = a.median.as_secs_f64() / b.median.as_secs_f64();
        let against_old = old.as_ref().map(|o| format!(", {:.0}x faster than before", o[i].median.as_secs_f64() / b.median.as_secs_f64())).unwrap_or_default();
        if name.starts_with("carbon report") {
            if a.out != b.out {
                fail(format!("{name}: the report through the rollups differs from the report from the rows:\n{}\n---\n{}", a.out, b.out));
            }
            if let Some(o) = &old {
                let total = |out: &str| serde_json::from_str::<serde_json::Value>(out).ok().and_then(|d| d["total_energy_mj"].as_u64());
                if total(&o[i].out) != total(&b.out) {
                    fail(format!("{name}: the total energy differs from the earlier vgpu's"));
                }
            }
            println!("  {name}: the same report, byte for byte; {speedup:.0}x faster than from the rows{against_old}");
        } else {
            println!("  {name}: {speedup:.0}x faster than from the rows{against_old}");
        }
    }
}

/// What an output says, to see that it read the history: the ended workloads, or the
/// report's total energy.
fn summary(out: &str) -> String {
    let doc: serde_json::Value = serde_json::from_str(out).unwrap_or_default();
    if let Some(ended) = doc.get("ended").and_then(|e| e.as_array()) {
        let mj: u64 = ended.iter().filter_map(|e| e["energy_mj"].as_u64()).sum();
        return format!("({} ended, {:.3} kWh)", ended.len(), mj as f64 / 3.6e9);
    }
    match doc.get("total_energy_mj").and_then(|e| e.as_u64()) {
        Some(mj) => format!("({:.3} kWh, {} rows)", mj as f64 / 3.6e9, doc["rows"].as_array().map_or(0, Vec::len)),
        None => String::new(),
    }
}

fn main() {
    if !nix::unistd::geteuid().is_root() {
        fail("needs root (root reads history.db itself; anyone else reads the public copy)");
    }
    let which = std::env::args().skip(1).find(|a| !a.starts_with('-')).unwrap_or_else(|| "both".into());
    let vgpu = env!("CARGO_BIN_EXE_vgpu");
    let before = std::env::var("VGPU_BENCH_BEFORE").ok();
    println!("history_queries: {vgpu}, median of up to {RUNS} runs each");
    if which == "week" || which == "both" {
        scenario(vgpu, before.as_deref(), "week", 7);
    }
    if which == "90d" || which == "both" {
        scenario(vgpu, before.as_deref(), "90 days", 90);
    }
}
