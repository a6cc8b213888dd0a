//! Daily and monthly carbon budgets through `vgpu carbon plan/apply` under the simulated
//! driver: the allotment follows a file source's forecast (more clock now when now is
//! clean), what was spent comes from a history database filled here by SQL (schema.sql's
//! tables), an exhausted budget is reported and applies the lowest clocks, and bad budget
//! keys are usage errors. The time is fixed with `VGPU_NOW` (honoured only under
//! `--simulate`) and the zone with `TZ=UTC`, so that the day starts at 00:00Z.

use std::process::Child;

use crate::common::{workload, Sim};
use serde_json::Value;

const H100: (&str, &str) = ("NVIDIA H100 80GB HBM3", "80GiB");
const H: i64 = 3_600_000;
/// 2024-05-01T00:00:00Z.
const DAY: i64 = 1_714_521_600_000;

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A process holding memory on GPU 0 (through the simulated driver): the GPU has work, so
/// its clock matters to the planner.
fn busy(sim: &Sim) -> Killed {
    sim.json(&["devices", "--json"]); // makes the link directory with libcuda.so.1
    Killed(workload::unmanaged(sim, "busy", 64))
}

/// Dirty (500 g/kWh) but for a clean stretch (50) from 10:00 to 16:00.
fn forecast_file(sim: &Sim) -> String {
    let path = sim.path("intensity.csv");
    std::fs::write(
        &path,
        "timestamp,gco2_per_kwh\n2024-05-01T00:00:00Z,500\n2024-05-01T10:00:00Z,50\n2024-05-01T16:00:00Z,500\n2024-05-02T10:00:00Z,50\n",
    )
    .unwrap();
    format!("[carbon]\nsource = \"file\"\npath = \"{}\"\n", path.display())
}

/// The history: GPU 0 drew `kw` from 00:00 to `hours`, at the file's intensities.
fn fill_history(sim: &Sim, hours: i64, kw: f64) {
    let conn = vgpu_history::db::open_rw(&sim.path("lib")).expect("history database");
    for (ts, g) in [(DAY, 500.0), (DAY + 10 * H, 50.0), (DAY + 16 * H, 500.0)] {
        conn.execute(
            "INSERT OR REPLACE INTO intensity (ts_ms, kind, g_per_kwh, source, fetched_ms) VALUES (?1, 'reading', ?2, 'file', ?1)",
            rusqlite::params![ts, g],
        )
        .unwrap();
    }
    for h in 0..hours {
        conn.execute(
            "INSERT OR REPLACE INTO gpu_samples (t0_ms, t1_ms, gpu_uuid, gpu_index, energy_mj, energy_source) VALUES (?1, ?2, 'GPU-0', 0, ?3, 'counter')",
            rusqlite::params![DAY + h * H, DAY + (h + 1) * H, (kw * 3.6e9) as i64],
        )
        .unwrap();
    }
}

fn plan_at(sim: &Sim, now: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["carbon", "plan", "--json"];
    args.extend_from_slice(extra);
    sim.vgpu(&args).env("VGPU_NOW", now).env("TZ", "UTC").output().expect("run vgpu")
}

fn plan_json(sim: &Sim, now: &str) -> Value {
    let out = plan_at(sim, now, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON")
}

#[test]
fn a_daily_budget_spends_more_now_when_now_is_clean() {
    let sim = Sim::new(&[H100]);
    let _busy = busy(&sim);
    sim.write_vgpu_config(&format!("{}budget_g_per_day = 2500\n", forecast_file(&sim)));

    // No history yet: the logged plans (none) count as spent, and the plan says so.
    let got = plan_json(&sim, "2024-05-01T08:00:00Z");
    let day = &got["horizons"][0];
    assert_eq!((day["period"].as_str(), day["spent_from"].as_str(), day["spent_g"].as_f64()), (Some("day"), Some("plans"), Some(0.0)));
    assert!(got["notes"].as_array().unwrap().iter().any(|n| n.as_str().unwrap().contains("assumes the logged plans were kept")), "{got}");

    fill_history(&sim, 12, 0.3);
    let dirty = plan_json(&sim, "2024-05-01T08:00:00Z");
    let clean = plan_json(&sim, "2024-05-01T12:00:00Z");
    for (name, plan, spent) in [("dirty", &dirty, 8.0 * 0.3 * 500.0), ("clean", &clean, 10.0 * 0.3 * 500.0 + 2.0 * 0.3 * 50.0)] {
        let day = &plan["horizons"][0];
        assert_eq!(day["spent_from"], "history", "{name}: {plan}");
        assert!((day["spent_g"].as_f64().unwrap() - spent).abs() < 0.01, "{name}: {day}");
        assert_eq!((day["start_unix_ms"].as_i64(), day["end_unix_ms"].as_i64()), (Some(DAY), Some(DAY + 24 * H)), "{name}: local (UTC) day");
        assert_eq!(day["feasible"], true, "{name}: {day}");
        assert!((day["remaining_g"].as_f64().unwrap() - (2500.0 - spent)).abs() < 0.01, "{name}: {day}");
        assert!(day["planned_g"].as_f64().unwrap() <= day["remaining_g"].as_f64().unwrap() + 1e-6, "{name}: {day}");
        assert_eq!(plan["budget_g_per_hour"], day["allotted_g_per_hour_now"], "{name}: the allotment is the plan's rate");
    }
    // The allotted draw now (g/h ÷ g/kWh) and the clock: higher when now is clean.
    let kw = |p: &Value| p["horizons"][0]["allotted_g_per_hour_now"].as_f64().unwrap() / p["intensity_g_per_kwh"].as_f64().unwrap();
    let clock = |p: &Value| p["gpus"][0]["clock_mhz"].as_u64().unwrap();
    assert_eq!((dirty["intensity_g_per_kwh"].as_f64(), clean["intensity_g_per_kwh"].as_f64()), (Some(500.0), Some(50.0)));
    assert!(kw(&clean) > kw(&dirty), "clean {} kW, dirty {} kW", kw(&clean), kw(&dirty));
    assert!(clock(&clean) > clock(&dirty), "clean {} MHz, dirty {} MHz", clock(&clean), clock(&dirty));
    assert_eq!(clock(&clean), clean["gpus"][0]["max_clock_mhz"].as_u64().unwrap(), "clean: full clock");

    // The table says the same.
    let out = sim.vgpu(&["carbon", "plan"]).env("VGPU_NOW", "2024-05-01T12:00:00Z").env("TZ", "UTC").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("daily") && text.contains("ALLOTTED NOW") && text.contains("2024-05-02 00:00"), "{text}");
}

#[test]
fn an_exhausted_budget_is_reported_and_applies_the_lowest_clocks() {
    let sim = Sim::new(&[H100]);
    let _busy = busy(&sim);
    sim.write_vgpu_config(&format!("{}budget_g_per_day = 1000\nbudget_g_per_hour = 400\n", forecast_file(&sim)));
    fill_history(&sim, 8, 0.3); // 1200 g spent by 08:00
    let out = plan_at(&sim, "2024-05-01T08:00:00Z", &[]);
    assert_eq!(out.status.code(), Some(0), "plan reports, it does not fail");
    let got: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((got["budget_met"].as_bool(), got["horizons"][0]["feasible"].as_bool()), (Some(false), Some(false)), "{got}");
    let note = got["notes"].as_array().unwrap().iter().filter_map(Value::as_str).find(|n| n.contains("cannot be kept")).unwrap_or_default().to_string();
    assert!(note.starts_with("daily budget: ") && note.contains("1000 g") && note.contains("1200 g spent"), "{got}");
    assert_eq!(got["gpus"][0]["clock_mhz"], got["gpus"][0]["min_clock_mhz"]);

    let out = sim.vgpu(&["carbon", "apply", "--json"]).env("VGPU_NOW", "2024-05-01T08:00:00Z").env("TZ", "UTC").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["budget_met"], false);
    assert_eq!(report["horizons"][0]["feasible"], false);
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be kept"), "said on stderr");
    let devices = sim.json(&["devices", "--json"]);
    let gpu = &devices["gpus"][0];
    assert_eq!(report["gpus"][0]["clock_mhz"], 345, "{report}");
    assert!(gpu.to_string().contains("345"), "the driver runs the lowest clock: {gpu}");
    // The decision log records the horizon's figures.
    let log = std::fs::read_to_string(sim.path("lib/carbon.jsonl")).unwrap();
    let line: Value = serde_json::from_str(log.lines().last().unwrap()).unwrap();
    assert_eq!((line["horizons"][0]["period"].as_str(), line["horizons"][0]["spent_g"].as_f64()), (Some("day"), Some(1200.0)), "{line}");
}

#[test]
fn a_monthly_budget_and_the_tightest_binds() {
    let sim = Sim::new(&[H100]);
    let _busy = busy(&sim);
    sim.write_vgpu_config(&format!("{}budget_g_per_month = 1e9\nbudget_g_per_day = 1e9\nbudget_g_per_hour = 30\n", forecast_file(&sim)));
    let got = plan_json(&sim, "2024-05-01T12:00:00Z");
    let periods: Vec<&str> = got["horizons"].as_array().unwrap().iter().map(|h| h["period"].as_str().unwrap()).collect();
    assert_eq!(periods, ["day", "month"]);
    assert_eq!(got["horizons"][1]["end_unix_ms"], DAY + 31 * 24 * H, "May ends on the 31st");
    assert_eq!(got["budget_g_per_hour"], 30.0, "loose day and month: the per-hour budget binds");
}

#[test]
fn bad_budget_keys_are_usage_errors_naming_the_key() {
    let sim = Sim::new(&[H100]);
    for (text, key) in [("budget_g_per_day = -5", "budget_g_per_day"), ("budget_g_per_month = \"lots\"", "budget_g_per_month"), ("budget_g_per_month = nan", "budget_g_per_month")] {
        sim.write_vgpu_config(&format!("[carbon]\nsource = \"static\"\nvalue = 100\n{text}\n"));
        let out = sim.vgpu(&["carbon", "plan"]).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{text}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains(key), "{err}");
    }
}

#[test]
fn the_forecast_ahead_changes_the_allotment_now() {
    // At 08:00 (dirty now) with a clean stretch ahead, the clean hours cost little of the
    // day's budget, so the dirty hours, now among them, get more of it than when the whole
    // day is forecast dirty.
    let sim = Sim::new(&[H100]);
    let _busy = busy(&sim);
    let config = format!("{}budget_g_per_day = 2500\n", forecast_file(&sim));
    sim.write_vgpu_config(&config);
    fill_history(&sim, 8, 0.3);
    let allotted = |p: &Value| p["horizons"][0]["allotted_g_per_hour_now"].as_f64().unwrap();
    let with_clean_stretch = plan_json(&sim, "2024-05-01T08:00:00Z");
    std::fs::write(sim.path("intensity.csv"), "2024-05-01T00:00:00Z,500\n").unwrap();
    let all_dirty = plan_json(&sim, "2024-05-01T08:00:00Z");
    assert_eq!(with_clean_stretch["horizons"][0]["spent_g"], all_dirty["horizons"][0]["spent_g"]);
    assert!(
        allotted(&with_clean_stretch) > allotted(&all_dirty) + 1.0,
        "clean stretch ahead: {} g/h now; all dirty: {} g/h now",
        allotted(&with_clean_stretch),
        allotted(&all_dirty)
    );
}

#[test]
fn without_a_history_the_logged_plans_count_as_spent() {
    let sim = Sim::new(&[H100]);
    let _busy = busy(&sim);
    sim.write_vgpu_config(&format!("{}budget_g_per_day = 2500\n", forecast_file(&sim)));
    let apply = |now: &str| {
        let out = sim.vgpu(&["carbon", "apply", "--json"]).env("VGPU_NOW", now).env("TZ", "UTC").output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let first = apply("2024-05-01T01:00:00Z");
    let rate = first["predicted_g_per_hour"].as_f64().unwrap();
    assert!(rate > 0.0, "{first}");
    assert!(!sim.path("lib/history.db").exists() || {
        // apply records the forecast as root: a database with no GPU samples in it.
        let conn = rusqlite::Connection::open(sim.path("lib/history.db")).unwrap();
        conn.query_row("SELECT COUNT(*) FROM gpu_samples", [], |r| r.get::<_, i64>(0)).unwrap() == 0
    });
    let got = plan_json(&sim, "2024-05-01T03:00:00Z");
    let day = &got["horizons"][0];
    assert_eq!(day["spent_from"], "plans", "{day}");
    assert!((day["spent_g"].as_f64().unwrap() - 2.0 * rate).abs() < 1e-6, "two hours at {rate} g/h: {day}");
    let notes = got["notes"].to_string();
    assert!(notes.contains("the history has no GPU samples since") || notes.contains("there is no history database"), "{notes}");
}
