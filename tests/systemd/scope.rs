//! `vgpu run` from a user's shell under a real systemd (outside any delegated unit): `auto`
//! asks systemd over the system bus for a transient scope `vgpu-<id>.scope`
//! (`StartTransientUnit`, `Delegate=yes`), `systemctl status` shows vgpu run and the
//! workload in it, and `systemctl stop` of the scope ends the workload, vgpu saying so and
//! tearing its vGPU down. On both cgroup trees.

use crate::systemd::container::Tree;
use crate::systemd::installed::{Installed, VGPU};

fn a_shells_run_gets_a_scope(tree: Tree) {
    let host = Installed::new(tree, "");
    // The shell: a transient service of the container's, its output kept in files.
    let files = ["StandardOutput=file:/run/shell.out", "StandardError=file:/run/shell.err"];
    host.ct.service("shell", &files, &[VGPU, "run", "--name", "from-shell", "--", "sleep", "600"]).unwrap();
    host.wait_for("the workload to run", || host.records().iter().any(|r| r["state"] == "running" && r["pid"].is_u64()));
    let record = host.records().into_iter().next().unwrap();
    let id = record["id"].as_str().unwrap().to_string();
    let scope = format!("vgpu-{id}.scope");
    let home = &record["cgroup_home"];
    assert_eq!(home["manager"], "systemd", "{record:#}");
    assert_eq!(home["unit"], scope.as_str(), "{record:#}");

    // systemd made it, delegated, holding vgpu run and the workload.
    assert_eq!(host.show(&scope, "ActiveState"), "active");
    assert_eq!(host.show(&scope, "Delegate"), "yes");
    assert_eq!(host.show(&scope, "Transient"), "yes");
    let status = host.status(&scope);
    assert!(status.contains(&format!("{VGPU} run --name from-shell")) && status.contains("sleep 600"), "{status}");
    let scope_cgroup = host.show(&scope, "ControlGroup");
    assert_eq!(scope_cgroup, format!("/system.slice/{scope}"));
    let pid = record["pid"].as_u64().unwrap().to_string();
    let cgroups = host.ct.output(&["cat", &format!("/proc/{pid}/cgroup")]).unwrap();
    let (tracking, memory) = match tree {
        Tree::Unified => (format!("0::{scope_cgroup}/vgpu/{id}"), None),
        Tree::Hybrid => (format!("0::{scope_cgroup}"), Some(format!(":memory:{scope_cgroup}/vgpu/{id}"))),
    };
    assert!(cgroups.lines().any(|l| l == tracking), "{cgroups}");
    if let Some(memory) = memory {
        assert!(cgroups.lines().any(|l| l.ends_with(&memory)), "{cgroups}");
    }

    // Stop the scope: the workload ends, vgpu says so and tears down.
    host.systemctl(&["stop", &scope]);
    host.wait_for("the shell's vgpu run to end", || host.show("shell.service", "ActiveState") != "active" || host.show("shell.service", "LoadState") == "not-found");
    host.wait_for("the record and vGPU to be gone", || host.records().is_empty() && host.vgpu_dirs().is_empty());
    assert!(host.ct.output(&["pgrep", "-x", "sleep"]).is_err(), "the workload is left");
    assert_ne!(host.show(&scope, "ActiveState"), "active");
    let said = host.read("/run/shell.err").unwrap_or_default();
    assert!(
        said.contains(&format!("vgpu: systemd sent SIGTERM to {scope} (systemctl stop or kill): relayed to from-shell ({id})")),
        "vgpu run said: {said:?}"
    );
}

#[test]
fn a_shells_run_gets_a_scope_on_the_hybrid_tree() {
    a_shells_run_gets_a_scope(Tree::Hybrid);
}

#[test]
fn a_shells_run_gets_a_scope_on_the_unified_tree() {
    a_shells_run_gets_a_scope(Tree::Unified);
}
