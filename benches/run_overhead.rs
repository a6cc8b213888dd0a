//! What `vgpu run` adds to starting a program: `vgpu --simulate run --mem 1G -- true`
//! against `true`, in one run, as an absolute time and a ratio. Needs root (cgroups).
//!
//!     cargo build --release --workspace && cargo bench --bench run_overhead [-- ROUNDS]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn main() {
    let rounds: u32 = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(50);
    let vgpu = env!("CARGO_BIN_EXE_vgpu");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("fakegpu.toml");
    std::fs::write(&config, "[[device]]\nname = \"NVIDIA H100 80GB HBM3\"\nmemory = \"80GiB\"\n").expect("write config");
    let env = [
        ("FAKEGPU_CONFIG", config.clone()),
        ("FAKEGPU_STATE", dir.path().join("fakegpu")),
        ("VGPU_STATE_DIR", dir.path().join("run")),
        ("VGPU_LIB_DIR", dir.path().join("lib")),
        ("VGPU_CONFIG", dir.path().join("none.toml")),
    ];
    std::fs::write(dir.path().join("none.toml"), "").expect("write config");

    let time = |program: &str, args: &[&str]| -> Duration {
        let mut cmd = Command::new(program);
        cmd.args(args).stdout(Stdio::null()).stderr(Stdio::inherit());
        for (k, v) in &env {
            cmd.env(k, v);
        }
        let start = Instant::now();
        let status = cmd.status().expect("run");
        let elapsed = start.elapsed();
        assert!(status.success(), "{program} {args:?} failed");
        elapsed
    };
    // Warm up (page cache, the simulated driver's link directory).
    time(vgpu, &["--simulate", "run", "--mem", "1G", "--", "true"]);
    let mut bare = Vec::new();
    let mut wrapped = Vec::new();
    for _ in 0..rounds {
        bare.push(time("true", &[]));
        wrapped.push(time(vgpu, &["--simulate", "run", "--mem", "1G", "--", "true"]));
    }
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let (b, w) = (median(&mut bare), median(&mut wrapped));
    println!("rounds: {rounds} (interleaved), medians");
    println!("true                                   {:>9.3} ms", b.as_secs_f64() * 1e3);
    println!("vgpu --simulate run --mem 1G -- true   {:>9.3} ms", w.as_secs_f64() * 1e3);
    println!("added by vgpu run                      {:>9.3} ms  (ratio {:.1}x)", (w.saturating_sub(b)).as_secs_f64() * 1e3, w.as_secs_f64() / b.as_secs_f64());
}
