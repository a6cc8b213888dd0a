//! What a real-systemd test costs (issue 30's goal: under 2 s to boot and under 2 s to tear
//! down, so that the suite can afford one container per test): for each cgroup tree, TRIALS
//! times, the harness of `tests/systemd.rs` boots a container whose PID 1 is systemd
//! (`tests/systemd/container.rs`), installs vgpu in it with `install.sh` (this build's
//! release binaries), runs one command as a shell would (`vgpu ps`), and tears it down;
//! each step is timed. Needs root and systemd-nspawn, as the tests do.
//!
//!     cargo bench --bench systemd_container [-- TRIALS]            (default 5)

#[allow(dead_code)]
#[path = "../tests/systemd/container.rs"]
mod container;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use container::{Container, Tree};

fn fail(message: impl std::fmt::Display) -> ! {
    eprintln!("systemd_container: {message}");
    std::process::exit(1)
}

/// The release build's directory, with the shim and the simulated driver built beside vgpu.
fn artefacts() -> PathBuf {
    let vgpu = PathBuf::from(env!("CARGO_BIN_EXE_vgpu"));
    let dir = vgpu.parent().unwrap_or_else(|| fail("CARGO_BIN_EXE_vgpu has no directory")).to_path_buf();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| fail("CARGO is not set: run through cargo bench"));
    let status = Command::new(cargo)
        .args(["build", "--release", "-p", "vgpu-shim", "-p", "fakegpu", "--lib"])
        .current_dir(checkout())
        .stdout(Stdio::null())
        .status()
        .unwrap_or_else(|e| fail(format!("cargo build: {e}")));
    if !status.success() {
        fail("cargo build --release -p vgpu-shim -p fakegpu failed");
    }
    for file in ["vgpu", "libvgpu.so", "libfakegpu.so"] {
        if !dir.join(file).is_file() {
            fail(format!("{} missing", dir.join(file).display()));
        }
    }
    dir.canonicalize().unwrap_or_else(|e| fail(e))
}

fn checkout() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap_or_else(|e| fail(e))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut trials = 5usize;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--bench" => {}
            n => trials = n.parse().unwrap_or_else(|_| fail(format!("usage: cargo bench --bench systemd_container [-- TRIALS], not `{n}`"))),
        }
    }
    let checkout = checkout();
    let artefacts = artefacts();
    let mut binds = vec![checkout.clone()];
    if !artefacts.starts_with(&checkout) {
        binds.push(artefacts.clone());
    }
    let install = format!(
        "VGPU_INSTALL_FROM={} {}/install.sh --no-build --no-watch --prefix /opt/vgpu --systemd-dir /etc/systemd/system --etc-dir /etc/vgpu >/dev/null",
        artefacts.display(),
        checkout.display()
    );
    println!("{trials} trials per tree, one container at a time (ms)");
    println!("tree        step        median     min     max");
    for tree in [Tree::Hybrid, Tree::Unified] {
        let (mut boot, mut installing, mut command, mut teardown, mut total) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..trials {
            let started = Instant::now();
            let ct = Container::boot(tree, &binds).unwrap_or_else(|e| fail(format!("{}: {e}", tree.name())));
            boot.push(ms(ct.timings.boot));
            let t = Instant::now();
            let out = ct.shell(&install);
            if !out.status.success() {
                fail(format!("install.sh: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)));
            }
            installing.push(ms(t.elapsed()));
            let t = Instant::now();
            let out = ct.shell("VGPU_SIMULATE=1 exec /opt/vgpu/bin/vgpu ps");
            if !out.status.success() {
                fail(format!("vgpu ps: {}", String::from_utf8_lossy(&out.stderr)));
            }
            command.push(ms(t.elapsed()));
            let torn = ct.teardown().unwrap_or_else(|left| fail(format!("teardown left {left}")));
            teardown.push(ms(torn));
            total.push(ms(started.elapsed()));
        }
        for (step, v) in [("boot", boot), ("install.sh", installing), ("vgpu ps", command), ("teardown", teardown), ("all", total)] {
            let (min, max) = (v.iter().copied().fold(f64::INFINITY, f64::min), v.iter().copied().fold(0.0, f64::max));
            println!("{:<11} {step:<11} {:>7.0} {min:>7.0} {max:>7.0}", tree.name(), median(v.clone()));
        }
    }
}
