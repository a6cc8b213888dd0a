//! What `vgpu run` adds to starting a program: `vgpu --simulate run --mem 1G -- true`
//! against `true`, in one run, as an absolute time and a ratio; and what checking a sudo
//! caller's `--cwd` and program as them costs (`identity::as_user`: a thread that switches
//! its own credentials), once per `vgpu run`. Needs root (cgroups, the switch).
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

    // The switch alone, and with the checks `vgpu run` makes in it (--cwd and the program).
    let nobody = nix::unistd::User::from_name("nobody").expect("passwd").expect("user nobody");
    let user = vgpu_store::identity::sudo_caller(Some(&nobody.uid.as_raw().to_string())).expect("nobody").expect("a caller");
    let each = |f: &dyn Fn()| -> Duration {
        let mut times: Vec<Duration> = (0..1000)
            .map(|_| {
                let start = Instant::now();
                f();
                start.elapsed()
            })
            .collect();
        median(&mut times)
    };
    let switch = each(&|| vgpu_store::identity::as_user(&user, || ()).expect("as_user"));
    // What launch::resolve::check does in it: stat and access(X_OK) of the directory, the
    // program looked up on PATH.
    let checks = each(&|| {
        let found = vgpu_store::identity::as_user(&user, || {
            let dir = std::path::Path::new("/tmp");
            std::fs::metadata(dir).is_ok_and(|m| m.is_dir())
                && nix::unistd::access(dir, nix::unistd::AccessFlags::X_OK).is_ok()
                && std::env::split_paths("/usr/local/bin:/usr/bin:/bin").any(|d| d.join("true").is_file())
        });
        assert!(found.expect("as_user"));
    });
    println!("as_user (1000 calls, median)           {:>9.3} µs", switch.as_secs_f64() * 1e6);
    println!("--cwd + program checked as the user    {:>9.3} µs", checks.as_secs_f64() * 1e6);
}
