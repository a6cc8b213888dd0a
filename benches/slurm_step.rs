//! What spank_vgpu.so adds to a Slurm job step (issue 26's goal: at most 20 ms per step),
//! against the real Slurm of `tests/slurm.rs` (`tests/slurm/cluster.rs`: munged, slurmctld
//! and two `slurmd -N` nodes on this machine, each with its simulated GPUs). Needs root and
//! the Slurm packages, as the tests do.
//!
//!     cargo build --release --workspace && cargo bench --bench slurm_step [-- ROUNDS]   (default 20)
//!
//! For each kind of step, ROUNDS of each, interleaved, as `nobody`:
//!
//! - `srun -w n1 --gres=gpu:1 [-n16 -O] date +%s%N`, with no plugin loaded (plugstack.conf
//!   empty), with the plugin loaded but the step asking nothing of it, and with the plugin
//!   making the step's vGPU (`--vgpu-mem=4G`);
//! - two figures per step: from srun's start to the first instruction of its (last) task —
//!   the task prints the wall clock as it starts (`date`, the same in every variant; with
//!   the vGPU it starts with the shim preloaded, part of what is measured) — and srun's
//!   whole run, to its exit (the vGPU's removal, `vgpu slurm step-end`, runs from
//!   slurmstepd after the tasks and is in the second figure only as far as srun waits for
//!   it);
//! - a third: until the step's slurmstepd is gone (its vGPU removed, everything of the step
//!   done); the next step starts only then, so that no step's end overlaps another's start
//!   (each variant goes first in turn);
//! - the medians, and what the plugin adds: the median of the paired differences against
//!   no plugin.

// (tests/common/mod.rs allows dead code itself.)
#[path = "../tests/common/mod.rs"]
mod common;
#[allow(dead_code)]
#[path = "../tests/slurm/cluster.rs"]
mod cluster;

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use cluster::Cluster;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

/// Whether a slurmstepd of node n1 still runs (it ends after the step's vGPU is removed).
fn stepd_running(cluster: &Cluster) -> bool {
    let n1 = cluster.node("n1").sim.dir.path().as_os_str().as_encoded_bytes().to_vec();
    common::processes_carrying(&n1).iter().any(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "slurmstepd"))
}

/// One step: (ms from srun's start to its last task's first instruction, ms srun ran, ms
/// until the step's slurmstepd is gone: everything of the step done, its vGPU removed).
fn step(cluster: &Cluster, args: &[&str]) -> (f64, f64, f64) {
    let mut all = vec!["-w", "n1", "--gres=gpu:1"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["date", "+%s%N"]);
    let mut cmd = cluster.submit("srun", &all);
    let wall_start = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_nanos();
    let start = Instant::now();
    let out = cmd.output().expect("srun");
    let total = start.elapsed().as_secs_f64() * 1e3;
    while stepd_running(cluster) {
        std::thread::sleep(std::time::Duration::from_micros(500));
    }
    let done = start.elapsed().as_secs_f64() * 1e3;
    if !out.status.success() {
        eprintln!("slurm_step: srun {all:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        std::process::exit(1);
    }
    let last = String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.trim().parse::<u128>().ok()).max().unwrap_or_else(|| {
        eprintln!("slurm_step: no time printed: {}", String::from_utf8_lossy(&out.stdout));
        std::process::exit(1)
    });
    (last.saturating_sub(wall_start) as f64 / 1e6, total, done)
}

fn main() {
    let rounds: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(20);
    let cluster = Cluster::two_nodes();
    println!("slurm_step: {rounds} rounds of each, interleaved; ms (median); srun as nobody on a two-node cluster of this machine");
    for (label, extra) in [("1 task", vec![]), ("16 tasks", vec!["-n16", "-O"])] {
        let variants: [(&str, Option<bool>, Vec<&str>); 3] = [
            ("no plugin", Some(false), vec![]),
            ("plugin, no --vgpu-*", Some(true), vec![]),
            ("plugin, --vgpu-mem=4G", Some(true), vec!["--vgpu-mem=4G"]),
        ];
        let mut first: Vec<Vec<f64>> = vec![Vec::new(); 3];
        let mut total: Vec<Vec<f64>> = vec![Vec::new(); 3];
        let mut done: Vec<Vec<f64>> = vec![Vec::new(); 3];
        for round in 0..rounds {
            // Each variant first in turn; each step alone (the previous one's slurmstepd gone).
            for k in 0..variants.len() {
                let i = (k + round) % variants.len();
                let (_, plugin, args) = &variants[i];
                cluster.set_plugin(plugin.unwrap_or(false));
                let mut all = extra.clone();
                all.extend_from_slice(args);
                let (f, t, d) = step(&cluster, &all);
                first[i].push(f);
                total[i].push(t);
                done[i].push(d);
            }
        }
        println!("{label}:");
        for (i, (name, _, _)) in variants.iter().enumerate() {
            let added_first: Vec<f64> = first[i].iter().zip(&first[0]).map(|(a, b)| a - b).collect();
            let added_total: Vec<f64> = total[i].iter().zip(&total[0]).map(|(a, b)| a - b).collect();
            let added_done: Vec<f64> = done[i].iter().zip(&done[0]).map(|(a, b)| a - b).collect();
            println!(
                "  {name:<24} to first instruction {:6.1}  srun {:6.1}  step done {:6.1}   added: {:+6.1} to the first instruction, {:+6.1} to srun, {:+6.1} to the step",
                median(&mut first[i].clone()),
                median(&mut total[i].clone()),
                median(&mut done[i].clone()),
                median(&mut added_first.clone()),
                median(&mut added_total.clone()),
                median(&mut added_done.clone()),
            );
        }
    }
}
