use prometheus_parse::{Sample, Scrape, Value};

use super::*;
use crate::metrics::enforcements::Action;
use crate::metrics::enforcements::WorkloadLabels as Who;
use crate::metrics::model::*;

fn sample() -> Metrics {
    Metrics {
        collected_unix_ms: 1_700_000_000_500,
        gpus: vec![
            GpuMetrics {
                index: 0,
                uuid: "GPU-aaaa".into(),
                name: "NVIDIA A100-SXM4-40GB".into(),
                memory_total_bytes: 40 << 30,
                memory_used_bytes: 3 << 30,
                utilization_pct: Some(42),
                power_w: Some(250.5),
                energy_mj: Some(1_234_567),
                sm_clock_mhz: Some(1410),
                sm_clock_max_mhz: Some(1410),
                cap: Some(Cap::LockedClocks { min_mhz: 210, max_mhz: 900 }),
                processes: 2,
                unmanaged_processes: 1,
            },
            GpuMetrics {
                index: 1,
                uuid: "GPU-bbbb".into(),
                name: "NVIDIA A100-SXM4-40GB".into(),
                memory_total_bytes: 40 << 30,
                memory_used_bytes: 0,
                utilization_pct: None,
                power_w: None,
                energy_mj: None,
                sm_clock_mhz: None,
                sm_clock_max_mhz: None,
                cap: Some(Cap::PowerLimit { mw: 150_000 }),
                processes: 0,
                unmanaged_processes: 0,
            },
        ],
        workloads: vec![WorkloadMetrics {
            id: "a1b2c3d4".into(),
            name: "train".into(),
            user: "alice".into(),
            partition: None,
            compute_policy: "strict".into(),
            state: "running".into(),
            priority: 60,
            pool_blocks: Some(10),
            processes: 3,
            enforcement: Some("throttled".into()),
            slurm: Some((4242, "0".into())),
            gpus: vec![WorkloadGpuMetrics {
                index: 0,
                memory_quota_bytes: 4 << 30,
                memory_used_bytes: Some(2 << 30),
                memory_peak_bytes: Some(3 << 30),
                memory_driver_bytes: Some(2560 << 20),
                compute_target_pct: 30,
                compute_measured_pct: Some(28.5),
                gpu_time_ns: 1_500_000_000,
                throttled_ns: 250_000_000,
                turns_taken: 0,
                turn_wait_ns: 0,
                switches_avoided: 0,
            }],
        }],
        pool: Some(PoolMetrics {
            block_tflops: 1.0,
            total_blocks: 624,
            used_blocks: 10,
            used_by_priority: vec![(60, 10)],
            workloads_by_state: vec![("running".into(), 1)],
        }),
        carbon: CarbonMetrics {
            intensity: Some(IntensityMetrics {
                g_per_kwh: 200.0,
                source: "static".into(),
                status: "fresh".into(),
                timestamp_unix_s: 1_700_000_000,
            }),
            budget_g_per_hour: Some(300.0),
            emission_rate_g_per_hour: Some(50.1),
        },
        services: vec![ServiceMetrics { name: "web".into(), desired: 3, actual: 2, signals: vec![("cpu".into(), 0.93, 0.7)] }],
    }
}

fn parse(text: &str) -> Scrape {
    Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("parses")
}

fn find<'a>(s: &'a Scrape, metric: &str, labels: &[(&str, &str)]) -> Option<&'a Sample> {
    s.samples.iter().find(|x| x.metric == metric && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
}

fn value(s: &Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    match find(s, metric, labels).unwrap_or_else(|| panic!("no {metric}{labels:?}")).value {
        Value::Gauge(v) | Value::Counter(v) | Value::Untyped(v) => v,
        ref other => panic!("{metric}: {other:?}"),
    }
}

fn rendered() -> Exposition {
    let e = Enforcements::default();
    let who = Who { id: "a1b2c3d4".into(), name: "train".into(), user: "alice".into() };
    e.record(Action::Kill, "memory", &who);
    e.record(Action::Kill, "memory", &who);
    e.record(Action::Report, "unmanaged", &Who::none());
    e.history_failure("disk-full");
    render(&sample(), &e).unwrap()
}

#[test]
fn gpus_in_base_units_with_their_caps() {
    let s = parse(&rendered().text);
    let g0 = [("gpu", "0"), ("uuid", "GPU-aaaa")];
    let g1 = [("gpu", "1"), ("uuid", "GPU-bbbb")];
    assert_eq!(value(&s, "vgpu_gpu_info", &[("gpu", "0"), ("name", "NVIDIA A100-SXM4-40GB")]), 1.0);
    assert_eq!(value(&s, "vgpu_gpu_memory_total_bytes", &g0), (40u64 << 30) as f64);
    assert_eq!(value(&s, "vgpu_gpu_memory_used_bytes", &g0), (3u64 << 30) as f64);
    assert_eq!(value(&s, "vgpu_gpu_utilization_ratio", &g0), 0.42);
    assert_eq!(value(&s, "vgpu_gpu_power_watts", &g0), 250.5);
    assert_eq!(value(&s, "vgpu_gpu_energy_joules_total", &g0), 1234.567);
    assert!(matches!(find(&s, "vgpu_gpu_energy_joules_total", &g0).unwrap().value, Value::Counter(_)));
    assert_eq!(value(&s, "vgpu_gpu_sm_clock_hertz", &g0), 1.41e9);
    assert_eq!(value(&s, "vgpu_gpu_sm_clock_max_hertz", &g0), 1.41e9);
    assert_eq!(value(&s, "vgpu_gpu_capped", &g0), 1.0);
    assert_eq!(value(&s, "vgpu_gpu_clock_cap_hertz", &g0), 9e8);
    assert_eq!(value(&s, "vgpu_gpu_processes", &g0), 2.0);
    assert_eq!(value(&s, "vgpu_gpu_unmanaged_processes", &g0), 1.0);
    // What a GPU does not report is left out, not zero.
    for absent in ["vgpu_gpu_utilization_ratio", "vgpu_gpu_power_watts", "vgpu_gpu_energy_joules_total", "vgpu_gpu_sm_clock_hertz"] {
        assert!(find(&s, absent, &g1).is_none(), "{absent}");
    }
    assert_eq!(value(&s, "vgpu_gpu_capped", &g1), 1.0);
    assert_eq!(value(&s, "vgpu_gpu_power_cap_watts", &g1), 150.0);
    assert!(find(&s, "vgpu_gpu_clock_cap_hertz", &g1).is_none());
}

#[test]
fn workloads_with_their_labels_state_and_enforcements() {
    let s = parse(&rendered().text);
    let w = [("id", "a1b2c3d4"), ("name", "train"), ("user", "alice")];
    let wg = [("id", "a1b2c3d4"), ("name", "train"), ("user", "alice"), ("gpu", "0")];
    assert_eq!(value(&s, "vgpu_workload_memory_quota_bytes", &wg), (4u64 << 30) as f64);
    assert_eq!(value(&s, "vgpu_workload_memory_used_bytes", &wg), (2u64 << 30) as f64);
    assert_eq!(value(&s, "vgpu_workload_memory_peak_bytes", &wg), (3u64 << 30) as f64);
    assert_eq!(value(&s, "vgpu_workload_memory_driver_bytes", &wg), (2560u64 << 20) as f64);
    assert_eq!(value(&s, "vgpu_workload_compute_share_target_ratio", &wg), 0.3);
    assert_eq!(value(&s, "vgpu_workload_compute_share_measured_ratio", &wg), 0.285);
    assert_eq!(value(&s, "vgpu_workload_gpu_time_seconds_total", &wg), 1.5);
    assert_eq!(value(&s, "vgpu_workload_compute_throttled_seconds_total", &wg), 0.25);
    assert_eq!(value(&s, "vgpu_workload_priority", &w), 60.0);
    assert_eq!(value(&s, "vgpu_workload_processes", &w), 3.0);
    assert_eq!(value(&s, "vgpu_workload_pool_blocks", &w), 10.0);
    assert_eq!(value(&s, "vgpu_workload_info", &[("id", "a1b2c3d4"), ("partition", ""), ("compute_policy", "strict")]), 1.0);
    // A Slurm step's workload: its job and step on the info metric, joined on `id`.
    assert_eq!(value(&s, "vgpu_workload_info", &[("id", "a1b2c3d4"), ("slurm_job", "4242"), ("slurm_step", "0")]), 1.0);
    assert_eq!(value(&s, "vgpu_workload_enforcement", &[("id", "a1b2c3d4"), ("action", "throttled")]), 1.0);
    for state in ["waiting", "starting", "running", "suspended"] {
        let want = if state == "running" { 1.0 } else { 0.0 };
        assert_eq!(value(&s, "vgpu_workload_state", &[("id", "a1b2c3d4"), ("state", state)]), want, "{state}");
    }
    let kills = [("action", "kill"), ("reason", "memory"), ("id", "a1b2c3d4"), ("name", "train"), ("user", "alice")];
    assert_eq!(value(&s, "vgpu_enforcements_total", &kills), 2.0);
    assert!(matches!(find(&s, "vgpu_enforcements_total", &kills).unwrap().value, Value::Counter(_)));
    assert_eq!(value(&s, "vgpu_enforcements_total", &[("action", "report"), ("reason", "unmanaged"), ("id", "")]), 1.0);
}

#[test]
fn pool_carbon_and_the_round() {
    let s = parse(&rendered().text);
    assert_eq!(value(&s, "vgpu_pool_blocks", &[]), 624.0);
    assert_eq!(value(&s, "vgpu_pool_used_blocks", &[]), 10.0);
    assert_eq!(value(&s, "vgpu_pool_block_tflops", &[]), 1.0);
    assert_eq!(value(&s, "vgpu_pool_priority_used_blocks", &[("priority", "60")]), 10.0);
    assert_eq!(value(&s, "vgpu_pool_workloads", &[("state", "running")]), 1.0);
    assert_eq!(value(&s, "vgpu_carbon_intensity_grams_per_kwh", &[("source", "static"), ("status", "fresh")]), 200.0);
    assert_eq!(value(&s, "vgpu_carbon_intensity_timestamp_seconds", &[]), 1.7e9);
    assert_eq!(value(&s, "vgpu_carbon_budget_grams_per_hour", &[]), 300.0);
    assert_eq!(value(&s, "vgpu_carbon_emission_rate_grams_per_hour", &[]), 50.1);
    assert_eq!(value(&s, "vgpu_watch_last_round_timestamp_seconds", &[]), 1_700_000_000.5);
}

#[test]
fn services_replicas_and_signals() {
    let s = parse(&rendered().text);
    assert_eq!(value(&s, "vgpu_service_replicas", &[("service", "web"), ("kind", "desired")]), 3.0);
    assert_eq!(value(&s, "vgpu_service_replicas", &[("service", "web"), ("kind", "actual")]), 2.0);
    assert_eq!(value(&s, "vgpu_service_signal_ratio", &[("service", "web"), ("signal", "cpu")]), 0.93);
    assert_eq!(value(&s, "vgpu_service_signal_target_ratio", &[("service", "web"), ("signal", "cpu")]), 0.7);
}

#[test]
fn what_is_unknown_is_left_out() {
    let mut m = sample();
    m.pool = None;
    m.carbon = CarbonMetrics::default();
    m.workloads[0].gpus[0].memory_used_bytes = None;
    m.workloads[0].gpus[0].compute_measured_pct = None;
    m.workloads[0].enforcement = None;
    let s = parse(&render(&m, &Enforcements::default()).unwrap().text);
    for absent in [
        "vgpu_pool_blocks",
        "vgpu_carbon_intensity_grams_per_kwh",
        "vgpu_carbon_budget_grams_per_hour",
        "vgpu_carbon_emission_rate_grams_per_hour",
        "vgpu_workload_memory_used_bytes",
        "vgpu_workload_compute_share_measured_ratio",
        "vgpu_workload_enforcement",
        "vgpu_enforcements_total",
    ] {
        assert!(s.samples.iter().all(|x| x.metric != absent), "{absent}");
    }
    assert_eq!(value(&s, "vgpu_workload_memory_quota_bytes", &[("id", "a1b2c3d4")]), (4u64 << 30) as f64);
}

#[test]
fn the_two_formats_carry_the_same_samples() {
    let r = rendered();
    assert!(r.openmetrics.ends_with("# EOF\n"), "OpenMetrics ends with its EOF marker");
    assert!(r.openmetrics.contains("# TYPE vgpu_enforcements counter\n"));
    assert!(!r.text.contains("# EOF") && !r.text.contains("# UNIT"));
    assert!(r.text.contains("# TYPE vgpu_enforcements_total counter\n"));
    assert!(r.text.contains("# HELP vgpu_enforcements_total "));
    let sample_lines = |t: &str| -> Vec<String> {
        let mut v: Vec<String> = t.lines().filter(|l| !l.starts_with('#')).map(String::from).collect();
        v.sort();
        v
    };
    assert_eq!(sample_lines(&r.openmetrics), sample_lines(&r.text));
    // Every sample of the text format has its family's HELP and TYPE.
    let s = parse(&r.text);
    for x in &s.samples {
        assert!(s.docs.contains_key(&x.metric), "{} has no HELP", x.metric);
        assert!(x.metric.starts_with("vgpu_"), "{}", x.metric);
    }
}

#[test]
fn openmetrics_to_text_renames_counter_families_only() {
    let om = "# HELP a_seconds A.\n# TYPE a_seconds counter\n# UNIT a_seconds seconds\na_seconds_total 1.5\n# HELP b B b.\n# TYPE b gauge\nb{x=\"1\"} 2\n# EOF\n";
    assert_eq!(
        to_prometheus_text(om),
        "# HELP a_seconds_total A.\n# TYPE a_seconds_total counter\na_seconds_total 1.5\n# HELP b B b.\n# TYPE b gauge\nb{x=\"1\"} 2\n"
    );
}

#[test]
fn the_guide_documents_every_metric() {
    let readme = include_str!("../../../../../docs/enforcer.md");
    let text = rendered().text;
    let names: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.split(' ').next()).collect();
    assert!(names.len() > 30, "{names:?}");
    for name in names {
        assert!(readme.contains(&format!("`{name}`")), "docs/enforcer.md's Metrics table lacks {name}");
    }
}
