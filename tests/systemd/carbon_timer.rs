//! `vgpu-carbon.timer` under a real systemd fires `vgpu-carbon.service`, which applies the
//! carbon budget's clock caps through the (simulated) NVML inside its sandbox: the caps
//! reach the GPU (a second apply from a shell has nothing left to write), and the decision
//! is logged. The timer's schedule is the unit's (every 15 minutes, 2 minutes after boot)
//! plus a test drop-in that fires it one second after it starts. On both cgroup trees.

use crate::systemd::container::Tree;
use crate::systemd::installed::{text, Installed};

/// A budget no clock meets at this intensity: the lowest clocks are applied.
const CARBON: &str = "[carbon]\nsource = \"static\"\nvalue = 800\nbudget_g_per_hour = 50\n";

fn the_carbon_timer(tree: Tree) {
    let host = Installed::new(tree, CARBON);
    host.write("/etc/systemd/system/vgpu-carbon.timer.d/test.conf", "[Timer]\nOnActiveSec=1s\nAccuracySec=100ms\n");
    host.systemctl(&["daemon-reload"]);
    host.systemctl(&["enable", "--now", "vgpu-carbon.timer"]);
    assert_eq!(host.show("vgpu-carbon.timer", "ActiveState"), "active");
    host.wait_for("the timer to fire the service", || host.show("vgpu-carbon.service", "ExecMainExitTimestampMonotonic") != "0");
    let journal = host.journal("vgpu-carbon.service");
    assert_eq!(host.show("vgpu-carbon.service", "Result"), "success", "{journal}");
    assert_eq!(host.show("vgpu-carbon.service", "ExecMainStatus"), "0", "{journal}");
    assert_ne!(host.show("vgpu-carbon.timer", "LastTriggerUSecMonotonic"), "0");

    // The decision is logged, with the NVML writes it made.
    let log = host.read("/var/lib/vgpu/carbon.jsonl").unwrap_or_else(|| panic!("no decision log:\n{journal}"));
    let last: serde_json::Value = serde_json::from_str(log.lines().last().expect("a decision")).expect("a JSON decision");
    assert_eq!(last["action"], "apply", "{last:#}");
    assert!(last.to_string().contains("lock-clocks"), "the caps were written: {last:#}\n{journal}");
    assert!(host.exists("/run/vgpu/carbon-applied.json"));

    // They reached the (simulated) GPU: the same apply from a shell has nothing to write.
    let out = host.vgpu(&["carbon", "apply", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let again: serde_json::Value = serde_json::from_slice(&out.stdout).expect("carbon apply --json");
    let writes: usize = again["gpus"].as_array().expect("gpus").iter().map(|g| g["writes"].as_array().map_or(0, Vec::len)).sum();
    assert_eq!(writes, 0, "the caps the service applied were not in the GPU: {again:#}\n{journal}");
}

#[test]
fn the_carbon_timer_on_the_hybrid_tree() {
    the_carbon_timer(Tree::Hybrid);
}

#[test]
fn the_carbon_timer_on_the_unified_tree() {
    the_carbon_timer(Tree::Unified);
}
