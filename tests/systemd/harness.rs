//! The harness itself: a container boots on each tree with systemd as its PID 1 and the
//! cgroup layout asked for, runs a command as a user's shell would, and leaves nothing
//! behind — no process, mount or cgroup — even with vgpu's units and workloads running in
//! it when it is torn down.

use std::path::PathBuf;

use crate::systemd::container::{Container, Tree};
use crate::systemd::installed::{text, Installed};

#[test]
fn hierarchies_match_their_mounts() {
    use crate::systemd::container::same_hierarchy;
    assert!(same_hierarchy("", ""));
    assert!(same_hierarchy("cpu,cpuacct", "rw,cpu,cpuacct"));
    assert!(same_hierarchy("name=systemd", "rw,xattr,name=systemd"));
    assert!(!same_hierarchy("memory", "rw,cpu,cpuacct"));
    assert!(!same_hierarchy("", "rw,memory"));
}

fn boots_with_its_layout(tree: Tree) {
    let ct = Container::boot(tree, &[]).unwrap_or_else(|e| panic!("the {} container did not boot: {e}", tree.name()));
    // PID 1 is systemd, and a shell's command runs in a unit of its tree.
    assert_eq!(ct.output(&["cat", "/proc/1/comm"]).unwrap().trim(), "systemd");
    let out = ct.shell("stat -fc %T /sys/fs/cgroup; grep '^0::' /proc/self/cgroup; echo $((6 * 7))");
    assert!(out.status.success(), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<&str> = said.lines().collect();
    assert_eq!(lines.len(), 3, "{said}");
    match tree {
        // The v1 controllers, written by the container's systemd: a unit has a memory cgroup.
        Tree::Hybrid => {
            assert_eq!(lines[0], "tmpfs", "{said}");
            let memory = ct.shell("grep ':memory:' /proc/self/cgroup");
            assert!(String::from_utf8_lossy(&memory.stdout).contains(":memory:/system.slice/run-"), "{}", text(&memory));
        }
        Tree::Unified => assert_eq!(lines[0], "cgroup2fs", "{said}"),
    }
    assert!(lines[1].starts_with("0::/system.slice/run-") && lines[1].ends_with(".service"), "{said}");
    assert_eq!(lines[2], "42");
    // A command's exit status comes back.
    assert_eq!(ct.shell("exit 3").status.code(), Some(3));
    let figures = ct.timings;
    let torn = ct.teardown().unwrap_or_else(|left| panic!("teardown left: {left}"));
    eprintln!("{}: boot {:?}, teardown {torn:?}", tree.name(), figures.boot);
}

#[test]
fn boots_on_the_hybrid_tree() {
    boots_with_its_layout(Tree::Hybrid);
}

#[test]
fn boots_on_the_unified_tree() {
    boots_with_its_layout(Tree::Unified);
}

/// Torn down with vgpu's watch and a workload running (frozen, even: a v1-frozen task dies
/// only once thawed), a container leaves no process, cgroup, mount or file behind.
fn teardown_leaves_nothing(tree: Tree) {
    let host = Installed::new(tree, "");
    host.systemctl(&["start", "vgpu-watch.service"]);
    host.ct.service("held", &[], &["/opt/vgpu/bin/vgpu", "run", "--name", "held", "--", "sleep", "600"]).unwrap();
    host.wait_for("the workload to run", || host.records().iter().any(|r| r["state"] == "running" && r["pid"].is_u64()));
    let out = host.vgpu(&["suspend", "held"]);
    assert!(out.status.success(), "vgpu suspend: {}", text(&out));
    let cgroups: Vec<PathBuf> = host.ct.host_cgroups().to_vec();
    let dir = host.ct.host_dir();
    let init = host.ct.path("/").parent().map(|p| p.to_path_buf()).unwrap();
    assert!(cgroups.iter().all(|c| c.is_dir()));
    host.ct.teardown().unwrap_or_else(|left| panic!("teardown left: {left}"));
    for cgroup in &cgroups {
        assert!(!cgroup.exists(), "{} left behind", cgroup.display());
    }
    assert!(!dir.exists(), "{} left behind", dir.display());
    assert!(!init.exists(), "the container's init ({}) still runs", init.display());
    assert!(crate::systemd::container::mounts_below(&dir).is_empty());
}

#[test]
fn teardown_leaves_nothing_on_the_hybrid_tree() {
    teardown_leaves_nothing(Tree::Hybrid);
}

#[test]
fn teardown_leaves_nothing_on_the_unified_tree() {
    teardown_leaves_nothing(Tree::Unified);
}
