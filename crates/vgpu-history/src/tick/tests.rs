use super::*;
use vgpu_gpu::snapshot::idle_gpu;
use vgpu_gpu::snapshot::GpuProcessSample;
use vgpu_gpu::snapshot::GpuSample;
use vgpu_store::state::workload::tests::sample;

fn gpu(index: u32, counter: Option<u64>, power: Option<f64>, util: Option<u32>, processes: Vec<GpuProcessSample>) -> GpuSample {
    GpuSample { energy_mj: counter, power_w: power, utilization_pct: util, sm_clock_mhz: Some(1980), ..idle_gpu(index, processes) }
}

fn process(pid: u32, cgroup: &str, pct: u32) -> GpuProcessSample {
    GpuProcessSample { pid, start_time: Some(1), memory_bytes: None, sm_util_pct: Some(pct), owner: Owner::Workload(cgroup.into()) }
}

fn snapshot(t: u64, gpus: Vec<GpuSample>) -> Snapshot {
    Snapshot { taken_unix_ms: t, taken_us: t * 1000, gpus }
}

/// A workload on GPU-0 in its own vGPU with `compute_pct`.
fn workload(id: &str, compute_pct: u32) -> Workload {
    let mut w = sample();
    w.id = id.into();
    w.vgpu = id.into();
    w.cgroup = id.into();
    w.gpus[0].uuid = "GPU-0".into();
    w.gpus[0].compute_pct = compute_pct;
    w
}

fn ledger(vgpu: &str, pct: u32, ns: u64) -> Ledger {
    Ledger { vgpu: vgpu.into(), gpu_uuid: "GPU-0".into(), compute_pct: pct, charged_ns: ns }
}

#[test]
fn first_round_remembers_and_the_next_takes_the_counter_delta() {
    let (tick, prev) = build(&Previous::default(), &snapshot(1_000, vec![gpu(0, Some(5_000), Some(100.0), Some(50), vec![])]), &[], &[]);
    assert_eq!(tick, Tick::default());
    let (tick, _) = build(&prev, &snapshot(3_000, vec![gpu(0, Some(405_000), Some(250.0), Some(50), vec![])]), &[], &[]);
    let row = &tick.gpus[0];
    assert_eq!((row.t0_ms, row.t1_ms, row.energy_mj, row.energy_source), (1_000, 3_000, 400_000, EnergySource::Counter));
    assert_eq!(row.busy_ms, Some(1_000));
    assert_eq!(row.energy_counter_mj, Some(405_000));
    assert_eq!(row.power_w, Some(250.0));
}

#[test]
fn a_counter_that_went_back_or_is_missing_gives_power_times_duration() {
    let (_, prev) = build(&Previous::default(), &snapshot(1_000, vec![gpu(0, Some(9_000_000), None, None, vec![])]), &[], &[]);
    // The driver reloaded: the counter restarted near 0.
    let (tick, prev) = build(&prev, &snapshot(2_000, vec![gpu(0, Some(10), Some(300.0), None, vec![])]), &[], &[]);
    assert_eq!((tick.gpus[0].energy_mj, tick.gpus[0].energy_source), (300_000, EnergySource::Power));
    assert_eq!(tick.gpus[0].busy_ms, None);
    // No counter at all.
    let (tick, prev) = build(&prev, &snapshot(2_500, vec![gpu(0, None, Some(100.0), None, vec![])]), &[], &[]);
    assert_eq!((tick.gpus[0].energy_mj, tick.gpus[0].energy_source), (50_000, EnergySource::Power));
    // Neither counter nor power: no row, nothing invented.
    let (tick, _) = build(&prev, &snapshot(3_000, vec![gpu(0, None, None, None, vec![])]), &[], &[]);
    assert!(tick.gpus.is_empty());
}

#[test]
fn a_restart_bridges_a_short_gap_but_not_a_long_one() {
    let restored = |t_ms| Previous { restored: [("GPU-0".to_string(), LastGpu { t_ms, counter_mj: Some(1_000) })].into(), ..Previous::default() };
    let now = 1_000_000;
    let snap = snapshot(now, vec![gpu(0, Some(61_000), Some(100.0), None, vec![process(7, "w", 100)])]);
    let (tick, next) = build(&restored(now - 60_000), &snap, &[workload("w", 100)], &[]);
    assert_eq!(tick.gpus.len(), 1);
    assert_eq!((tick.gpus[0].t0_ms, tick.gpus[0].energy_mj), (now - 60_000, 60_000));
    // Workload time is not known across the gap.
    assert!(tick.workloads.is_empty());
    assert!(next.restored.is_empty());
    let (tick, _) = build(&restored(now - MAX_BRIDGE.as_millis() as u64 - 1), &snap, &[], &[]);
    assert!(tick.gpus.is_empty());
}

#[test]
fn the_ledger_counts_where_there_is_a_limit_and_it_advanced_else_nvml() {
    let w = workload("w", 50);
    let snap0 = snapshot(1_000, vec![gpu(0, Some(0), None, None, vec![process(7, "w", 40)])]);
    let (_, prev) = build(&Previous::default(), &snap0, std::slice::from_ref(&w), &[ledger("w", 50, 1_000_000_000)]);
    let snap1 = snapshot(2_000, vec![gpu(0, Some(1), None, None, vec![process(7, "w", 40)])]);
    // 300 ms charged in the second.
    let (tick, prev) = build(&prev, &snap1, std::slice::from_ref(&w), &[ledger("w", 50, 1_300_000_000)]);
    assert_eq!(tick.workloads, vec![WorkloadRow { t0_ms: 1_000, t1_ms: 2_000, workload_id: "w".into(), gpu_uuid: "GPU-0".into(), busy_ms: 300, source: TimeSource::Ledger }]);
    // The ledger did not advance (work the shim does not see): NVML's 40 %.
    let snap2 = snapshot(3_000, vec![gpu(0, Some(2), None, None, vec![process(7, "w", 40)])]);
    let (tick, prev) = build(&prev, &snap2, std::slice::from_ref(&w), &[ledger("w", 50, 1_300_000_000)]);
    assert_eq!((tick.workloads[0].busy_ms, tick.workloads[0].source), (400, TimeSource::Nvml));
    // No limit (100 %): NVML even though the ledger advanced.
    let unlimited = workload("w", 100);
    let snap3 = snapshot(4_000, vec![gpu(0, Some(3), None, None, vec![process(7, "w", 10)])]);
    let (tick, _) = build(&prev, &snap3, std::slice::from_ref(&unlimited), &[ledger("w", 100, 2_000_000_000)]);
    assert_eq!((tick.workloads[0].busy_ms, tick.workloads[0].source), (100, TimeSource::Nvml));
}

#[test]
fn a_shared_vgpu_is_split_by_nvml_not_by_its_common_ledger() {
    let (mut a, mut b) = (workload("a", 50), workload("b", 50));
    a.vgpu = "p-x".into();
    b.vgpu = "p-x".into();
    let procs = || vec![process(1, "a", 30), process(2, "b", 20)];
    let (_, prev) = build(&Previous::default(), &snapshot(0, vec![gpu(0, Some(0), None, None, procs())]), &[a.clone(), b.clone()], &[ledger("p-x", 50, 0)]);
    let (tick, _) = build(&prev, &snapshot(1_000, vec![gpu(0, Some(0), None, None, procs())]), &[a, b], &[ledger("p-x", 50, 900_000_000)]);
    let got: Vec<_> = tick.workloads.iter().map(|r| (r.workload_id.as_str(), r.busy_ms, r.source)).collect();
    assert_eq!(got, [("a", 300, TimeSource::Nvml), ("b", 200, TimeSource::Nvml)]);
}

#[test]
fn gpu_time_is_capped_at_the_duration_and_zero_is_not_recorded() {
    let w = workload("w", 50);
    let procs = vec![process(1, "w", 100), process(2, "w", 100)];
    let (_, prev) = build(&Previous::default(), &snapshot(0, vec![gpu(0, None, None, None, procs.clone())]), std::slice::from_ref(&w), &[ledger("w", 50, 0)]);
    // NVML: two processes at 100 % each.
    let (tick, _) = build(&prev, &snapshot(500, vec![gpu(0, None, None, None, procs)]), std::slice::from_ref(&w), &[ledger("w", 50, 0)]);
    assert_eq!(tick.workloads[0].busy_ms, 500);
    // The ledger charged more than the interval (work queued ahead).
    let (tick, _) = build(&prev, &snapshot(500, vec![gpu(0, None, None, None, vec![])]), std::slice::from_ref(&w), &[ledger("w", 50, 2_000_000_000)]);
    assert_eq!((tick.workloads[0].busy_ms, tick.workloads[0].source), (500, TimeSource::Ledger));
    // Idle: no row.
    let (tick, _) = build(&prev, &snapshot(500, vec![gpu(0, None, None, None, vec![process(1, "w", 0)])]), &[w], &[ledger("w", 50, 0)]);
    assert!(tick.workloads.is_empty());
}

#[test]
fn a_clock_that_stepped_back_records_nothing() {
    let (_, prev) = build(&Previous::default(), &snapshot(5_000, vec![gpu(0, Some(0), Some(1.0), None, vec![])]), &[], &[]);
    let (tick, _) = build(&prev, &snapshot(4_000, vec![gpu(0, Some(10), Some(1.0), None, vec![process(1, "w", 50)])]), &[workload("w", 100)], &[]);
    assert_eq!(tick, Tick::default());
}

#[test]
fn rounds_absorbed_make_one_interval_with_the_same_totals() {
    let w = workload("w", 50);
    let mut prev = Previous::default();
    let mut whole = Tick::default();
    let mut written = Vec::new();
    for (i, (counter, power, ns, pct)) in [(0, Some(100.0), 0, 0), (1_000, Some(110.0), 300_000_000, 20), (1_500, Some(120.0), 300_000_000, 30), (900, Some(130.0), 700_000_000, 0)].into_iter().enumerate() {
        let snap = snapshot(1_000 * (i as u64 + 1), vec![gpu(0, Some(counter), power, Some(50), vec![process(7, "w", pct)])]);
        let (tick, next) = build(&prev, &snap, std::slice::from_ref(&w), &[ledger("w", 50, ns)]);
        written.push(tick.clone());
        whole.absorb(tick);
        prev = next;
    }
    assert_eq!(whole.gpus.len(), 1);
    let g = &whole.gpus[0];
    assert_eq!((g.t0_ms, g.t1_ms), (1_000, 4_000));
    // 1000 + 500 by the counter, then the driver reloaded: 130 W × 1 s.
    assert_eq!((g.energy_mj, g.energy_source, g.busy_ms, g.power_w, g.energy_counter_mj), (131_500, EnergySource::Power, Some(1_500), Some(130.0), Some(900)));
    let sum: u64 = written.iter().flat_map(|t| &t.gpus).map(|r| r.energy_mj).sum();
    assert_eq!(g.energy_mj, sum);
    // Ledger 300 ms, then NVML 30 % (the ledger did not advance), then ledger 400 ms.
    assert_eq!(whole.workloads, vec![WorkloadRow { t0_ms: 1_000, t1_ms: 4_000, workload_id: "w".into(), gpu_uuid: "GPU-0".into(), busy_ms: 1_000, source: TimeSource::Nvml }]);
    // A row that does not continue another is kept apart.
    let mut t = whole.clone();
    let mut apart = whole.workloads[0].clone();
    (apart.t0_ms, apart.t1_ms) = (5_000, 6_000);
    t.absorb(Tick { gpus: vec![], workloads: vec![apart] });
    assert_eq!(t.workloads.len(), 2);
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    /// One round: ms since the last, the counter's increase (None: no counter this round;
    /// Some(None): it restarted at 0), power, the workload's NVML %, ledger ns added.
    type Round = (u64, Option<Option<u64>>, Option<u32>, u32, u64);

    fn round() -> impl Strategy<Value = Round> {
        (1u64..5_000, prop::option::weighted(0.9, prop::option::weighted(0.9, 0u64..2_000_000)), prop::option::of(0u32..700), 0u32..=100, 0u64..6_000_000_000)
    }

    proptest! {
        #[test]
        fn rows_are_contiguous_bounded_and_add_up_when_absorbed(rounds in prop::collection::vec(round(), 2..40)) {
            let w = workload("w", 50);
            let (mut t, mut counter, mut charged) = (1_000_000u64, 10_000u64, 0u64);
            let mut prev = Previous::default();
            let mut all = Tick::default();
            let mut ticks = Vec::new();
            for (dt, bump, power, pct, ns) in rounds {
                t += dt;
                let reading = match bump {
                    Some(Some(b)) => { counter += b; Some(counter) }
                    Some(None) => { counter = 0; Some(0) }
                    None => None,
                };
                charged += ns;
                let snap = snapshot(t, vec![gpu(0, reading, power.map(f64::from), Some(pct), vec![process(7, "w", pct)])]);
                let (tick, next) = build(&prev, &snap, std::slice::from_ref(&w), &[ledger("w", 50, charged)]);
                for r in &tick.gpus {
                    prop_assert!(r.t1_ms > r.t0_ms);
                    prop_assert!(r.busy_ms.is_none_or(|b| b <= r.t1_ms - r.t0_ms));
                }
                for r in &tick.workloads {
                    prop_assert!(r.busy_ms > 0 && r.busy_ms <= r.t1_ms - r.t0_ms, "{r:?}");
                }
                ticks.push(tick.clone());
                all.absorb(tick);
                prev = next;
            }
            let rows: Vec<&GpuRow> = ticks.iter().flat_map(|t| &t.gpus).collect();
            let energy: u64 = rows.iter().map(|r| r.energy_mj).sum();
            prop_assert_eq!(all.gpus.iter().map(|r| r.energy_mj).sum::<u64>(), energy);
            let busy: u64 = ticks.iter().flat_map(|t| &t.workloads).map(|r| r.busy_ms).sum();
            prop_assert_eq!(all.workloads.iter().map(|r| r.busy_ms).sum::<u64>(), busy);
            prop_assert!(all.workloads.iter().all(|r| r.busy_ms <= r.t1_ms - r.t0_ms), "{:?}", all.workloads);
            // Contiguous rows absorb into one.
            if rows.windows(2).all(|p| p[0].t1_ms == p[1].t0_ms) && !rows.is_empty() {
                prop_assert_eq!(all.gpus.len(), 1);
                prop_assert_eq!((all.gpus[0].t0_ms, all.gpus[0].t1_ms), (rows[0].t0_ms, rows[rows.len() - 1].t1_ms));
            }
            // Where the counter was always read and never went back, the rows are exactly
            // its delta.
            if rows.iter().all(|r| r.energy_source == EnergySource::Counter) && rows.len() + 1 == ticks.len() {
                let first = rows[0].energy_counter_mj.unwrap() - rows[0].energy_mj;
                prop_assert_eq!(energy, rows[rows.len() - 1].energy_counter_mj.unwrap() - first);
            }
        }
    }
}
