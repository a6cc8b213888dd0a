//! The JSON scripting contract: every `--json` output is one object with `"schema": N`, and
//! its field names and types are those of `tests/fixtures/json-schema-vN.txt`. A field
//! renamed, removed or retyped without bumping `vgpu_json::SCHEMA` fails here;
//! so does a subcommand with `--json` that this test does not run.
//!
//! The fixture lists, for every output, each field's path and JSON type(s), collected from
//! one scenario under the simulated driver: a partition with a workload in it, a workload
//! with its own slice, a pool workload preempted by another, a process in no vGPU, a
//! damaged record for `doctor --repair`, the carbon commands. Re-bless with
//! `VGPU_BLESS=1 cargo test --test integration cli::json_schema::`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Child;

use crate::common::{wait_for, workload, Sim};
use serde_json::Value;
use vgpu_json::SCHEMA;
use crate::common::workload::workload_bin;

/// Every subcommand (`partition list`, `carbon plan` …) that has a `--json` flag, from the
/// clap definition.
fn json_commands() -> BTreeSet<String> {
    fn walk(cmd: &clap::Command, prefix: &str, out: &mut BTreeSet<String>) {
        for sub in cmd.get_subcommands() {
            let name = if prefix.is_empty() { sub.get_name().to_string() } else { format!("{prefix} {}", sub.get_name()) };
            if sub.get_arguments().any(|a| a.get_long() == Some("json")) {
                out.insert(name.clone());
            }
            walk(sub, &name, out);
        }
    }
    let mut out = BTreeSet::new();
    walk(&vgpu::cli::command(), "", &mut out);
    out
}

/// JSON types seen at each field path: `.workloads[].gpus[].gpu_index` → {"number"}.
type Fields = BTreeMap<String, BTreeSet<&'static str>>;

fn collect(path: &str, value: &Value, out: &mut Fields) {
    let kind = match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    if !path.is_empty() {
        out.entry(path.to_string()).or_default().insert(kind);
    }
    match value {
        Value::Array(items) => items.iter().for_each(|v| collect(&format!("{path}[]"), v, out)),
        Value::Object(map) => map.iter().for_each(|(k, v)| collect(&format!("{path}.{k}"), v, out)),
        _ => {}
    }
}

/// One line per field: `OUTPUT FIELD: TYPE` (a field seen null and with a value is that
/// value's type; one only ever seen null is `null`).
fn lines(output: &str, fields: &Fields) -> Vec<String> {
    fields
        .iter()
        .map(|(path, kinds)| {
            let real: Vec<&str> = kinds.iter().copied().filter(|k| *k != "null").collect();
            let kinds = if real.is_empty() { "null".to_string() } else { real.join("|") };
            format!("{output} {path}: {kinds}")
        })
        .collect()
}

/// Ends a process left running when the test ends, however it ends: SIGTERM, which a
/// `vgpu run` relays to its workload before cleaning up (SIGKILL would orphan the workload).
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.0.id() as i32), nix::sys::signal::Signal::SIGTERM);
        let _ = self.0.wait();
    }
}

/// `gpu_workload idle 300 --alloc-mib 64 --ready FILE` under `vgpu run RUN_ARGS`, once ready.
fn gpu_workload(sim: &Sim, name: &str, run_args: &[&str]) -> Killed {
    let ready = sim.path(&format!("{name}.ready"));
    let mut args = vec!["run", "--name", name];
    args.extend_from_slice(run_args);
    let ready_arg = ready.to_str().unwrap().to_string();
    let bin = workload_bin().to_str().unwrap().to_string();
    args.extend_from_slice(&["--", &bin, "idle", "300", "--alloc-mib", "64", "--ready", &ready_arg]);
    let child = Killed(sim.spawn(&args));
    wait_for(&format!("{name} to allocate"), || ready.exists());
    child
}

fn state_of(sim: &Sim, name: &str) -> Option<String> {
    let ps = sim.json(&["ps", "--json"]);
    ps["workloads"].as_array()?.iter().find(|w| w["name"] == name).and_then(|w| w["state"].as_str()).map(str::to_string)
}

/// Run `vgpu --simulate ARGS`, insist on JSON on stdout (whatever the exit status: `doctor`
/// exits 1 when a check fails), and that it is an object with this schema.
fn document(sim: &Sim, args: &[&str]) -> Value {
    let out = sim.vgpu(args).output().expect("run vgpu");
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("vgpu {args:?}: no JSON on stdout ({e}): {}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    });
    assert!(doc.is_object(), "vgpu {args:?}: a top-level JSON output is an object: {doc}");
    assert_eq!(doc["schema"], SCHEMA, "vgpu {args:?} does not say \"schema\": {SCHEMA}: {doc}");
    doc
}

fn fixture(schema: u32) -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join(format!("tests/fixtures/json-schema-v{schema}.txt"))
}

#[test]
fn every_json_output_keeps_its_fields_unless_the_schema_is_bumped() {
    let sim = Sim::new(&[("NVIDIA L4", "24GiB")]);
    let pool_config = "[pool.tflops]\n\"NVIDIA L4\" = 0.5\n\n[[pool.device]]\nkind = \"npu\"\nname = \"sim-npu\"\ntflops = 10\nenv = \"SIM_NPU_VISIBLE\"\n";
    sim.write_vgpu_config(pool_config);
    sim.vgpu(&["partition", "create", "p1", "--gpu", "0", "--mem", "2G"]).assert().success();
    let mut children = vec![gpu_workload(&sim, "inpart", &["--partition", "p1"]), gpu_workload(&sim, "solo", &["--mem", "1G"])];
    children.push(Killed(sim.spawn(&["run", "--name", "low", "--tflops", "8", "--kind", "npu", "--priority", "10", "--", "sleep", "300"])));
    wait_for("low to run", || state_of(&sim, "low").as_deref() == Some("running"));
    children.push(Killed(sim.spawn(&["run", "--name", "high", "--tflops", "5", "--kind", "npu", "--priority", "90", "--", "sleep", "300"])));
    wait_for("high to preempt low", || state_of(&sim, "high").as_deref() == Some("running") && state_of(&sim, "low").as_deref() == Some("suspended"));
    // A process in no vGPU on the same GPU: the simulated driver through vgpu's link directory.
    children.push(Killed(workload::unmanaged(&sim, "rogue", 64)));

    // A history (as `vgpu watch` records it) for `carbon report` and `ps -a`'s "ended": a
    // workload ended a minute ago on a GPU with a measured power model, another GPU without.
    let history = vgpu_history::db::open_rw(&sim.path("lib")).unwrap();
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64 - 120_000;
    history
        .execute_batch(&format!(
            "INSERT INTO gpu_samples VALUES ({t}, {t} + 10000, 'GPU-a', 0, 'NVIDIA L4', 3000000, 'counter', 9000, 1500, 90.5, NULL);
             INSERT INTO gpu_samples VALUES ({t}, {t} + 10000, 'GPU-b', 1, NULL, 1000000, 'power', NULL, NULL, NULL, NULL);
             INSERT INTO workload_gpu_time VALUES ({t}, {t} + 10000, 'hist1', 'GPU-a', 6000, 'ledger');
             INSERT INTO workloads VALUES ('hist1', 'old', 0, 'root', 'web', 'python', 'GPU-a', {t}, {t} + 60000, 'exit 0');
             INSERT INTO intensity VALUES ({t}, 'reading', 300, 'file', {t});
             INSERT INTO power_models VALUES ('GPU-a', 'NVIDIA L4', {t}, 2040, 20, 72, 2, 1, 0.5, '[]');"
        ))
        .unwrap();
    drop(history);
    let carbon = ["--intensity", "300", "--budget", "500"];
    let mut runs: Vec<(&str, Vec<&str>)> = vec![
        ("devices", vec!["devices", "--json"]),
        ("pool", vec!["pool", "--json"]),
        ("partition list", vec!["partition", "list", "--json"]),
        ("partition update", vec!["partition", "update", "p1", "--compute", "50", "--json"]),
        ("update", vec!["update", "solo", "--compute", "40", "--json"]),
        ("suspend", vec!["suspend", "solo", "--json"]),
        ("ps", vec!["ps", "--json", "-a", "--unmanaged"]),
        ("resume", vec!["resume", "solo", "--json"]),
        ("carbon intensity", vec!["carbon", "intensity", "--json", "--intensity", "300"]),
        ("carbon reset", vec!["carbon", "reset", "--json"]),
        ("carbon report", vec!["carbon", "report", "--json"]),
        ("doctor", vec!["doctor", "--json"]),
    ];
    for sub in ["plan", "apply"] {
        let mut args = vec!["carbon", sub, "--json"];
        args.extend_from_slice(&carbon);
        runs.push(if sub == "plan" { ("carbon plan", args) } else { ("carbon apply", args) });
        // A budget even the lowest clocks exceed: the plan's notes say so.
        runs.push((if sub == "plan" { "carbon plan" } else { "carbon apply" }, vec!["carbon", sub, "--json", "--intensity", "300", "--budget", "1"]));
    }
    let mut golden = Vec::new();
    let mut covered = BTreeSet::new();
    let mut by_output: BTreeMap<&str, Fields> = BTreeMap::new();
    for (output, args) in &runs {
        collect("", &document(&sim, args), by_output.entry(output).or_default());
        covered.insert(output.to_string());
    }
    // A daily budget (its `horizons`) and a forecast, from a static source.
    sim.write_vgpu_config(&format!("{pool_config}\n[carbon]\nsource = \"static\"\nvalue = 300\nbudget_g_per_day = 5000\n"));
    for (output, args) in [
        ("carbon plan", vec!["carbon", "plan", "--json"]),
        ("carbon apply", vec!["carbon", "apply", "--json"]),
        ("carbon intensity --forecast", vec!["carbon", "intensity", "--forecast", "--json"]),
    ] {
        collect("", &document(&sim, &args), by_output.entry(output).or_default());
    }
    sim.write_vgpu_config(pool_config);
    for (output, fields) in &by_output {
        golden.extend(lines(output, fields));
    }
    // A damaged record for `doctor --repair` to remove.
    std::fs::write(sim.path("run/workloads/0123456789ab.json"), "{ damaged").unwrap();
    let mut fields = Fields::new();
    collect("", &document(&sim, &["doctor", "--repair", "--json"]), &mut fields);
    golden.extend(lines("doctor --repair", &fields));
    let mut fields = Fields::new();
    collect("", &document(&sim, &["kill", "--json", "--signal", "KILL", "solo", "inpart", "high", "low"]), &mut fields);
    golden.extend(lines("kill", &fields));
    covered.insert("kill".to_string());
    drop(children);
    // Profiling, on the GPU now free (forced: the killed workloads' processes may linger
    // in the driver's list for a moment).
    let mut fields = Fields::new();
    collect("", &document(&sim, &["carbon", "profile", "--json", "--clocks", "3", "--seconds", "0.2", "--force"]), &mut fields);
    golden.extend(lines("carbon profile", &fields));
    covered.insert("carbon profile".to_string());

    // Services: one per kind of placement, so that every option field has a value, and the
    // runner's state (replicas, a decision, why short) written as the runner writes it.
    let full = [
        "--gpu", "0", "--mem", "1G", "--compute", "20", "--compute-policy", "fair", "--priority", "40", "--freq-sensitivity", "0.5", "--cpus", "1",
        "--memory", "64M", "--pids", "100", "--user", "root", "--env", "A=1", "--cwd", "/tmp", "--oversubscribe", "--scale-on", "cpu=70%",
    ];
    let service_runs: [Vec<&str>; 4] = [
        [&["service", "create", "web", "--replicas", "1-4", "--json"][..], &full[..], &["--", "sleep", "1"]].concat(),
        vec!["service", "create", "inpart", "--replicas", "1", "--partition", "p1", "--json", "--", "true"],
        vec!["service", "create", "pooled", "--replicas", "1", "--tflops", "1", "--kind", "npu", "--json", "--", "true"],
        vec!["service", "create", "counted", "--replicas", "1", "--gpus", "1", "--json", "--", "true"],
    ];
    let mut fields = Fields::new();
    for args in &service_runs {
        collect("", &document(&sim, args), &mut fields);
    }
    golden.extend(lines("service create", &fields));
    std::fs::write(
        sim.path("lib/services/web.state.json"),
        r#"{"desired": 2, "short": "replica 1 not admitted", "stopping": false,
            "decisions": [{"at_unix_ms": 1, "current": 1, "recommended": 2, "desired": 2, "reason": "cpu",
                           "values": [{"signal": "cpu", "value": 0.9, "target": 0.7, "replicas": 1, "recommended": 2}]}],
            "replicas": [{"index": 0, "workload_id": "0123456789ab", "restarts": 1, "last_exit": 137, "next_start_unix_ms": 5}]}"#,
    )
    .unwrap();
    std::fs::write(sim.path("lib/services/damaged.toml"), "replicas = 1\nbogus = 1\ncommand = [\"true\"]\n").unwrap();
    let names = ["web", "inpart", "pooled", "counted"];
    for (output, args) in [
        ("service list", vec!["service", "list", "--json"]),
        ("service show", vec!["service", "show", "NAME", "--json"]),
        ("service scale", vec!["service", "scale", "NAME", "1", "--json"]),
        ("service update", vec!["service", "update", "NAME", "--cpus", "2", "--json"]),
        ("service remove", vec!["service", "remove", "NAME", "--json"]),
    ] {
        let mut fields = Fields::new();
        for name in if args.contains(&"NAME") { &names[..] } else { &names[..1] } {
            let args: Vec<&str> = args.iter().map(|a| if *a == "NAME" { *name } else { a }).collect();
            collect("", &document(&sim, &args), &mut fields);
        }
        golden.extend(lines(output, &fields));
    }
    covered.extend(["service create", "service list", "service show", "service scale", "service update", "service remove"].map(String::from));

    let missing: Vec<String> = json_commands().into_iter().filter(|c| !covered.contains(c)).collect();
    assert!(missing.is_empty(), "these subcommands have --json but tests/cli/json_schema.rs does not run them: {missing:?}");

    golden.sort();
    let current = golden.join("\n") + "\n";
    let path = fixture(SCHEMA);
    let committed = std::fs::read_to_string(&path).ok();
    let committed_lines: BTreeSet<&str> = committed.as_deref().unwrap_or_default().lines().collect();
    let current_lines: BTreeSet<&str> = current.lines().collect();
    let gone: Vec<&str> = committed_lines.difference(&current_lines).copied().collect();
    let added: Vec<&str> = current_lines.difference(&committed_lines).copied().collect();
    if std::env::var_os("VGPU_BLESS").is_some_and(|v| v == "1") {
        assert!(
            committed.is_none() || gone.is_empty(),
            "not blessed: fields were renamed, removed or retyped under schema {SCHEMA}:\n  {}\nbump SCHEMA in crates/vgpu-json/src/lib.rs (and docs/json-schema.md), then bless again",
            gone.join("\n  ")
        );
        std::fs::write(&path, &current).unwrap();
        return;
    }
    let Some(_) = committed else {
        panic!("{} is missing: bless it with VGPU_BLESS=1 cargo test --test integration cli::json_schema::", path.display());
    };
    assert!(
        gone.is_empty(),
        "JSON fields were renamed, removed or retyped without bumping the schema:\n  {}\nscripts rely on these: bump SCHEMA in crates/vgpu-json/src/lib.rs, document the change in docs/json-schema.md, and re-bless with VGPU_BLESS=1 (new or changed fields:\n  {})",
        gone.join("\n  "),
        added.join("\n  ")
    );
    assert!(
        added.is_empty(),
        "new JSON fields (adding is compatible, no bump needed): document them in docs/json-schema.md and re-bless with VGPU_BLESS=1:\n  {}",
        added.join("\n  ")
    );
}

/// The user guide's JSON reference is `docs/json-schema.md` itself (`JSON_SCHEMA_DOC`, which
/// the man pages use): a page of the book, not a copy that could drift.
#[test]
fn the_guide_documents_the_schema_as_the_man_pages_do() {
    assert!(vgpu_json::JSON_SCHEMA_DOC.starts_with(&format!("# JSON output (schema {SCHEMA})\n")), "docs/json-schema.md names another schema");
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    let summary = std::fs::read_to_string(root.join("docs/SUMMARY.md")).unwrap();
    assert!(summary.contains("](json-schema.md)"), "docs/SUMMARY.md does not list json-schema.md");
    let scripting = std::fs::read_to_string(root.join("docs/scripting.md")).unwrap();
    assert!(scripting.contains("](json-schema.md)"), "docs/scripting.md does not link to the JSON reference");
}

/// Every subcommand with `--json` has its section in the documentation (what a man page's
/// JSON OUTPUT shows: `vgpu_json::doc_of`).
#[test]
fn every_json_output_is_documented() {
    let undocumented: Vec<String> = json_commands().into_iter().filter(|c| vgpu_json::doc_of(c).is_none()).collect();
    assert!(undocumented.is_empty(), "docs/json-schema.md has no section for: {undocumented:?}");
}
