//! `vgpu-service@NAME.service` under a real systemd: the runner is ready (`READY=1`) with
//! the service's replicas running in the unit's delegated subtree, restarts a replica that
//! dies, and `systemctl stop` stops every replica and ends cleanly, vgpu's records with
//! them. On both cgroup trees.

use crate::systemd::container::Tree;
use crate::systemd::installed::{text, Installed};

const UNIT: &str = "vgpu-service@web.service";

fn replicas(host: &Installed) -> Vec<serde_json::Value> {
    host.records().into_iter().filter(|r| r["service"]["name"] == "web" || r["service"] == "web").collect()
}

fn running_pids(host: &Installed) -> Vec<u64> {
    let mut pids: Vec<u64> = replicas(host).iter().filter(|r| r["state"] == "running").filter_map(|r| r["pid"].as_u64()).collect();
    pids.sort();
    pids
}

fn the_service_unit(tree: Tree) {
    let host = Installed::new(tree, "");
    let out = host.vgpu(&["service", "create", "web", "--replicas", "2", "--mem", "1G", "--", "sleep", "600"]);
    assert!(out.status.success(), "vgpu service create: {}", text(&out));
    host.systemctl(&["start", UNIT]);
    assert_eq!(host.show(UNIT, "ActiveState"), "active", "{}", host.status(UNIT));
    host.wait_for("two replicas", || running_pids(&host).len() == 2);
    let unit_cgroup = host.show(UNIT, "ControlGroup");
    for record in replicas(&host) {
        assert_eq!(record["cgroup_home"]["manager"], "delegated", "{record:#}\n{}", host.status(UNIT));
        assert_eq!(record["cgroup_home"]["unit"], UNIT, "{record:#}");
        let pid = record["pid"].as_u64().unwrap().to_string();
        let cgroups = host.ct.output(&["cat", &format!("/proc/{pid}/cgroup")]).unwrap();
        assert!(cgroups.lines().any(|l| l.starts_with("0::") && l[3..].starts_with(&unit_cgroup)), "the replica is outside its unit: {cgroups}");
    }
    let status = host.status(UNIT);
    // The runner, each replica's vgpu run and each replica's workload.
    let listed = |what: &str| status.lines().filter(|l| l.contains(what)).count();
    assert_eq!(listed("vgpu service run web"), 1, "{status}");
    assert_eq!(listed("vgpu run --report-fd"), 2, "{status}");
    assert_eq!(status.lines().filter(|l| l.ends_with(" sleep 600") && !l.contains("vgpu run")).count(), 2, "{status}");

    // A replica that dies is started again.
    let before = running_pids(&host);
    host.ct.output(&["kill", "-KILL", &before[0].to_string()]).unwrap();
    host.wait_for("the replica to be restarted", || {
        let now = running_pids(&host);
        now.len() == 2 && !now.contains(&before[0])
    });

    // Stop: every replica stopped, the unit inactive and not failed.
    host.systemctl(&["stop", UNIT]);
    assert_eq!(host.show(UNIT, "ActiveState"), "inactive", "{}\n{}", host.status(UNIT), host.journal(UNIT));
    assert_eq!(host.show(UNIT, "Result"), "success", "{}", host.journal(UNIT));
    host.wait_for("the replicas' records and vGPUs to be gone", || host.records().is_empty() && host.vgpu_dirs().is_empty());
    assert!(host.ct.output(&["pgrep", "-x", "sleep"]).is_err(), "a replica is left");
}

#[test]
fn the_service_unit_on_the_hybrid_tree() {
    the_service_unit(Tree::Hybrid);
}

#[test]
fn the_service_unit_on_the_unified_tree() {
    the_service_unit(Tree::Unified);
}
