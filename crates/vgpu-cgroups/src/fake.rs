//! Fake cgroupfs trees in a temporary directory, for unit tests. A real kernel fills a new
//! cgroup directory with its files; `kernel_populate` plays that part after `mkdir`.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use tempfile::TempDir;

use super::layout::{Controller, Layout, Mode};

fn controller(name: &str) -> Option<Controller> {
    Controller::USED.into_iter().find(|c| c.name() == name)
}

fn write(path: &Path, text: &str) {
    fs::write(path, text).unwrap_or_else(|e| panic!("fake cgroupfs: write {}: {e}", path.display()));
}

/// A v2 tree: the root offers `controllers`; `vgpu/` exists already (as after an earlier run).
pub struct FakeV2 {
    dir: TempDir,
    controllers: Vec<String>,
}

impl FakeV2 {
    pub fn new(controllers: &[&str]) -> FakeV2 {
        let fake = FakeV2 {
            dir: tempfile::tempdir().expect("tempdir"),
            controllers: controllers.iter().map(|c| c.to_string()).collect(),
        };
        let list = format!("{}\n", controllers.join(" "));
        for dir in [fake.root().to_path_buf(), fake.root().join("vgpu")] {
            fs::create_dir_all(&dir).expect("mkdir");
            write(&dir.join("cgroup.controllers"), &list);
            write(&dir.join("cgroup.subtree_control"), "");
            write(&dir.join("cgroup.procs"), "");
        }
        fake
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn layout(&self) -> Layout {
        Layout { mode: Mode::V2, unified: Some(self.root().to_path_buf()), v1: BTreeMap::new(), v2_controllers: self.controllers.clone() }
    }

    /// The files the kernel would put in the new cgroup `rel` (relative to the root).
    pub fn kernel_populate(&self, rel: &str) {
        let dir = self.root().join(rel);
        let files = [
            ("cgroup.controllers", format!("{}\n", self.controllers.join(" "))),
            ("cgroup.subtree_control", String::new()),
            ("cgroup.procs", String::new()),
            ("cgroup.events", "populated 0\nfrozen 0\n".into()),
            ("cgroup.freeze", "0\n".into()),
            ("cpu.max", "max 100000".into()),
            ("memory.max", "max".into()),
            ("pids.max", "max".into()),
        ];
        for (name, text) in files {
            write(&dir.join(name), &text);
        }
    }

    pub fn read(&self, rel: &str) -> String {
        fs::read_to_string(self.root().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
    }
}

/// A v1 tree: one directory per mount, named like the host's (`cpu,cpuacct`, `memory`, …).
pub struct FakeV1 {
    dir: TempDir,
    mounts: Vec<String>,
}

impl FakeV1 {
    pub fn new(mounts: &[&str]) -> FakeV1 {
        let fake = FakeV1 { dir: tempfile::tempdir().expect("tempdir"), mounts: mounts.iter().map(|m| m.to_string()).collect() };
        for mount in mounts {
            fs::create_dir_all(fake.root().join(mount)).expect("mkdir");
        }
        fake
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn mounts(&self) -> BTreeMap<Controller, PathBuf> {
        let mut map = BTreeMap::new();
        for mount in &self.mounts {
            for name in mount.split(',') {
                if let Some(c) = controller(name) {
                    map.insert(c, self.root().join(mount));
                }
            }
        }
        map
    }

    pub fn layout(&self) -> Layout {
        Layout { mode: Mode::Hybrid, unified: None, v1: self.mounts(), v2_controllers: Vec::new() }
    }

    /// The files the kernel would put in `<mount>/vgpu/<name>` of every hierarchy.
    pub fn kernel_populate(&self, name: &str) {
        for mount in &self.mounts {
            let dir = self.root().join(mount).join("vgpu").join(name);
            write(&dir.join("cgroup.procs"), "");
            write(&dir.join("tasks"), "");
            for controller in mount.split(',') {
                let files: &[(&str, &str)] = match controller {
                    "cpu" => &[("cpu.cfs_quota_us", "-1"), ("cpu.cfs_period_us", "100000")],
                    "cpuacct" => &[("cpuacct.usage", "0")],
                    "memory" => &[("memory.limit_in_bytes", "9223372036854771712"), ("memory.usage_in_bytes", "0")],
                    "pids" => &[("pids.max", "max"), ("pids.current", "0")],
                    "freezer" => &[("freezer.state", "THAWED\n")],
                    _ => &[],
                };
                for (file, text) in files {
                    write(&dir.join(file), text);
                }
            }
        }
    }

    /// What the kernel's rmdir does to the files: they go with the directory.
    pub fn kernel_forget_files(&self, name: &str) {
        for mount in &self.mounts {
            let dir = self.root().join(mount).join("vgpu").join(name);
            for entry in fs::read_dir(&dir).expect("read_dir").flatten() {
                if entry.path().is_file() {
                    fs::remove_file(entry.path()).expect("rm");
                }
            }
        }
    }

    pub fn read(&self, rel: &str) -> String {
        fs::read_to_string(self.root().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
    }
}
