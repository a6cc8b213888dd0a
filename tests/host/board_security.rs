//! A GPU's board against its tenants (issue #10: "a tenant can never write another tenant's
//! files"): with two compute-limited `fair` workloads on one simulated GPU, one run as root
//! and one as nobody, each vGPU's shim publishes in its own slot file under the root-owned
//! `<state>/gpus/<uuid>/`; user nobody can neither open root's slot for writing, truncate
//! or remove it, nor add anything to the directory; nobody may wreck its own slot, which
//! hurts nobody else (the others read it with `pread`, never through a mapping); and the
//! slots go when the workloads do. And the board still does its work across users: a root
//! tenant and a nobody tenant oversubscribing the GPU are served in priority order. Runs as
//! root (real cgroups, `setpriv`).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use crate::common::{serial, wait_for, Sim};
use crate::common::workload::workload_bin;

const GPU: &[(&str, &str)] = &[("NVIDIA H100-sim", "80GiB")];
const NOBODY: u32 = 65534;

// The test that compares rates is serial (`serial()`, ahead of the others on the CPU); the one that checks
// the slots' owners and modes waits on states only and runs beside the others.

/// `vgpu --simulate run --name NAME VGPU_ARGS… -- gpu_workload sync SECONDS` in the
/// background, fair at 30 %, its output collected.
fn start(sim: &Sim, name: &str, vgpu_args: &[&str], seconds: &str) -> Child {
    let mut args = vec!["--compute", "30", "--compute-policy", "fair"];
    args.extend_from_slice(vgpu_args);
    start_with(sim, name, &args, &["sync", seconds, "--kernel-us", "1000"])
}

/// `vgpu --simulate run --name NAME --mem 10G VGPU_ARGS… -- gpu_workload SHAPE…` in the
/// background, its output collected.
fn start_with(sim: &Sim, name: &str, vgpu_args: &[&str], shape: &[&str]) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vgpu"));
    cmd.args(["--simulate", "run", "--name", name, "--mem", "10G"])
        .args(vgpu_args)
        .arg("--")
        .arg(workload_bin())
        .args(shape);
    cmd.env_remove("VGPU_SIMULATE").env_remove("LD_PRELOAD").env("VGPU_LOG", "vgpu=warn");
    for (k, v) in sim.env() {
        cmd.env(k, v);
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn vgpu run")
}

/// `ARGV…` as user nobody (uid/gid 65534, no groups).
fn as_nobody(argv: &[&str]) -> Output {
    Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups", "--"])
        .args(argv)
        .stdin(Stdio::null())
        .output()
        .expect("setpriv")
}

/// `ARGV…` as nobody must fail with EACCES.
fn denied(what: &str, argv: &[&str]) {
    let out = as_nobody(argv);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "nobody could {what}: {argv:?} succeeded");
    assert!(stderr.contains("Permission denied"), "nobody could not {what}, but not for EACCES: {stderr}");
}

/// The vGPU id (= workload id for a workload's own vGPU) of the running workload `name`.
fn vgpu_id(sim: &Sim, name: &str) -> Option<String> {
    let list = sim.json(&["ps", "--json"])["workloads"].clone();
    let w = list.as_array()?.iter().find(|w| w["name"] == name)?.clone();
    Some(w["id"].as_str()?.to_string())
}

/// The heartbeat a slot file shows (0 = never published), if it is a whole slot file.
fn heartbeat(slot: &Path) -> Option<u64> {
    use vgpu_abi::layout::{BoardHeader, BoardSlot, BOARD_MAGIC};
    let bytes = std::fs::read(slot).ok()?;
    let header = std::mem::size_of::<BoardHeader>();
    if bytes.len() != header + std::mem::size_of::<BoardSlot>() || bytes[..8] != BOARD_MAGIC {
        return None;
    }
    let at = header + std::mem::offset_of!(BoardSlot, heartbeat_ns);
    Some(u64::from_ne_bytes(bytes[at..at + 8].try_into().ok()?))
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{} is not a readable directory: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A simulation whose files user nobody can reach: the test's directory is 0700; the
/// simulated driver's state is shared by every process that uses the GPU. With its GPU's UUID.
fn sim_for_nobody() -> (Sim, String) {
    let sim = Sim::new(GPU);
    std::fs::set_permissions(sim.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(sim.path("fakegpu-state"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let uuid = sim.json(&["devices", "--json"])["gpus"][0]["uuid"].as_str().expect("a GPU UUID").to_string();
    (sim, uuid)
}

/// The one report of a finished `vgpu run` of gpu_workload: kernels completed in its first
/// one-second window.
fn first_window(run: Child, what: &str) -> (u64, String) {
    let out = run.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{what}: {}\n{stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    let line = stdout.lines().find(|l| l.starts_with("{\"kernels\"")).unwrap_or_else(|| panic!("{what}: no report: {stdout}"));
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    (v["windows"][0].as_u64().unwrap_or_else(|| panic!("{what}: no windows: {line}")), format!("{what}: {line}"))
}

#[test]
fn a_tenant_cannot_write_truncate_or_add_to_another_tenants_board_slot() {
    workload_bin();
    let (sim, uuid) = sim_for_nobody();

    let root_run = start(&sim, "root-tenant", &[], "8");
    let nobody_run = start(&sim, "nobody-tenant", &["--user", "nobody"], "8");
    let mut ids = (None, None);
    wait_for("both workloads to run", || {
        ids = (vgpu_id(&sim, "root-tenant"), vgpu_id(&sim, "nobody-tenant"));
        ids.0.is_some() && ids.1.is_some()
    });
    let (root_id, nobody_id) = (ids.0.unwrap(), ids.1.unwrap());
    let board = sim.path(&format!("run/gpus/{uuid}"));
    let root_slot = board.join(&root_id);
    let nobody_slot = board.join(&nobody_id);
    // Both shims publish, each in its own slot (nobody's shim can write its own).
    wait_for("both shims to publish", || {
        heartbeat(&root_slot).is_some_and(|h| h != 0) && heartbeat(&nobody_slot).is_some_and(|h| h != 0)
    });

    // The board is a root-owned directory; each slot belongs to its vGPU's user, 0644.
    let meta = std::fs::symlink_metadata(&board).unwrap();
    assert!(meta.is_dir(), "{} is a directory", board.display());
    assert_eq!((meta.uid(), meta.mode() & 0o7777), (0, 0o755), "{}", board.display());
    let meta = std::fs::symlink_metadata(&root_slot).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o7777), (0, 0o644), "{}", root_slot.display());
    let meta = std::fs::symlink_metadata(&nobody_slot).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o7777), (NOBODY, 0o644), "{}", nobody_slot.display());
    let before = names_in(&board);
    assert_eq!(before.len(), 2, "{before:?}");
    let root_inode = meta_ino(&root_slot);

    // Nobody cannot write root's slot, open it read-write, truncate, replace or remove it…
    let slot = root_slot.to_str().unwrap();
    denied("open a slot for writing", &["sh", "-c", ": >> \"$1\"", "sh", slot]);
    denied("open a slot read-write", &["sh", "-c", ": 1<> \"$1\"", "sh", slot]);
    denied("truncate a slot", &["truncate", "-s", "0", slot]);
    denied("remove a slot", &["rm", "-f", slot]);
    denied("rename a slot", &["mv", "-f", nobody_slot.to_str().unwrap(), slot]);
    // … nor add anything to the board's directory.
    let new = board.join("intruder");
    let new = new.to_str().unwrap();
    denied("create a file on the board", &["touch", new]);
    denied("create a FIFO on the board", &["mkfifo", new]);
    denied("create a link on the board", &["ln", "-s", "/etc/passwd", new]);
    denied("create a directory on the board", &["mkdir", new]);
    assert_eq!(names_in(&board), before);
    assert_eq!(meta_ino(&root_slot), root_inode);
    let h = heartbeat(&root_slot).expect("root's slot is whole");

    // Nobody may wreck its own slot: that hurts only itself. Root's workload, which reads
    // it, keeps running and publishing, and finishes with its report.
    let out = as_nobody(&["truncate", "-s", "0", nobody_slot.to_str().unwrap()]);
    assert!(out.status.success(), "nobody truncates its own slot: {}", String::from_utf8_lossy(&out.stderr));
    wait_for("root's shim to publish again", || heartbeat(&root_slot).is_some_and(|now| now > h + 100_000_000));

    let out = root_run.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "root's workload: {}\n{stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout.lines().filter(|l| l.starts_with("{\"kernels\"")).count(), 1, "{stdout}");
    let _ = nobody_run.wait_with_output();
    // Their slots go with their vGPUs.
    wait_for("the slots to be removed", || names_in(&board).is_empty());
}

fn meta_ino(path: &Path) -> u64 {
    std::fs::symlink_metadata(path).unwrap().ino()
}

/// The board still works across users: two strict tenants at 70 % on one GPU (140 %), one
/// run as root with priority 90, one as nobody with priority 10. Each must read the other's
/// slot (root's 0644 file, nobody's 0644 file) for the high priority to be served first: 70 %
/// and the 30 % left, a ratio of about 2.3. Blind to each other, both would take 70 % and
/// the GPU would split them about evenly.
#[test]
fn priorities_are_served_across_tenants_of_different_users() {
    let _serial = serial();
    workload_bin();
    let (sim, _) = sim_for_nobody();
    // Where both workloads can write that they are ready.
    let sync = sim.path("sync");
    std::fs::create_dir(&sync).unwrap();
    std::fs::set_permissions(&sync, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let (high_ready, low_ready, go) = (sync.join("high.ready"), sync.join("low.ready"), sync.join("go"));
    let (high_ready, low_ready, go) = (high_ready.to_str().unwrap(), low_ready.to_str().unwrap(), go.to_str().unwrap());
    let shape = |ready| ["sync", "3", "--kernel-us", "1000", "--ready", ready, "--go", go];
    let high = start_with(&sim, "high", &["--compute", "70", "--priority", "90"], &shape(high_ready));
    let low = start_with(&sim, "low", &["--compute", "70", "--priority", "10", "--user", "nobody"], &shape(low_ready));
    wait_for("both workloads to be ready", || Path::new(high_ready).exists() && Path::new(low_ready).exists());
    std::fs::write(go, b"go").unwrap();
    let ((high, high_line), (low, low_line)) = (first_window(high, "priority 90"), first_window(low, "priority 10 as nobody"));
    // The first second: later, contention on the simulated GPU blurs what each is charged
    // (as it did before slots were files of their own). Wide, for a loaded machine: far from
    // the 1.0 of tenants blind to each other. Above 2.3 by what the hand-overs between their
    // turns leave idle, which the low priority pays: 2.9-3.1 alone on a quiet 2-core machine,
    // 3.5 beside the harness's other tests; 4.5 still leaves the low one 15 %, not starved.
    let ratio = high as f64 / low.max(1) as f64;
    eprintln!("first second: ratio {ratio:.2}\n{high_line}\n{low_line}");
    assert!((1.5..=4.5).contains(&ratio), "first second: ratio {ratio:.2}, expected about 2.3\n{high_line}\n{low_line}");
}
