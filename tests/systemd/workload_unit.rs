//! `vgpu@NAME.service` under a real systemd, with a workload file as an admin writes one
//! (`/etc/vgpu/workloads/NAME.toml`): the workload runs in the unit's delegated subtree
//! (the manager `auto` chooses there: `delegated`), `vgpu ps` names it NAME, `systemctl
//! status` lists vgpu run and the workload, `systemctl stop` ends it cleanly (the unit
//! inactive, not failed) with vgpu's record and vGPU gone, and `systemctl kill -s KILL`
//! likewise once vgpu reconciles. On both cgroup trees.

use crate::systemd::container::Tree;
use crate::systemd::installed::{text, Installed};

const UNIT: &str = "vgpu@job.service";

/// The workload's record, once it runs.
fn running(host: &Installed) -> serde_json::Value {
    host.wait_for("job to run", || host.records().iter().any(|r| r["state"] == "running" && r["pid"].is_u64()));
    host.records().into_iter().next().expect("job's record")
}

fn gone(host: &Installed) {
    host.wait_for("job's record and vGPU to be gone", || host.records().is_empty() && host.vgpu_dirs().is_empty());
    assert!(host.ct.output(&["pgrep", "-x", "sleep"]).is_err(), "the workload's process is left");
}

fn the_workload_unit(tree: Tree) {
    let host = Installed::new(tree, "");
    host.write("/etc/vgpu/workloads/job.toml", "mem = \"2G\"\ncommand = [\"sleep\", \"600\"]\n");
    host.systemctl(&["start", UNIT]);
    let record = running(&host);
    let id = record["id"].as_str().expect("an id").to_string();
    let unit_cgroup = host.show(UNIT, "ControlGroup");
    assert_eq!(unit_cgroup, "/system.slice/system-vgpu.slice/vgpu@job.service");

    // `auto` chose the unit's delegated subtree, and the record says so.
    let home = &record["cgroup_home"];
    assert_eq!(home["manager"], "delegated", "{record:#}\n{}", host.status(UNIT));
    assert_eq!(home["unit"], UNIT, "{record:#}");
    // The workload in the unit's subtree: on v2 in <unit>/vgpu/<id>; on hybrid in the unit
    // in systemd's own hierarchy (which vgpu leaves to systemd) and in <unit>/vgpu/<id> in
    // each controller systemd delegated (memory, cpu, pids). vgpu run in the unit too (on
    // v2 in its `supervisor` leaf).
    let pid = record["pid"].as_u64().unwrap().to_string();
    let cgroups = host.ct.output(&["cat", &format!("/proc/{pid}/cgroup")]).unwrap();
    let workload_cgroup = format!("{unit_cgroup}/vgpu/{id}");
    match tree {
        Tree::Unified => assert!(cgroups.lines().any(|l| l == format!("0::{workload_cgroup}")), "{cgroups}"),
        Tree::Hybrid => {
            assert!(cgroups.lines().any(|l| l == format!("0::{unit_cgroup}")), "{cgroups}");
            for controller in ["memory", "pids", "cpu"] {
                assert!(cgroups.lines().any(|l| l.ends_with(&format!(":{controller}:{workload_cgroup}"))), "{controller}: {cgroups}");
            }
        }
    }
    let main = host.show(UNIT, "MainPID");
    let own = host.ct.output(&["cat", &format!("/proc/{main}/cgroup")]).unwrap();
    let supervisor = match tree {
        Tree::Hybrid => format!("0::{unit_cgroup}"),
        Tree::Unified => format!("0::{unit_cgroup}/supervisor"),
    };
    assert!(own.lines().any(|l| l == supervisor), "vgpu run left its unit: {own}\n{}", host.status(UNIT));

    // systemctl status lists both; vgpu ps names the workload after the file.
    let status = host.status(UNIT);
    assert!(status.contains("vgpu run --workload job") && status.contains("sleep 600"), "{status}");
    let ps = host.ps();
    assert_eq!(ps.len(), 1, "{ps:?}");
    assert_eq!(ps[0]["name"], "job", "{:#}", ps[0]);

    // Stop: SIGTERM to vgpu run, relayed; the unit ends cleanly, vgpu's state with it.
    host.systemctl(&["stop", UNIT]);
    assert_eq!(host.show(UNIT, "ActiveState"), "inactive", "{}\n{}", host.status(UNIT), host.journal(UNIT));
    assert_eq!(host.show(UNIT, "Result"), "success", "{}", host.status(UNIT));
    gone(&host);

    // SIGKILL to every process of the unit: vgpu run has no chance to tear down; the next
    // vgpu command reconciles (its supervisor is dead) and removes what is left.
    host.systemctl(&["start", UNIT]);
    let record = running(&host);
    host.systemctl(&["kill", "-s", "KILL", UNIT]);
    host.wait_for("the unit to end", || host.show(UNIT, "ActiveState") != "active");
    let out = host.vgpu(&["ps"]);
    assert!(out.status.success(), "{}", text(&out));
    gone(&host);
    assert!(!host.exists(&format!("/sys/fs/cgroup/unified{unit_cgroup}")) && !host.exists(&format!("/sys/fs/cgroup{unit_cgroup}")), "the unit's cgroup is left");
    assert_ne!(record["id"], serde_json::Value::from(id));
}

#[test]
fn the_workload_unit_on_the_hybrid_tree() {
    the_workload_unit(Tree::Hybrid);
}

#[test]
fn the_workload_unit_on_the_unified_tree() {
    the_workload_unit(Tree::Unified);
}

/// The OOM explanation under a real systemd, where a memory controller is delegated (the
/// hybrid tree: the unified tree here has none, tests/systemd/unified.rs): a workload file's
/// `memory` limit is written in the unit's subtree, the kernel's OOM killer ends the
/// workload there, and vgpu run says so in the unit's journal.
#[test]
fn an_oom_killed_workload_unit_is_explained_on_the_hybrid_tree() {
    let host = Installed::new(Tree::Hybrid, "");
    host.write("/etc/vgpu/workloads/hungry.toml", "memory = \"32M\"\ncommand = [\"python3\", \"-c\", \"x = bytearray(256 << 20)\"]\n");
    host.systemctl(&["start", "vgpu@hungry.service"]);
    host.wait_for("the unit to end", || !matches!(host.show("vgpu@hungry.service", "ActiveState").as_str(), "active" | "activating"));
    let journal = host.journal("vgpu@hungry.service");
    assert!(
        journal.contains("the kernel's OOM killer killed 1 process(es) of hungry (") && journal.contains("it reached its host memory limit (--memory 32 MiB)"),
        "{journal}"
    );
    assert_eq!(host.show("vgpu@hungry.service", "ExecMainStatus"), "137", "{journal}");
    assert!(host.records().is_empty() && host.vgpu_dirs().is_empty());
}
