//! Stage 1 of the carbon planner at `vgpu run --gpus MIN-MAX`: the workload starts with
//! the GPU count the budget allows, in CUDA_VISIBLE_DEVICES and VGPU_NUM_GPUS.

use crate::common::Sim;
use predicates::prelude::*;

const FOUR_H100: &[(&str, &str)] = &[
    ("NVIDIA H100 80GB HBM3", "80GiB"),
    ("NVIDIA H100 80GB HBM3", "80GiB"),
    ("NVIDIA H100 80GB HBM3", "80GiB"),
    ("NVIDIA H100 80GB HBM3", "80GiB"),
];

fn gpus_given(sim: &Sim, range: &str) -> (usize, usize) {
    let out = sim.vgpu(&["run", "--gpus", range, "--", "sh", "-c", "echo $VGPU_NUM_GPUS $CUDA_VISIBLE_DEVICES"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mut parts = text.split_whitespace();
    let n: usize = parts.next().unwrap().parse().unwrap();
    let visible = parts.next().unwrap_or("").split(',').filter(|s| s.starts_with("GPU-")).count();
    (n, visible)
}

#[test]
fn without_a_carbon_budget_the_workload_gets_its_maximum() {
    let sim = Sim::new(FOUR_H100);
    assert_eq!(gpus_given(&sim, "1-3"), (3, 3));
    assert_eq!(gpus_given(&sim, "2"), (2, 2));
}

#[test]
fn a_tight_budget_gives_fewer_gpus_and_a_higher_intensity_never_more() {
    let sim = Sim::new(FOUR_H100);
    // H100 model: idle 105 W, 123 W at the lowest clock. Four GPUs at 500 gCO2/kWh:
    // 1 assigned = 219 g/h, each further one +9 g/h; 245 g/h holds three.
    let count_at = |intensity: u32| {
        sim.write_vgpu_config(&format!("[carbon]\nsource = \"static\"\nvalue = {intensity}\nbudget_g_per_hour = 245\n"));
        gpus_given(&sim, "1-4").0
    };
    let at_500 = count_at(500);
    assert_eq!(at_500, 3);
    assert!(count_at(540) <= at_500);
    assert_eq!(count_at(100), 4);
}

#[test]
fn min_is_always_given_and_too_few_gpus_is_refused() {
    let sim = Sim::new(FOUR_H100);
    sim.write_vgpu_config("[carbon]\nsource = \"static\"\nvalue = 500\nbudget_g_per_hour = 100\n");
    // Even the lowest clocks exceed the budget: MIN is still given, and said.
    let out = sim.vgpu(&["run", "--gpus", "2-4", "--", "sh", "-c", "echo $VGPU_NUM_GPUS"]).output().unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "2");
    assert!(String::from_utf8_lossy(&out.stderr).contains("budget cannot be met"), "{}", String::from_utf8_lossy(&out.stderr));
    sim.vgpu(&["run", "--gpus", "5-6", "--", "true"]).assert().code(2).stderr(predicate::str::contains("--gpus 5-6: this host has 4 GPU(s)"));
    for bad in ["0", "3-2", "x", "1-"] {
        sim.vgpu(&["run", "--gpus", bad, "--", "true"]).assert().code(2).stderr(predicate::str::contains("--gpus"));
    }
    sim.vgpu(&["run", "--gpus", "1", "--freq-sensitivity", "1.5", "--", "true"]).assert().code(2);
}

#[test]
fn a_daily_budget_alone_limits_the_count_too() {
    let sim = Sim::new(FOUR_H100);
    // At noon (UTC, VGPU_NOW and TZ), a loose day: all four; a spent one (history: 3 kWh at
    // 500 g/kWh this morning, 1500 g of a 1000 g day): the minimum, and said.
    let run = |range: &str| {
        sim.vgpu(&["run", "--gpus", range, "--", "sh", "-c", "echo $VGPU_NUM_GPUS"])
            .env("VGPU_NOW", "2024-05-01T12:00:00Z")
            .env("TZ", "UTC")
            .output()
            .unwrap()
    };
    let count = |out: &std::process::Output| String::from_utf8_lossy(&out.stdout).trim().to_string();
    sim.write_vgpu_config("[carbon]\nsource = \"static\"\nvalue = 500\nbudget_g_per_day = 1000000\n");
    assert_eq!(count(&run("1-4")), "4");
    let conn = vgpu_history::db::open_rw(&sim.path("lib")).unwrap();
    let (eight, eleven) = (1_714_550_400_000i64, 1_714_561_200_000i64); // 2024-05-01 08:00, 11:00 UTC
    conn.execute("INSERT INTO intensity (ts_ms, kind, g_per_kwh, source, fetched_ms) VALUES (?1, 'reading', 500, 'static', ?1)", [eight]).unwrap();
    conn.execute(
        "INSERT INTO gpu_samples (t0_ms, t1_ms, gpu_uuid, gpu_index, energy_mj, energy_source) VALUES (?1, ?2, 'GPU-0', 0, ?3, 'counter')",
        [eight, eleven, 3 * 3_600_000_000],
    )
    .unwrap();
    sim.write_vgpu_config("[carbon]\nsource = \"static\"\nvalue = 500\nbudget_g_per_day = 1000\n");
    let out = run("2-4");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(count(&out), "2");
    assert!(String::from_utf8_lossy(&out.stderr).contains("budget cannot be met"), "{}", String::from_utf8_lossy(&out.stderr));
}
