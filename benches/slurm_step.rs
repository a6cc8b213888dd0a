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
//! - the medians, and what the plugin adds: the median of the paired differences against
//!   no plugin.

#[allow(dead_code)]
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

/// One step: (ms from srun's start to its last task's first instruction, ms srun ran).
fn step(cluster: &Cluster, args: &[&str]) -> (f64, f64) {
    let mut all = vec!["-w", "n1", "--gres=gpu:1"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["date", "+%s%N"]);
    let mut cmd = cluster.submit("srun", &all);
    let wall_start = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_nanos();
    let start = Instant::now();
    let out = cmd.output().expect("srun");
    let total = start.elapsed().as_secs_f64() * 1e3;
    if !out.status.success() {
        eprintln!("slurm_step: srun {all:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        std::process::exit(1);
    }
    let last = String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.trim().parse::<u128>().ok()).max().unwrap_or_else(|| {
        eprintln!("slurm_step: no time printed: {}", String::from_utf8_lossy(&out.stdout));
        std::process::exit(1)
    });
    (last.saturating_sub(wall_start) as f64 / 1e6, total)
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
        for _ in 0..rounds {
            for (i, (_, plugin, args)) in variants.iter().enumerate() {
                cluster.set_plugin(plugin.unwrap_or(false));
                let mut all = extra.clone();
                all.extend_from_slice(args);
                let (f, t) = step(&cluster, &all);
                first[i].push(f);
                total[i].push(t);
            }
        }
        println!("{label}:");
        for (i, (name, _, _)) in variants.iter().enumerate() {
            let added_first: Vec<f64> = first[i].iter().zip(&first[0]).map(|(a, b)| a - b).collect();
            let added_total: Vec<f64> = total[i].iter().zip(&total[0]).map(|(a, b)| a - b).collect();
            println!(
                "  {name:<24} srun→first instruction {:7.1}   srun total {:7.1}   added: {:+6.1} to the first instruction, {:+6.1} in all",
                median(&mut first[i].clone()),
                median(&mut total[i].clone()),
                median(&mut added_first.clone()),
                median(&mut added_total.clone()),
            );
        }
    }
}
