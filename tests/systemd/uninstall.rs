//! install.sh under a real systemd: a plain install enables and starts
//! `vgpu-watch.service`; an admin then enables the carbon timer, a workload unit and a
//! service unit; `install.sh --uninstall` stops and disables every one of them (the
//! instances of the templates included), removes every file it installed, and leaves no
//! vgpu unit loaded or running and no process of vgpu behind. What the admin wrote (the
//! edited config, the workload file, the service definition) and the state stay, as
//! documented. On both cgroup trees.

use crate::systemd::container::Tree;
use crate::systemd::installed::{checkout, text, Installed, PREFIX};

/// Units loaded by systemd whose name starts with `vgpu` and that are not inactive.
fn live_units(host: &Installed) -> Vec<String> {
    let out = host.systemctl(&["list-units", "--all", "--plain", "--no-legend", "vgpu*"]);
    out.lines().filter(|l| l.split_whitespace().nth(2).is_none_or(|active| active != "inactive")).map(str::to_string).collect()
}

fn install_then_uninstall(tree: Tree) {
    // What install.sh does by default where systemd runs: the watch enabled and started.
    let host = Installed::with_install_args(tree, &[]);
    assert!(host.install_output.contains("vgpu watch enabled and started"), "{}", host.install_output);
    assert_eq!(host.show("vgpu-watch.service", "ActiveState"), "active", "{}", host.status("vgpu-watch.service"));
    assert_eq!(host.show("vgpu-watch.service", "UnitFileState"), "enabled");

    // The admin: the simulated GPU, the carbon timer, a workload unit, a service unit.
    host.config("[carbon]\nsource = \"static\"\nvalue = 300\nbudget_g_per_hour = 500\n");
    host.systemctl(&["restart", "vgpu-watch.service"]);
    host.write("/etc/vgpu/workloads/job.toml", "mem = \"1G\"\ncommand = [\"sleep\", \"600\"]\n");
    let out = host.vgpu(&["service", "create", "web", "--replicas", "1", "--mem", "1G", "--", "sleep", "600"]);
    assert!(out.status.success(), "{}", text(&out));
    host.systemctl(&["enable", "--now", "vgpu-carbon.timer", "vgpu@job.service", "vgpu-service@web.service"]);
    host.wait_for("the workload and the replica to run", || host.records().iter().filter(|r| r["state"] == "running").count() == 2);
    assert_eq!(live_units(&host).len(), 4, "{:?}", live_units(&host));

    let manifest = host.read(&format!("{PREFIX}/lib/vgpu/install-manifest.txt")).expect("the install manifest");
    // What install.sh made (not the directories it found there: `found`).
    let installed: Vec<String> = manifest
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("found\t"))
        .filter_map(|l| l.splitn(3, '\t').nth(2))
        .map(str::to_string)
        .collect();
    assert!(installed.iter().any(|p| p == "/etc/systemd/system/vgpu@.service"), "{manifest}");

    let out = host.ct.shell(&format!("{}/install.sh --uninstall --prefix {PREFIX}", checkout().display()));
    let said = text(&out);
    assert!(out.status.success(), "install.sh --uninstall: {said}");
    assert!(said.contains("kept /etc/vgpu/config.toml (changed since install.sh installed it)"), "{said}");

    // Nothing of vgpu runs, nothing is loaded or enabled, no file it installed is left.
    assert!(live_units(&host).is_empty(), "units left: {:?}\n{said}", live_units(&host));
    assert!(host.ct.output(&["pgrep", "-f", "vgpu"]).is_err(), "vgpu processes left: {:?}", host.ct.output(&["pgrep", "-a", "-f", "vgpu"]));
    assert!(host.ct.output(&["pgrep", "-x", "sleep"]).is_err(), "a workload is left");
    for path in &installed {
        // The edited config, and the directories that hold what the admin wrote.
        let kept = ["/etc/vgpu/config.toml", "/etc/vgpu"].contains(&path.as_str());
        assert!(kept || !host.exists(path), "{path} is left after --uninstall:\n{said}");
    }
    let wants = host.ct.output(&["find", "/etc/systemd/system", "-name", "vgpu*"]).unwrap();
    assert!(wants.trim().is_empty(), "unit files or links left: {wants}");
    assert!(!host.exists(PREFIX), "{PREFIX} is left");
    assert!(!host.exists("/run/vgpu/simulate"), "the simulated driver's links are left");
    let unit_files = host.systemctl_output(&["list-unit-files", "--plain", "--no-legend", "vgpu*"]);
    assert!(String::from_utf8_lossy(&unit_files.stdout).trim().is_empty(), "{}", text(&unit_files));
    // What the admin wrote stays (the config is named above).
    assert!(host.exists("/etc/vgpu/workloads/job.toml") && host.exists("/var/lib/vgpu/services/web.toml"));
}

#[test]
fn install_then_uninstall_on_the_hybrid_tree() {
    install_then_uninstall(Tree::Hybrid);
}

#[test]
fn install_then_uninstall_on_the_unified_tree() {
    install_then_uninstall(Tree::Unified);
}
