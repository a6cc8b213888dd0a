//! Tenants against each other and against their own limits (issue #10, items 2 and 5): the
//! state store's owners and modes, whatever the umask. Runs as root; the attacker is
//! `nobody` (uid 65534) through `setpriv`.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::{wait_for, Sim};

const GPU16: &[(&str, &str)] = &[("NVIDIA A16-sim", "16GiB")];
const GIB: u64 = 1 << 30;

/// Run `argv` as nobody (uid/gid 65534, no groups).
fn as_nobody(argv: &[&str]) -> Output {
    Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .args(argv)
        .output()
        .expect("setpriv")
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

/// The only vGPU directory of the simulation.
fn the_vgpu(sim: &Sim) -> PathBuf {
    let vgpus: Vec<PathBuf> = std::fs::read_dir(sim.path("run/vgpus")).unwrap().flatten().map(|e| e.path()).collect();
    assert_eq!(vgpus.len(), 1, "{vgpus:?}");
    vgpus[0].clone()
}

fn running(sim: &Sim) -> bool {
    let out = sim.vgpu(&["ps", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["workloads"].as_array().is_some_and(|a| a.iter().any(|w| w["state"] == "running" && w["pids"].as_array().is_some_and(|p| !p.is_empty())))
}

#[test]
fn another_user_can_write_nothing_of_a_vgpu() {
    let sim = Sim::new(GPU16);
    let mut child = sim.spawn(&["run", "--mem", "4G", "--name", "victim", "--", "sleep", "120"]);
    wait_for("the workload to run", || running(&sim));
    std::fs::set_permissions(sim.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let vgpu = the_vgpu(&sim);
    let usage = vgpu.join("usage");
    let limits = vgpu.join("limits");
    let before = (std::fs::read(&usage).unwrap(), std::fs::read(&limits).unwrap());

    // Each of these worked on the old layout (usage 0666, procs/ 0777).
    for (what, argv) in [
        ("overwrite the usage file", vec!["sh", "-c", "printf XXXXXXXX | dd of=\"$0\" conv=notrunc 2>/dev/null", usage.to_str().unwrap()]),
        ("truncate the usage file", vec!["truncate", "-s", "0", usage.to_str().unwrap()]),
        ("overwrite the limits", vec!["sh", "-c", "printf XXXXXXXX | dd of=\"$0\" conv=notrunc 2>/dev/null", limits.to_str().unwrap()]),
        ("plant a FIFO in procs/", vec!["mkfifo", vgpu.join("procs/999999-1").to_str().unwrap()]),
        ("create a file in the vGPU", vec!["touch", vgpu.join("usage.new").to_str().unwrap()]),
        ("replace the usage file", vec!["mv", "-f", "/dev/null", usage.to_str().unwrap()]),
    ] {
        let out = as_nobody(&argv);
        assert!(!out.status.success(), "nobody could {what}");
    }
    assert_eq!((std::fs::read(&usage).unwrap(), std::fs::read(&limits).unwrap()), before, "nothing changed");
    assert_eq!((mode(&vgpu), mode(&limits), mode(&usage), mode(&vgpu.join("procs"))), (0o755, 0o644, 0o600, 0o700));
    let w = &sim.json(&["ps", "--json"])["workloads"].clone()[0];
    assert_eq!(w["gpus"][0]["memory_quota_bytes"].as_u64(), Some(4 * GIB), "{w}");

    sim.vgpu(&["kill", "victim"]).assert().success();
    let _ = child.wait();
}

/// A workload running as nobody rewrites the quota in everything it can write, then asks
/// for three times its quota: the shim reads the quota from root's limits file.
#[test]
fn a_workload_cannot_raise_its_own_quota() {
    let sim = Sim::new(GPU16);
    std::fs::set_permissions(sim.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // The simulated driver's own state is the test's, shared by every simulated process.
    std::fs::set_permissions(sim.path("fakegpu-state"), std::fs::Permissions::from_mode(0o777)).unwrap();
    let alloc = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join("examples/alloc.py");
    // quota_bytes is the 8 bytes after the 64-byte UUID of the first device record.
    let forge = "import os, sys\n\
        for name in ('usage', 'limits'):\n\
        \x20   try:\n\
        \x20       fd = os.open(os.path.join(os.environ['VGPU_DIR'], name), os.O_WRONLY)\n\
        \x20       os.pwrite(fd, (8 << 30).to_bytes(8, sys.byteorder), 64 + 64)\n\
        \x20       print('rewrote', name)\n\
        \x20   except OSError as e:\n\
        \x20       print('cannot write', name, e.strerror)\n";
    let script = format!("python3 -c \"{forge}\" && exec python3 {} 3", alloc.display());
    let out = sim.vgpu(&["run", "--user", "nobody", "--mem", "1G", "--", "sh", "-c", &script]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains("rewrote usage"), "the workload owns its counters: {stdout}{stderr}");
    assert!(stdout.contains("cannot write limits"), "{stdout}{stderr}");
    assert!(stdout.contains("allocation 2 of 1 GiB: out of memory"), "the quota held at 1 GiB: {stdout}{stderr}");
}

/// Under umask 000 (cron), everything is made with its own mode; a state directory others
/// can write is refused in one line; a forged record cannot aim root's clean-up elsewhere.
#[test]
fn umask_000_changes_no_mode_and_unsafe_directories_are_refused() {
    let sim = Sim::new(GPU16);
    std::fs::remove_dir(sim.path("run")).unwrap();
    std::fs::remove_dir(sim.path("lib")).unwrap();
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "umask 000 && exec \"$0\" \"$@\"", env!("CARGO_BIN_EXE_vgpu"), "--simulate", "run", "--mem", "1G", "--", "sh", "-c", "umask 000; test -d \"$VGPU_DIR\""]);
    for (k, v) in sim.env() {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for dir in ["run", "run/workloads", "run/vgpus", "lib"] {
        assert_eq!(mode(&sim.path(dir)), 0o755, "{dir}");
    }
    // A partition's vGPU keeps its files: look at them.
    sim.vgpu(&["partition", "create", "svc", "--gpu", "0", "--mem", "1G"]).assert().success();
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "umask 000 && exec \"$0\" \"$@\"", env!("CARGO_BIN_EXE_vgpu"), "--simulate", "run", "--partition", "svc", "--", "true"]);
    for (k, v) in sim.env() {
        cmd.env(k, v);
    }
    assert!(cmd.output().unwrap().status.success());
    let p = sim.path("run/vgpus/p-svc");
    assert_eq!((mode(&p), mode(&p.join("procs")), mode(&p.join("limits")), mode(&p.join("usage"))), (0o755, 0o700, 0o644, 0o600));

    // A forged record pointing its vGPU outside the store: reported as damaged, nothing removed.
    let outside = sim.path("precious");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("data"), "keep").unwrap();
    let forged = serde_json::json!({
        "format": 1, "id": "deadbeef", "name": "x", "command": ["x"],
        "user": {"name": "root", "uid": 0, "gid": 0, "groups": [0], "home": "/root"},
        "gpus": [], "vgpu": "../../precious", "partition": null, "priority": 50,
        "pool_blocks": null, "cgroup": "deadbeef", "supervisor": {"pid": 999999, "start_time": 1},
        "pid": null, "state": "running", "suspended_reason": null, "created_unix_ms": 0
    });
    std::fs::write(sim.path("run/workloads/deadbeef.json"), forged.to_string()).unwrap();
    let out = sim.vgpu(&["ps"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a plain name"), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(outside.join("data")).unwrap(), "keep");
    std::fs::remove_file(sim.path("run/workloads/deadbeef.json")).unwrap();

    // A procs/ that is a link (planted before the partition's first use) is refused, not chmodded.
    sim.vgpu(&["partition", "create", "web", "--gpu", "0", "--mem", "1G"]).assert().success();
    let web = sim.path("run/vgpus/p-web");
    std::fs::create_dir(&web).unwrap();
    std::os::unix::fs::symlink(&outside, web.join("procs")).unwrap();
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o700)).unwrap();
    let out = sim.vgpu(&["run", "--partition", "web", "--", "true"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("symbolic link, not a directory"), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(mode(&outside), 0o700, "the link's target was not chmodded");

    // The state directory made writable by others: every command refuses it, in one line.
    std::fs::set_permissions(sim.path("run"), std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = sim.vgpu(&["ps"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("writable by others (mode 0777)") && stderr.contains("chmod go-w"), "{stderr}");
    // … and `vgpu doctor` says so, with the fix.
    let out = sim.vgpu(&["doctor", "--json"]).output().unwrap();
    let checks: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let check = checks.as_array().into_iter().flatten().chain(checks["checks"].as_array().into_iter().flatten()).find(|c| c["name"] == "state directory").cloned();
    let check = check.unwrap_or_else(|| panic!("no state directory check: {checks}"));
    assert_eq!(check["status"], "fail", "{check}");
    assert!(check["detail"].as_str().unwrap().contains("writable by others"), "{check}");
}

/// A partition names who may use it: its user, or its group's members (and root).
#[test]
fn partitions_are_for_their_user_or_group() {
    let sim = Sim::new(GPU16);
    std::fs::set_permissions(sim.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    sim.vgpu(&["partition", "create", "mine", "--gpu", "0", "--mem", "1G", "--user", "nobody"]).assert().success();
    sim.vgpu(&["partition", "create", "roots", "--gpu", "0", "--mem", "1G"]).assert().success();
    let out = sim.vgpu(&["run", "--user", "nobody", "--partition", "roots", "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is for root only"), "{}", String::from_utf8_lossy(&out.stderr));
    sim.vgpu(&["run", "--user", "nobody", "--partition", "mine", "--", "true"]).assert().success();
    let procs = sim.path("run/vgpus/p-mine/procs");
    assert_eq!(std::fs::metadata(&procs).unwrap().uid(), 65534);
    assert_eq!(std::fs::metadata(sim.path("run/vgpus/p-mine/usage")).unwrap().uid(), 65534);
    assert_eq!(std::fs::metadata(sim.path("run/vgpus/p-mine/limits")).unwrap().uid(), 0);
    let out = sim.vgpu(&["partition", "create", "x", "--gpu", "0", "--mem", "1G", "--group", "no-such-group-here"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}
