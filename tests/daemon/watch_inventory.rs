//! The GPU list `vgpu watch` publishes (`<state>/gpus.json`, `vgpu_store::state::inventory`)
//! for `vgpu run` and the other commands that admit: taken while its watch runs and marks
//! it, the driver read instead once the watch is gone; withdrawn when the watch stops.

use crate::common::watch::Watch;
use crate::common::Sim;

fn sim() -> Sim {
    let sim = Sim::new(&[("NVIDIA H100 80GB HBM3", "80GiB"), ("NVIDIA A100-SXM4-40GB", "40GiB")]);
    // No metrics endpoint: two watches of the tests at once would want the same port.
    sim.write_vgpu_config("[watch]\ninterval = \"100ms\"\nlisten = \"\"\n");
    sim
}

/// Each GPU's (index, UUID, name, memory) in a JSON list (`vgpu devices --json`'s, or the
/// published one).
fn identities(json: &serde_json::Value) -> Vec<(u64, String, String, u64)> {
    let text = |g: &serde_json::Value, key: &str| g[key].as_str().unwrap_or_default().to_string();
    json["gpus"].as_array().expect("gpus").iter().map(|g| (g["index"].as_u64().unwrap_or(99), text(g, "uuid"), text(g, "name"), g["memory_total_bytes"].as_u64().unwrap_or(0))).collect()
}

/// `vgpu run -- true` with debug lines: its stderr, after it succeeded.
fn run_true(sim: &Sim) -> String {
    debug_stderr(sim, &["run", "--mem", "1G", "--", "true"])
}

/// `vgpu ARGS…` (root's) with debug lines: its stderr, after it succeeded.
fn debug_stderr(sim: &Sim, args: &[&str]) -> String {
    let out = sim.vgpu(args).env("VGPU_LOG", "vgpu=debug").output().expect("vgpu");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "vgpu {args:?}: {:?}\n{stderr}", out.status);
    stderr
}

#[test]
fn vgpu_run_takes_the_watchs_gpu_list_while_the_watch_runs_and_reads_the_driver_otherwise() {
    let sim = sim();
    let published = sim.path("run").join("gpus.json");
    // No watch: the driver is read.
    let said = run_true(&sim);
    assert!(said.contains("GPUs read through NVML: the published list is not taken: none published"), "{said}");

    let watch = Watch::start(&sim, &[]);
    // Its first round published the GPUs as the driver lists them.
    let text = std::fs::read_to_string(&published).expect("the watch's first round publishes the list");
    let list: serde_json::Value = serde_json::from_str(&text).expect("json");
    let devices = sim.vgpu(&["devices", "--json"]).output().expect("vgpu devices");
    let devices: serde_json::Value = serde_json::from_slice(&devices.stdout).expect("devices json");
    let (expected, got) = (identities(&devices), identities(&list));
    assert_eq!(got.len(), 2, "{text}");
    assert_eq!(got, expected, "{text}");
    assert_eq!(list["writer"]["pid"].as_u64(), Some(u64::from(watch.pid())), "{text}");
    assert_eq!(list["simulated"], true, "{text}");
    // Root's, and only root may write it.
    let meta = std::fs::metadata(&published).expect("metadata");
    assert_eq!((std::os::unix::fs::MetadataExt::uid(&meta), std::os::unix::fs::MetadataExt::mode(&meta) & 0o7777), (0, 0o644));

    // Taken while the watch runs.
    let said = run_true(&sim);
    assert!(said.contains("2 GPU(s) as vgpu watch published them"), "{said}");

    // Killed, it leaves the file, which is no longer taken: its writer is gone.
    let pid = watch.pid();
    watch.signal(libc::SIGKILL);
    let mut watch = watch;
    watch.wait_exit();
    assert!(published.exists(), "a killed watch cannot withdraw it");
    let said = run_true(&sim);
    assert!(said.contains(&format!("GPUs read through NVML: the published list is not taken: its watch (pid {pid}) no longer runs")), "{said}");

    // A watch that stops withdraws it.
    let watch = Watch::start(&sim, &[]);
    assert!(run_true(&sim).contains("as vgpu watch published them"));
    assert!(watch.stop().success());
    assert!(!published.exists(), "withdrawn when the watch stopped");
}

#[test]
fn a_list_that_cannot_be_published_is_one_warning_and_is_published_once_it_can() {
    let sim = sim();
    let published = sim.path("run").join("gpus.json");
    // A directory (not empty) where the list goes: the rename onto it fails, every round.
    std::fs::create_dir_all(published.join("in-the-way")).expect("a directory in its place");
    let mut watch = Watch::start(&sim, &[]);
    watch.wait_rounds(3);
    let warnings = watch.drain().iter().filter(|l| l.contains("warning: cannot publish the GPU list")).count();
    assert_eq!(warnings, 1, "one warning, not one a round: {:#?}", watch.log);
    // Meanwhile vgpu run reads the driver itself (the directory is no list).
    let said = run_true(&sim);
    assert!(said.contains("GPUs read through NVML: the published list is not taken"), "{said}");
    std::fs::remove_dir_all(&published).expect("out of the way");
    watch.wait_line("the list published again", |l| l.contains("the GPU list is published again"));
    assert!(published.is_file());
    assert!(run_true(&sim).contains("as vgpu watch published them"));
}

#[test]
fn vgpu_run_and_ps_leave_what_killed_commands_left_to_a_running_watch_and_sweep_it_without_one() {
    let sim = sim();
    let leftover = sim.path("run").join("workloads").join(".tmp-left-by-a-killed-write");
    let left_to_watch = "(stray cgroups, temporary files, orphan vGPUs) is left to vgpu watch";
    run_true(&sim);
    // No watch: the reconcile of an admission, and of root's listing, removes it.
    for args in [&["run", "--mem", "1G", "--", "true"][..], &["ps"][..]] {
        std::fs::write(&leftover, "{").expect("a temporary file");
        let said = debug_stderr(&sim, args);
        assert!(!leftover.exists(), "{args:?}: {said}");
        assert!(!said.contains(left_to_watch), "{said}");
    }

    // A watch runs: both leave it, and a round of the watch removes it.
    let mut watch = Watch::start(&sim, &[]);
    std::fs::write(&leftover, "{").expect("a temporary file");
    let said = run_true(&sim);
    assert!(said.contains("2 GPU(s) as vgpu watch published them"), "{said}");
    assert!(said.contains(left_to_watch), "{said}");
    let said = debug_stderr(&sim, &["ps"]);
    assert!(said.contains(left_to_watch), "{said}");
    let removed = format!("removed {}: left by a write that was killed", leftover.display());
    watch.wait_line("the watch to remove the temporary file", |l| l.contains(&removed));
    assert!(!leftover.exists());
}
