//! What the shim costs, against the simulated driver, shimmed vs direct in one run:
//!
//!     cargo bench -p vgpu-shim --bench overhead
//!
//! - ns added per `cuLaunchKernel` (no compute limit): goal ≤ 15 ns;
//! - ns added per `cuMemAlloc`+`cuMemFree` pair, one process and 8 processes contending on
//!   one vGPU: goal ≤ 1 µs, and 8-process contention ≤ 2× the single-process figure;
//! - time added to `cuInit` (joining the vGPU): goal ≤ 5 ms per process, and 100 processes
//!   starting together ≤ 1 s added in total.
//!
//! Every figure is the best of several alternating repetitions (bare, shimmed, bare, …), so
//! drift on the machine hits both sides alike. Prints a table; asserts nothing.

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::Stdio;
use std::time::Instant;

use common::*;

const REPS: usize = 5;

fn main() {
    let bench = Bench::new(80 * GIB, &[64 * GIB]);
    let program = bench.compile_source(&Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/c/bench.c"), &[]);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("libvgpu.so overhead against the simulated driver ({cpus} CPUs; best of {REPS} alternating runs)\n");
    println!("{:<44} {:>12} {:>12} {:>12}", "", "direct", "shimmed", "added");

    let launch = best_pair(&bench, &program, &["launch", "3000000"], "ns_per_launch");
    row("cuLaunchKernel, ns per call", launch, "ns");

    let single = best_pair(&bench, &program, &["alloc", "200000", "4096"], "ns_per_pair");
    row("alloc+free pair, 1 process, ns (CPU)", single, "ns");

    let contended = best_of(REPS, || {
        let bare = parallel(&bench, &program, 8, false, &["alloc", "50000", "4096"]);
        let shim = parallel(&bench, &program, 8, true, &["alloc", "50000", "4096"]);
        (mean(&bare, "ns_per_pair"), mean(&shim, "ns_per_pair"))
    });
    row("alloc+free pair, 8 processes, ns (CPU)", contended, "ns");

    let init = best_of(REPS, || {
        let bare: Vec<f64> = (0..10)
            .map(|_| field_f64(&run_ok(bench.bare(&program).arg("init")), "init_us"))
            .collect();
        let shim: Vec<f64> = (0..10)
            .map(|_| field_f64(&run_ok(bench.shimmed(&program).arg("init")), "init_us"))
            .collect();
        (median(bare), median(shim))
    });
    row("cuInit, µs per process (median of 10)", init, "µs");

    let first = best_of(REPS, || {
        let bare: Vec<f64> =
            (0..10).map(|_| field_f64(&run_ok(bench.bare(&program).arg("first")), "first_alloc_us")).collect();
        let shim: Vec<f64> =
            (0..10).map(|_| field_f64(&run_ok(bench.shimmed(&program).arg("first")), "first_alloc_us")).collect();
        (median(bare), median(shim))
    });
    row("first cuMemAlloc of a process, µs (median)", first, "µs");

    let hundred = best_of(3, || {
        let t = Instant::now();
        parallel(&bench, &program, 100, false, &["init"]);
        let bare = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        parallel(&bench, &program, 100, true, &["init"]);
        (bare, t.elapsed().as_secs_f64() * 1e3)
    });
    row("100 processes starting together, ms wall", hundred, "ms");

    let hundred_alloc = best_of(3, || {
        let t = Instant::now();
        parallel(&bench, &program, 100, false, &["first"]);
        let bare = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        parallel(&bench, &program, 100, true, &["first"]);
        (bare, t.elapsed().as_secs_f64() * 1e3)
    });
    row("100 processes: start + first alloc, ms wall", hundred_alloc, "ms");

    println!();
    println!("launch: {:+.1} ns per call (goal ≤ 15 ns)", launch.1 - launch.0);
    let (added1, added8) = (single.1 - single.0, contended.1 - contended.0);
    println!(
        "alloc+free: {added1:+.0} ns alone, {added8:+.0} ns with 8 processes contending (goal ≤ 1000 ns; contention {:.2}× single, goal ≤ 2×)",
        added8 / added1.max(1.0)
    );
    println!(
        "cuInit: {:+.2} ms per process (goal ≤ 5 ms); 100 together: {:+.0} ms in total (goal ≤ 1000 ms)",
        (init.1 - init.0) / 1e3,
        hundred.1 - hundred.0
    );
    println!(
        "first allocation (joins the vGPU's state files): {:+.0} µs per process; 100 together: {:+.0} ms in total",
        first.1 - first.0,
        hundred_alloc.1 - hundred_alloc.0
    );
}

fn row(label: &str, (direct, shimmed): (f64, f64), unit: &str) {
    println!(
        "{label:<44} {direct:>9.1} {unit:<2} {shimmed:>9.1} {unit:<2} {:>+9.1} {unit:<2}",
        shimmed - direct
    );
}

/// The smallest value of each side over `reps` repetitions.
fn best_of(reps: usize, mut f: impl FnMut() -> (f64, f64)) -> (f64, f64) {
    (0..reps)
        .map(|_| f())
        .fold((f64::MAX, f64::MAX), |(a, b), (x, y)| (a.min(x), b.min(y)))
}

fn best_pair(bench: &Bench, program: &Path, args: &[&str], key: &str) -> (f64, f64) {
    best_of(REPS, || {
        let bare = field_f64(&run_ok(bench.bare(program).args(args)), key);
        let shim = field_f64(&run_ok(bench.shimmed(program).args(args)), key);
        (bare, shim)
    })
}

/// Start `n` copies at once; wait for all; their outputs.
fn parallel(bench: &Bench, program: &Path, n: usize, shimmed: bool, args: &[&str]) -> Vec<String> {
    let children: Vec<_> = (0..n)
        .map(|_| {
            let mut cmd = if shimmed {
                bench.shimmed(program)
            } else {
                bench.bare(program)
            };
            cmd.args(args).stdout(Stdio::piped()).spawn().expect("spawn")
        })
        .collect();
    children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().expect("wait");
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
            String::from_utf8_lossy(&out.stdout).into_owned()
        })
        .collect()
}

fn field_f64(text: &str, key: &str) -> f64 {
    field(text, key)
        .parse()
        .unwrap_or_else(|e| panic!("{key} in {text:?}: {e}"))
}

fn mean(outputs: &[String], key: &str) -> f64 {
    outputs.iter().map(|o| field_f64(o, key)).sum::<f64>() / outputs.len() as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}
