//! `vgpu service create|list|show|scale|update|remove`, with the real binary and the
//! simulated driver: definitions are validated as `vgpu run` validates its options (nothing
//! written when refused), stored in `<lib>/services/NAME.toml`, and shown with what the
//! runner records in `NAME.state.json`.

use crate::common::{files_below, Sim};
use serde_json::Value;

const GPU16: &[(&str, &str)] = &[("NVIDIA A16-sim", "16GiB")];

/// `vgpu --simulate ARGS…` as root itself (no sudo variables from the test's environment).
fn as_root(sim: &Sim, args: &[&str]) -> assert_cmd::Command {
    let mut cmd = sim.vgpu(args);
    cmd.env_remove("SUDO_UID")
        .env_remove("SUDO_GID")
        .env_remove("SUDO_USER")
        .env_remove("SUDO_COMMAND");
    cmd
}

/// As if `sudo vgpu …` had been run by `nobody`.
fn as_sudo_nobody(sim: &Sim, args: &[&str]) -> assert_cmd::Command {
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    let mut cmd = sim.vgpu(args);
    cmd.env("SUDO_UID", nobody.uid.to_string())
        .env("SUDO_GID", nobody.gid.to_string())
        .env("SUDO_USER", "nobody");
    cmd
}

fn json(sim: &Sim, args: &[&str]) -> Value {
    let out = as_root(sim, args).output().unwrap();
    assert!(
        out.status.success(),
        "vgpu {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(doc["schema"], 1, "{doc}");
    doc
}

/// Exit 2, one line on stderr naming `needle`, and no file made or changed anywhere.
fn assert_refused(sim: &Sim, mut cmd: assert_cmd::Command, needle: &str) {
    let before: Vec<(std::path::PathBuf, Vec<u8>)> = files_below(sim.dir.path())
        .into_iter()
        .map(|p| (p.clone(), std::fs::read(&p).unwrap_or_default()))
        .collect();
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "not one line: {stderr}"
    );
    assert!(stderr.contains(needle), "{needle:?} not named: {stderr}");
    let after: Vec<(std::path::PathBuf, Vec<u8>)> = files_below(sim.dir.path())
        .into_iter()
        .map(|p| (p.clone(), std::fs::read(&p).unwrap_or_default()))
        .collect();
    assert!(before == after, "a refused command changed files");
}

#[test]
fn create_list_show_scale_update_remove_round_trip() {
    let sim = Sim::new(GPU16);
    let created = json(
        &sim,
        &[
            "service",
            "create",
            "web",
            "--replicas",
            "1-4",
            "--mem",
            "2G",
            "--cpus",
            "1",
            "--scale-on",
            "cpu=70%",
            "--window",
            "30s",
            "--env",
            "PORT=80{replica}",
            "--json",
            "--",
            "sleep",
            "30{replica}",
        ],
    );
    assert_eq!(created["name"], "web");
    assert_eq!(
        (
            created["min_replicas"].as_u64(),
            created["max_replicas"].as_u64(),
            created["desired_replicas"].as_u64()
        ),
        (Some(1), Some(4), Some(1))
    );
    assert_eq!(
        created["scale_on"],
        serde_json::json!([{"signal": "cpu", "target_pct": 70.0}])
    );
    assert_eq!(
        (
            created["window_ms"].as_u64(),
            created["cooldown_ms"].as_u64(),
            created["grace_ms"].as_u64()
        ),
        (Some(30_000), Some(120_000), Some(10_000))
    );
    assert_eq!(created["options"]["mem"], "2G");
    assert_eq!(
        created["options"]["env"],
        serde_json::json!(["PORT=80{replica}"])
    );
    assert_eq!(
        created["command"],
        serde_json::json!(["sleep", "30{replica}"])
    );

    // Where it lives, with explicit modes.
    let file = sim.path("lib/services/web.toml");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(&file).unwrap().mode() & 0o7777, 0o644);
    assert_eq!(
        std::fs::metadata(sim.path("lib/services")).unwrap().mode() & 0o7777,
        0o755
    );
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.contains("replicas = \"1-4\"") && text.contains("mem = \"2G\""),
        "{text}"
    );

    // A second one is listed beside it; the same name twice is refused.
    as_root(
        &sim,
        &[
            "service",
            "create",
            "batch",
            "--replicas",
            "2",
            "--compute",
            "20",
            "--",
            "true",
        ],
    )
    .assert()
    .success();
    assert_refused(
        &sim,
        as_root(
            &sim,
            &["service", "create", "web", "--replicas", "1", "--", "true"],
        ),
        "already exists",
    );
    let listed = json(&sim, &["service", "list", "--json"]);
    let names: Vec<&str> = listed["services"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["batch", "web"]);
    assert_eq!(listed["damaged"], serde_json::json!([]));
    let table = as_root(&sim, &["service", "list"]).output().unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("web") && table.contains("1-4") && table.contains("cpu=70%"),
        "{table}"
    );

    // scale: within MIN..MAX only (exit 2, nothing changed otherwise).
    let scaled = json(&sim, &["service", "scale", "web", "3", "--json"]);
    assert_eq!(scaled["desired_replicas"], 3);
    assert_refused(
        &sim,
        as_root(&sim, &["service", "scale", "web", "5"]),
        "outside its range 1-4",
    );
    assert_refused(
        &sim,
        as_root(&sim, &["service", "scale", "nosuch", "1"]),
        "no service \"nosuch\"",
    );

    // update: same validation; the desired count follows a narrower range.
    assert_refused(
        &sim,
        as_root(&sim, &["service", "update", "web", "--mem", "lots"]),
        "--mem",
    );
    let updated = json(
        &sim,
        &[
            "service",
            "update",
            "web",
            "--replicas",
            "1-2",
            "--memory",
            "64M",
            "--scale-on",
            "mem=80%",
            "--json",
        ],
    );
    assert_eq!(updated["desired_replicas"], 2);
    assert_eq!(updated["options"]["memory"], "64M");
    assert_eq!(
        updated["options"]["mem"], "2G",
        "options not given are kept"
    );
    assert_eq!(
        updated["scale_on"],
        serde_json::json!([{"signal": "mem", "target_pct": 80.0}])
    );

    // show: the definition and what the runner recorded (written here as the runner would).
    let state = serde_json::json!({
        "desired": 2,
        "short": "replica 1 not admitted: GPU 0 has 0 B free",
        "decisions": [{"at_unix_ms": 1_700_000_000_000u64, "current": 1, "recommended": 2, "desired": 2,
            "values": [{"signal": "mem", "value": 0.95, "target": 0.8, "replicas": 1, "recommended": 2}], "reason": "mem 0.95 vs target 0.80: wants 2: 1 → 2"}],
        "replicas": [{"index": 0, "workload_id": "0123456789ab", "restarts": 1, "last_exit": 137, "next_start_unix_ms": null}],
        "stopping": false
    });
    std::fs::write(sim.path("lib/services/web.state.json"), state.to_string()).unwrap();
    let shown = json(&sim, &["service", "show", "web", "--json"]);
    assert_eq!(shown["short"], "replica 1 not admitted: GPU 0 has 0 B free");
    assert_eq!(shown["running_replicas"], 1);
    assert_eq!(shown["replicas"][0]["name"], "web-0");
    assert_eq!(shown["replicas"][0]["last_exit"], 137);
    let d = &shown["decisions"][0];
    assert_eq!(
        (
            d["current_replicas"].as_u64(),
            d["desired_replicas"].as_u64()
        ),
        (Some(1), Some(2))
    );
    assert_eq!(d["values"][0]["signal"], "mem");
    assert_eq!(d["values"][0]["value_pct"], 95.0);
    assert!(d["reason"].as_str().unwrap().contains("1 → 2"));
    let text = as_root(&sim, &["service", "show", "web"]).output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("short: replica 1 not admitted")
            && text.contains("mem 95%")
            && text.contains("--env=PORT=80{replica}"),
        "{text}"
    );

    // remove: refused while the state lists a replica whose workload record exists.
    std::fs::create_dir_all(sim.path("run/workloads")).unwrap();
    std::fs::write(sim.path("run/workloads/0123456789ab.json"), "{}").unwrap();
    assert_refused(
        &sim,
        as_root(&sim, &["service", "remove", "web"]),
        "running replica",
    );
    let removed = json(&sim, &["service", "remove", "web", "--force", "--json"]);
    assert_eq!(removed["stopping_replicas"], 1);
    assert!(!file.exists());
    let left: Value = serde_json::from_str(
        &std::fs::read_to_string(sim.path("lib/services/web.state.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        (left["stopping"].as_bool(), left["desired"].as_u64()),
        (Some(true), Some(0)),
        "the runner is told to stop them"
    );
    let removed = json(&sim, &["service", "remove", "batch", "--json"]);
    assert_eq!(removed["stopping_replicas"], 0);
    assert!(
        !sim.path("lib/services/batch.toml").exists()
            && !sim.path("lib/services/batch.state.json").exists()
    );
    assert_eq!(
        json(&sim, &["service", "list", "--json"])["services"],
        serde_json::json!([])
    );
}

#[test]
fn bad_values_are_refused_naming_the_option_with_nothing_written() {
    let sim = Sim::new(GPU16);
    for (args, needle) in [
        (vec!["--replicas", "4-1"], "--replicas"),
        (vec!["--replicas", "0-65"], "--replicas"),
        (vec!["--replicas", "1-2", "--mem", "4X"], "--mem"),
        (vec!["--replicas", "1-2", "--compute", "300"], "--compute"),
        (vec!["--replicas", "1-2", "--memory", "1M"], "--memory"),
        (vec!["--replicas", "1-2", "--cpus", "-1"], "--cpus"),
        (vec!["--replicas", "1-2", "--priority", "101"], "priority"),
        (vec!["--replicas", "1-2", "--turn", "500us"], "--turn"),
        (vec!["--replicas", "1-2", "--partition", "p", "--turn", "2ms"], "--partition"),
        (
            vec!["--replicas", "1-2", "--env", "VGPU_DIR=/x"],
            "--env VGPU_DIR",
        ),
        (
            vec!["--replicas", "1-2", "--scale-on", "disk=50%"],
            "--scale-on",
        ),
        (
            vec!["--replicas", "1-2", "--scale-on", "cpu=0%"],
            "--scale-on",
        ),
        (
            vec!["--replicas", "1-2", "--cooldown", "soon"],
            "--cooldown",
        ),
        (vec!["--replicas", "1-2", "--kind", "npu"], "--tflops"),
        (
            vec!["--replicas", "1-2", "--partition", "p", "--mem", "1G"],
            "--partition",
        ),
    ] {
        let mut full = vec!["service", "create", "web"];
        full.extend(args.iter());
        full.extend(["--", "true"]);
        assert_refused(&sim, as_root(&sim, &full), needle);
    }
    assert_refused(
        &sim,
        as_root(
            &sim,
            &["service", "create", "Web!", "--replicas", "1", "--", "true"],
        ),
        "invalid service name",
    );
    assert_refused(
        &sim,
        as_root(
            &sim,
            &[
                "service",
                "create",
                "web",
                "--replicas",
                "1",
                "--",
                "no-such-program-here",
            ],
        ),
        "not found",
    );
    assert!(!sim.path("lib/services").exists());
}

/// `--turn` for a service's replicas, as `vgpu run` takes it: kept in the definition (its
/// file and its JSON), passed to every replica's `vgpu run`, changed by `service update`.
#[test]
fn the_turn_bound_is_a_replica_option() {
    let sim = Sim::new(GPU16);
    let created = json(
        &sim,
        &["service", "create", "batch", "--replicas", "1", "--compute", "80", "--turn", "2ms", "--json", "--", "sleep", "30"],
    );
    assert_eq!(created["options"]["turn"], "2ms", "{created}");
    let text = std::fs::read_to_string(sim.path("lib/services/batch.toml")).unwrap();
    assert!(text.contains("turn = \"2ms\""), "{text}");
    let def = vgpu_daemon::service::Services::new(&sim.path("lib")).load("batch").unwrap();
    assert!(def.run_args(0).contains(&"--turn=2ms".to_string()), "{:?}", def.run_args(0));
    let updated = json(&sim, &["service", "update", "batch", "--turn", "4500us", "--json"]);
    assert_eq!(updated["options"]["turn"], "4500us", "{updated}");
    let updated = json(&sim, &["service", "update", "batch", "--turn", "3ms", "--json"]);
    assert_eq!(updated["options"]["turn"], "3ms", "{updated}");
    assert_refused(&sim, as_root(&sim, &["service", "update", "batch", "--turn", "16ms"]), "--turn");
}

/// `{replica}` in the command and in `--env` values: what a replica is started with is the
/// definition's `run_args(index)`, and `show` keeps the placeholder.
#[test]
fn replica_placeholder_is_kept_in_the_definition_and_substituted_per_replica() {
    let sim = Sim::new(GPU16);
    as_root(
        &sim,
        &[
            "service",
            "create",
            "web",
            "--replicas",
            "0-3",
            "--env",
            "LOG=/tmp/web-{replica}.log",
            "--",
            "sleep",
            "6{replica}",
        ],
    )
    .assert()
    .success();
    let libdir = sim.path("lib");
    let services = vgpu_daemon::service::Services::new(&libdir);
    let def = services.load("web").unwrap();
    assert_eq!(def.command, ["sleep", "6{replica}"]);
    let args = def.run_args(2);
    assert_eq!(args[..4], ["--service", "web", "--replica", "2"]);
    assert!(
        args.contains(&"--env=LOG=/tmp/web-2.log".to_string())
            && args.contains(&"--name=web-2".to_string()),
        "{args:?}"
    );
    assert_eq!(args[args.len() - 3..], ["--", "sleep", "62"]);
}

#[test]
fn a_sudo_caller_cannot_define_what_run_would_refuse_them() {
    let sim = Sim::new(GPU16);
    std::fs::set_permissions(
        sim.dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    // [policy]'s default grants a sudo user priorities up to 50.
    assert_refused(
        &sim,
        as_sudo_nobody(
            &sim,
            &[
                "service",
                "create",
                "web",
                "--replicas",
                "1",
                "--priority",
                "100",
                "--",
                "true",
            ],
        ),
        "--priority 100 is above 50",
    );
    assert_refused(
        &sim,
        as_sudo_nobody(
            &sim,
            &[
                "service",
                "create",
                "web",
                "--replicas",
                "1",
                "--user",
                "root",
                "--",
                "true",
            ],
        ),
        "--user",
    );
    assert_refused(
        &sim,
        as_sudo_nobody(
            &sim,
            &[
                "service",
                "create",
                "web",
                "--replicas",
                "1",
                "--oversubscribe",
                "--",
                "true",
            ],
        ),
        "--oversubscribe",
    );
    // Within the policy: created, with the caller and the priority run gave them recorded,
    // since the runner starts the replicas as root.
    let out = as_sudo_nobody(
        &sim,
        &[
            "service",
            "create",
            "web",
            "--replicas",
            "1",
            "--json",
            "--",
            "true",
        ],
    )
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let created: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (
            created["options"]["user"].as_str(),
            created["options"]["priority"].as_str()
        ),
        (Some("nobody"), Some("50"))
    );
    // Root's service is not theirs to change.
    as_root(
        &sim,
        &[
            "service",
            "create",
            "admin",
            "--replicas",
            "1",
            "--",
            "true",
        ],
    )
    .assert()
    .success();
    assert_refused(
        &sim,
        as_sudo_nobody(&sim, &["service", "scale", "admin", "1"]),
        "only your own services",
    );
}

#[test]
fn a_sudo_caller_cannot_bring_their_own_config_or_directories() {
    let sim = Sim::new(GPU16);
    // A config of the caller's own that lets them run as anyone: root's `service create`
    // would record a service that root's runner then starts as root.
    let evil = sim.dir.path().join("mine.toml");
    std::fs::write(
        &evil,
        "[policy]\nrun_as_others = [\"nobody\"]\nmax_priority = 100\n",
    )
    .unwrap();
    let evil = evil.to_str().unwrap();
    let lib = sim.dir.path().join("mylib");
    let lib = lib.to_str().unwrap();
    for (args, option) in [
        (
            vec![
                "--config",
                evil,
                "service",
                "create",
                "pwn",
                "--replicas",
                "1",
                "--user",
                "root",
                "--",
                "true",
            ],
            "--config",
        ),
        // A global option after the subcommand is the same option.
        (
            vec![
                "service",
                "create",
                "pwn",
                "--config",
                evil,
                "--replicas",
                "1",
                "--user",
                "root",
                "--",
                "true",
            ],
            "--config",
        ),
        (
            vec!["--config", evil, "run", "--user", "root", "true"],
            "--config",
        ),
        (
            vec![
                "--lib-dir",
                lib,
                "service",
                "create",
                "pwn",
                "--replicas",
                "1",
                "--",
                "true",
            ],
            "--lib-dir",
        ),
        (vec!["--state-dir", lib, "service", "list"], "--state-dir"),
    ] {
        assert_refused(&sim, as_sudo_nobody(&sim, &args), option);
    }
    // Root may name them.
    as_root(
        &sim,
        &[
            "--config",
            evil,
            "service",
            "create",
            "web",
            "--replicas",
            "1",
            "--user",
            "nobody",
            "--",
            "true",
        ],
    )
    .assert()
    .success();
}

#[test]
fn a_replica_name_is_kept_for_the_replica() {
    let sim = Sim::new(GPU16);
    std::fs::set_permissions(
        sim.dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    as_root(
        &sim,
        &[
            "service",
            "create",
            "web",
            "--replicas",
            "1-3",
            "--",
            "true",
        ],
    )
    .assert()
    .success();
    // Another user's workload named web-2 would keep replica 2 out while it runs.
    for name in ["web-0", "web-2", "web-63"] {
        assert_refused(
            &sim,
            as_sudo_nobody(&sim, &["run", "--name", name, "true"]),
            "kept for a replica of service web",
        );
    }
    assert_refused(
        &sim,
        as_root(&sim, &["run", "--name", "web-1", "true"]),
        "kept for a replica of service web",
    );
    // Names that are no replica's run.
    for name in ["web-01", "web-64", "web-x", "webs-0"] {
        as_root(&sim, &["run", "--name", name, "true"])
            .assert()
            .success();
    }
}

#[test]
fn service_run_is_not_for_sudo() {
    let sim = Sim::new(GPU16);
    as_root(
        &sim,
        &["service", "create", "web", "--replicas", "1", "--", "true"],
    )
    .assert()
    .success();
    // The old code ran in the foreground: the timeout only ends such a run.
    let mut cmd = as_sudo_nobody(&sim, &["service", "run", "web"]);
    cmd.timeout(std::time::Duration::from_secs(60));
    assert_refused(&sim, cmd, "not for sudo");
}

#[test]
fn the_runners_flags_of_run_are_refused_through_sudo() {
    let sim = Sim::new(GPU16);
    std::fs::set_permissions(
        sim.dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    as_root(
        &sim,
        &["service", "create", "web", "--replicas", "1", "--", "true"],
    )
    .assert()
    .success();
    // Claiming to be replica 0 of root's service (the runner would adopt and signal it).
    assert_refused(
        &sim,
        as_sudo_nobody(&sim, &["run", "--service", "web", "--replica", "0", "true"]),
        "--service is for vgpu's service runners",
    );
    // A descriptor number of root's own process to write to.
    assert_refused(
        &sim,
        as_sudo_nobody(
            &sim,
            &[
                "run",
                "--service",
                "web",
                "--replica",
                "0",
                "--report-fd",
                "5",
                "true",
            ],
        ),
        "--report-fd is for vgpu's service runners",
    );
}

#[test]
fn a_state_file_workload_id_never_becomes_a_path() {
    let sim = Sim::new(GPU16);
    as_root(
        &sim,
        &["service", "create", "web", "--replicas", "1", "--", "true"],
    )
    .assert()
    .success();
    // A damaged state whose replica names `../../forged`: `<state>/workloads/../../forged.json`
    // is a file, but no workload's record.
    std::fs::create_dir_all(sim.path("run/workloads")).unwrap();
    std::fs::write(sim.path("forged.json"), "{}").unwrap();
    let state = serde_json::json!({
        "desired": 1,
        "replicas": [{"index": 0, "workload_id": "../../forged"}],
    });
    std::fs::write(sim.path("lib/services/web.state.json"), state.to_string()).unwrap();
    assert_eq!(
        json(&sim, &["service", "show", "web", "--json"])["running_replicas"],
        0
    );
    let out = as_root(&sim, &["service", "remove", "web"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!sim.path("lib/services/web.toml").exists());
}

#[test]
fn a_hand_edited_file_is_reported_naming_the_key_and_the_file() {
    let sim = Sim::new(GPU16);
    as_root(
        &sim,
        &["service", "create", "web", "--replicas", "1", "--", "true"],
    )
    .assert()
    .success();
    let file = sim.path("lib/services/web.toml");
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, format!("{text}memroy = \"4G\"\n")).unwrap();
    let out = as_root(&sim, &["service", "show", "web"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("memroy") && stderr.contains("web.toml"),
        "{stderr}"
    );
    // A listing reports it and goes on.
    as_root(
        &sim,
        &["service", "create", "api", "--replicas", "1", "--", "true"],
    )
    .assert()
    .success();
    let listed = json(&sim, &["service", "list", "--json"]);
    assert_eq!(listed["services"].as_array().unwrap().len(), 1);
    let damaged = listed["damaged"][0]["error"].as_str().unwrap();
    assert!(
        damaged.contains("memroy") && damaged.contains("web.toml"),
        "{damaged}"
    );
    // A bad value, too.
    std::fs::write(
        &file,
        text.replace("replicas = \"1-1\"", "replicas = \"9-1\""),
    )
    .unwrap();
    let out = as_root(&sim, &["service", "show", "web"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("key `replicas`") && stderr.contains("web.toml"),
        "{stderr}"
    );
}

/// `vgpu service show <TAB>` offers the defined services (fish's protocol: one candidate a
/// line, a tab before its description).
#[test]
fn service_names_complete() {
    let sim = Sim::new(GPU16);
    as_root(
        &sim,
        &[
            "service",
            "create",
            "web",
            "--replicas",
            "1-3",
            "--",
            "true",
        ],
    )
    .assert()
    .success();
    as_root(
        &sim,
        &["service", "create", "api", "--replicas", "2", "--", "true"],
    )
    .assert()
    .success();
    for sub in ["show", "scale", "update", "remove"] {
        let mut fish = assert_cmd::Command::cargo_bin("vgpu").unwrap();
        fish.env("COMPLETE", "fish")
            .args(["--", "vgpu", "service", sub, ""]);
        for (k, v) in sim.env() {
            fish.env(k, v);
        }
        let out = String::from_utf8(fish.output().unwrap().stdout).unwrap();
        let lines: Vec<&str> = out.lines().filter(|l| !l.starts_with('-')).collect();
        assert_eq!(
            lines,
            ["api\t2-2 replicas", "web\t1-3 replicas"],
            "vgpu service {sub} <TAB>: {out}"
        );
    }
}
