//! Which workload a process belongs to: the cgroup `vgpu/<name>` it (or an ancestor cgroup
//! of it) is in, read from `/proc/PID/cgroup` (readable by every user).

use vgpu_cgroups::PARENT;

/// The workload cgroup named in `/proc/PID/cgroup`'s text: the first component below
/// `/vgpu/` in any hierarchy's path (v1 controller lines and the v2 `0::` line alike), if it
/// is a plain name. A process in a sub-cgroup (`/vgpu/<id>/worker`) is the workload's.
///
/// `vgpu/` is vgpu's at the hierarchy's root (cgroupfs manager) or right below a system
/// unit's cgroup (`/system.slice/vgpu@x.service/vgpu/<id>`: the delegated manager,
/// `vgpu_cgroups::home`). Not below `/user.slice`, where users may own delegated subtrees
/// and could make a `vgpu/<id>` of their own.
pub fn workload_in(text: &str) -> Option<String> {
    let prefix = format!("/{PARENT}/");
    text.lines().find_map(|line| {
        // hierarchy-ID:controllers:path — the path may itself contain ':'.
        let mut fields = line.splitn(3, ':');
        let (_, _, path) = (fields.next()?, fields.next()?, fields.next()?);
        let rest = path.strip_prefix(&prefix).or_else(|| in_system_unit(path, &prefix))?;
        let name = rest.split('/').next()?;
        vgpu_store::state::is_plain_name(name).then(|| name.to_string())
    })
}

/// What follows `<unit>.service/vgpu/` or `<unit>.scope/vgpu/` in `path`, outside `/user.slice`.
fn in_system_unit<'a>(path: &'a str, prefix: &str) -> Option<&'a str> {
    if path.starts_with("/user.slice/") {
        return None;
    }
    let (unit_path, rest) = path.split_once(prefix)?;
    let unit = unit_path.rsplit('/').next()?;
    (unit.ends_with(".service") || unit.ends_with(".scope")).then_some(rest)
}

/// The workload cgroup of a running process; `Ok(None)`: in none; `Err`: it is gone.
pub fn workload_of_pid(pid: u32) -> std::io::Result<Option<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
    Ok(workload_in(&text))
}

#[cfg(test)]
mod tests {
    use super::workload_in;

    #[test]
    fn v1_hybrid_and_v2_lines() {
        let v1 = "12:freezer:/vgpu/a1b2c3d4\n11:memory:/vgpu/a1b2c3d4\n0::/user.slice\n";
        assert_eq!(workload_in(v1).as_deref(), Some("a1b2c3d4"));
        assert_eq!(workload_in("0::/vgpu/deadbeef\n").as_deref(), Some("deadbeef"));
        assert_eq!(workload_in("0::/vgpu/deadbeef/worker\n").as_deref(), Some("deadbeef"));
        assert_eq!(workload_in("5:cpu,cpuacct:/vgpu/x:y\n").as_deref(), Some("x:y"));
        // In a delegated unit's subtree (the delegated cgroup manager).
        assert_eq!(workload_in("0::/system.slice/vgpu@gpt.service/vgpu/ab12\n").as_deref(), Some("ab12"));
        assert_eq!(workload_in("4:memory:/system.slice/vgpu-ab12.scope/vgpu/ab12/w\n").as_deref(), Some("ab12"));
    }

    #[test]
    fn outside_vgpu_or_odd_names_are_none() {
        assert_eq!(workload_in("0::/user.slice/user-1000.slice/session-2.scope\n"), None);
        assert_eq!(workload_in("0::/vgpu\n"), None);
        assert_eq!(workload_in("0::/vgpu/\n"), None);
        assert_eq!(workload_in("0::/system.slice/vgpu/abc\n"), None, "only vgpu's own parent");
        assert_eq!(workload_in("0::/vgpu/..\n"), None);
        assert_eq!(workload_in("0::/user.slice/user-1000.slice/user@1000.service/app.slice/x.service/vgpu/abc\n"), None);
        assert_eq!(workload_in("0::/system.slice/x.service/vgpu/..\n"), None);
        assert_eq!(workload_in("garbage"), None);
        assert_eq!(workload_in(""), None);
    }
}
