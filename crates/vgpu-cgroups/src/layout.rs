//! Reading the cgroup layout from `/proc/self/mountinfo`.
//!
//! - v2 ("unified"): one `cgroup2` mount carries every controller.
//! - v1 ("legacy"): one `cgroup` mount per controller (or per group of controllers).
//! - hybrid: v1 controller mounts plus a `cgroup2` mount (usually `/sys/fs/cgroup/unified`)
//!   that holds no controller vgpu can use; vgpu then uses the v1 hierarchies.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The controllers vgpu uses for a workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Controller {
    Cpu,
    Memory,
    Pids,
    Freezer,
    /// CPU usage accounting. A hierarchy of its own on v1 (often co-mounted with `cpu`);
    /// on v2 every cgroup reports it in `cpu.stat`. Optional: only `stats()` reads it.
    Cpuacct,
}

impl Controller {
    /// The controllers vgpu needs (what `vgpu doctor` checks).
    pub const ALL: [Controller; 4] = [Controller::Cpu, Controller::Memory, Controller::Pids, Controller::Freezer];

    /// Every controller a workload's cgroup is created in, where the host has it.
    pub const USED: [Controller; 5] =
        [Controller::Cpu, Controller::Cpuacct, Controller::Memory, Controller::Pids, Controller::Freezer];

    pub fn name(self) -> &'static str {
        match self {
            Controller::Cpu => "cpu",
            Controller::Memory => "memory",
            Controller::Pids => "pids",
            Controller::Freezer => "freezer",
            Controller::Cpuacct => "cpuacct",
        }
    }
}

impl std::fmt::Display for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    V1,
    V2,
    Hybrid,
}

impl Mode {
    pub fn describe(self) -> &'static str {
        match self {
            Mode::V1 => "cgroup v1 (legacy)",
            Mode::V2 => "cgroup v2 (unified)",
            Mode::Hybrid => "cgroup v1 + v2 (hybrid; vgpu uses the v1 controllers)",
        }
    }
}

/// Where the hierarchies are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub mode: Mode,
    /// The `cgroup2` mount, if any.
    pub unified: Option<PathBuf>,
    /// v1 controller mounts (by controller), only in v1 and hybrid modes.
    pub v1: BTreeMap<Controller, PathBuf>,
    /// Controllers enabled in the v2 root (`cgroup.controllers`), in v2 mode.
    pub v2_controllers: Vec<String>,
}

impl Layout {
    /// Detect the host's layout. `None`: no cgroup filesystem is mounted at all.
    pub fn detect() -> Option<Layout> {
        // Read whole at once: a file of /proc reports no size, and read_to_string's first
        // reads would be 32 bytes, then 64, 128… each one regenerating the table.
        let mut mountinfo = String::with_capacity(16 << 10);
        std::io::Read::read_to_string(&mut std::fs::File::open("/proc/self/mountinfo").ok()?, &mut mountinfo).ok()?;
        let mut layout = Layout::from_mountinfo(&mountinfo)?;
        if let (Mode::V2, Some(root)) = (layout.mode, &layout.unified) {
            layout.v2_controllers = read_controllers(root);
        }
        Some(layout)
    }

    /// Parse mountinfo text (pure, for tests).
    pub fn from_mountinfo(text: &str) -> Option<Layout> {
        let mut unified = None;
        let mut v1 = BTreeMap::new();
        for line in text.lines() {
            let Some((mount_point, fstype, super_opts)) = parse_line(line) else { continue };
            match fstype {
                "cgroup2" if unified.is_none() => unified = Some(PathBuf::from(&mount_point)),
                "cgroup" => {
                    for opt in super_opts.split(',') {
                        let controller = match opt {
                            "cpu" => Controller::Cpu,
                            "memory" => Controller::Memory,
                            "pids" => Controller::Pids,
                            "freezer" => Controller::Freezer,
                            "cpuacct" => Controller::Cpuacct,
                            _ => continue,
                        };
                        v1.entry(controller).or_insert_with(|| PathBuf::from(&mount_point));
                    }
                }
                _ => {}
            }
        }
        let mode = match (unified.is_some(), v1.is_empty()) {
            (true, true) => Mode::V2,
            (true, false) => Mode::Hybrid,
            (false, false) => Mode::V1,
            (false, true) => return None,
        };
        Some(Layout { mode, unified, v1, v2_controllers: Vec::new() })
    }

    /// Whether `controller` can be used by vgpu on this host.
    pub fn has(&self, controller: Controller) -> bool {
        match self.mode {
            Mode::V1 | Mode::Hybrid => self.v1.contains_key(&controller),
            // The v2 freezer is built into every non-root cgroup (`cgroup.freeze`), and so is
            // CPU usage (`cpu.stat`).
            Mode::V2 => {
                matches!(controller, Controller::Freezer | Controller::Cpuacct)
                    || self.v2_controllers.iter().any(|c| c == controller.name())
            }
        }
    }

    /// Where `controller`'s hierarchy is mounted.
    pub fn mount_of(&self, controller: Controller) -> Option<&Path> {
        match self.mode {
            Mode::V1 | Mode::Hybrid => self.v1.get(&controller).map(PathBuf::as_path),
            Mode::V2 => self.unified.as_deref(),
        }
    }
}

/// Mount point, filesystem type and super options of one mountinfo line:
/// `ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTS [OPTIONAL…] - FSTYPE SOURCE SUPER_OPTS`.
fn parse_line(line: &str) -> Option<(String, &str, &str)> {
    let (left, right) = line.split_once(" - ")?;
    let mount_point = left.split(' ').nth(4)?;
    let mut right = right.split(' ');
    let fstype = right.next()?;
    let _source = right.next()?;
    let super_opts = right.next().unwrap_or("");
    Some((unescape(mount_point), fstype, super_opts))
}

/// mountinfo escapes space, tab, newline and backslash as octal `\NNN`.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() && bytes[i + 1..i + 4].iter().all(|b| (b'0'..=b'7').contains(b)) {
            let value = (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(value);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn read_controllers(root: &Path) -> Vec<String> {
    std::fs::read_to_string(root.join("cgroup.controllers"))
        .map(|s| s.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn hybrid() {
        let layout = Layout::from_mountinfo(HYBRID).unwrap();
        assert_eq!(layout.mode, Mode::Hybrid);
        assert_eq!(layout.unified.as_deref(), Some(Path::new("/sys/fs/cgroup/unified")));
        assert_eq!(layout.mount_of(Controller::Cpu), Some(Path::new("/sys/fs/cgroup/cpu,cpuacct")));
        assert_eq!(layout.mount_of(Controller::Cpuacct), layout.mount_of(Controller::Cpu));
        assert!(Controller::ALL.iter().all(|&c| layout.has(c)));
    }

    #[test]
    fn legacy_without_pids() {
        let text: String = HYBRID.lines().filter(|l| !l.contains("cgroup2") && !l.contains("pids")).map(|l| format!("{l}\n")).collect();
        let layout = Layout::from_mountinfo(&text).unwrap();
        assert_eq!(layout.mode, Mode::V1);
        assert!(!layout.has(Controller::Pids));
        assert!(layout.has(Controller::Memory));
    }

    #[test]
    fn unified() {
        let text = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        let mut layout = Layout::from_mountinfo(text).unwrap();
        assert_eq!(layout.mode, Mode::V2);
        layout.v2_controllers = vec!["cpu".into(), "memory".into()];
        assert!(layout.has(Controller::Cpu));
        assert!(layout.has(Controller::Freezer));
        assert!(!layout.has(Controller::Pids));
        assert_eq!(layout.mount_of(Controller::Memory), Some(Path::new("/sys/fs/cgroup")));
    }

    #[test]
    fn none_and_escapes() {
        assert!(Layout::from_mountinfo("22 1 0:21 / /proc rw - proc proc rw\n").is_none());
        let text = "41 31 0:38 / /mnt/my\\040cg rw - cgroup2 cgroup2 rw\n";
        assert_eq!(Layout::from_mountinfo(text).unwrap().unified.as_deref(), Some(Path::new("/mnt/my cg")));
    }
}
