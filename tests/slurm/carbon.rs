//! Carbon on a Slurm node: a fenced step is a workload to the carbon planner like any other.
//! Its start re-plans the node's clocks within the node's budget (`vgpu slurm step-begin`,
//! as `vgpu run` does), and `--vgpu-freq-sensitivity` is its σ: of two busy steps on a
//! node's two GPUs, under a budget that cannot run both at the top clock, the one whose
//! speed depends on the clock (σ = 1) gets it, the one that does not (σ = 0) gets what is
//! left. The clocks are read from the simulated NVML, which runs kernels at the locked
//! maximum.

use std::os::unix::fs::PermissionsExt;

use serde_json::Value;

use crate::slurm::cluster::Cluster;
use crate::common::{wait_for, workload};

const H100: (&str, &str) = ("NVIDIA H100 80GB HBM3", "80GiB");

/// The node's vgpu config: a file intensity source (200 gCO2/kWh) and `budget` gCO2/h.
fn carbon_config(cluster: &Cluster, budget: f64) -> String {
    let csv = cluster.path("intensity.csv");
    std::fs::write(&csv, "timestamp,gco2_per_kwh\n2020-01-01T00:00:00Z,200\n").expect("intensity");
    format!("[carbon]\nsource = \"file\"\npath = \"{}\"\nbudget_g_per_hour = {budget}\n", csv.display())
}

/// The SM clock each GPU of the node runs kernels at, by index (`vgpu devices --json`).
fn clocks(node: &crate::slurm::cluster::Node) -> Vec<u64> {
    let v = node.sim.json(&["devices", "--json"]);
    v["gpus"].as_array().expect("gpus").iter().map(|g| g["sm_clock_mhz"].as_u64().unwrap_or_else(|| panic!("sm_clock_mhz: {g}"))).collect()
}

/// The decisions of the node's carbon log.
fn decisions(node: &crate::slurm::cluster::Node) -> Vec<Value> {
    let text = std::fs::read_to_string(node.sim.path("lib/carbon.jsonl")).unwrap_or_default();
    text.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect()
}

#[test]
fn a_steps_clocks_follow_the_nodes_carbon_plan_with_its_sensitivity() {
    let cluster = Cluster::start_gpus(&[("n1", &[H100, H100])], "", "");
    let n1 = cluster.node("n1");
    n1.sim.write_vgpu_config(&carbon_config(&cluster, 1e6));
    // Caps in force: the idle GPUs are locked at their lowest clock.
    let applied = n1.sim.json(&["carbon", "apply", "--json"]);
    assert_eq!(clocks(n1), [345, 345], "{applied}");
    let dir = cluster.path("shared");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    let bin = workload::workload_bin().display().to_string();
    // A busy step (kernels in a loop until told to stop) with sensitivity `sigma`.
    let step = |name: &str, sigma: &str| {
        let (progress, stop) = (dir.join(format!("{name}.progress")), dir.join(format!("{name}.stop")));
        let cmd = format!("{bin} sync 120 --progress {} --stop {}", progress.display(), stop.display());
        let mut srun = cluster.submit("srun", &["-w", "n1", "--gres=gpu:1", "--vgpu-mem=20G", &format!("--vgpu-freq-sensitivity={sigma}"), "sh", "-c", &cmd]);
        srun.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
        let child = srun.spawn().expect("srun");
        wait_for(&format!("the {name} step to run kernels"), || std::fs::read_to_string(&progress).ok().and_then(|t| t.trim().parse::<u64>().ok()).is_some_and(|n| n > 0));
        (child, stop)
    };
    let gpu_of = |name_suffix: &str| -> usize {
        let rows = n1.sim.ps();
        let row = rows.iter().find(|r| r["name"].as_str().is_some_and(|n| n.ends_with(name_suffix))).unwrap_or_else(|| panic!("{rows:?}"));
        row["gpus"][0]["gpu_index"].as_u64().expect("gpu index") as usize
    };

    // The clock-bound step alone: its start raised its GPU to the top clock.
    let (bound, bound_stop) = step("bound", "1");
    let b = gpu_of(".0");
    assert_eq!(clocks(n1)[b], 1980, "the step runs at the planned clock, not the idle cap: {:?}", decisions(n1).last());
    // A budget that holds it there and leaves little for another GPU.
    let plan = n1.sim.json(&["carbon", "plan", "--json"]);
    let alone = plan["predicted_g_per_hour"].as_f64().unwrap_or_else(|| panic!("predicted_g_per_hour: {plan}"));
    n1.sim.write_vgpu_config(&carbon_config(&cluster, alone + 20.0));

    // The step whose speed does not depend on the clock: σ = 0 leaves the top clock to the
    // other and takes what the budget has left.
    let (free, free_stop) = step("free", "0");
    let f = 1 - b;
    let now = clocks(n1);
    let last = decisions(n1).last().cloned().expect("a decision");
    assert!(last["reason"].as_str().is_some_and(|r| r.starts_with("workload started")), "{last}");
    let planned: Vec<u64> = last["gpus"].as_array().expect("gpus").iter().map(|g| g["clock_mhz"].as_u64().expect("clock_mhz")).collect();
    assert_eq!(now, planned, "the GPUs run at the plan's clocks: {last}");
    assert_eq!(now[b], 1980, "σ = 1 keeps the top clock: {last}");
    assert!(now[f] < 1980 && now[f] >= 345, "σ = 0 gets what is left: {last}");
    for (child, stop) in [(bound, bound_stop), (free, free_stop)] {
        std::fs::write(&stop, "").expect("stop");
        let out = child.wait_with_output().expect("srun");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    wait_for("nothing of the steps left on n1", || n1.leftovers().is_empty());
}
