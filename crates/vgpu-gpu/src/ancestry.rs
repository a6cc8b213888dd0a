//! A process's ancestors, from `/proc/PID/stat`: which workload supervisor (a Slurm step's
//! slurmstepd) a process descends from, for the workloads whose processes are in no cgroup
//! of vgpu's (`Snapshot::adopt_descendants`).

use vgpu_abi::process::ProcessId;

/// How many ancestors are looked at, at most (a loop in a racing /proc cannot hang it).
const MAX_DEPTH: usize = 64;

/// The parent pid of `pid` (field 4 of `/proc/PID/stat`, after the command's last `)`).
pub fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(stat.get(close + 1..)?).ok()?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The workload cgroup of the first supervisor in `steps` that `pid` descends from (the
/// supervisor's identity checked by its start time, so a recycled pid is no ancestor).
pub fn descends_from(pid: u32, steps: &[(ProcessId, String)]) -> Option<&str> {
    let mut at = pid;
    for _ in 0..MAX_DEPTH {
        let parent = parent_of(at)?;
        if parent <= 1 {
            return None;
        }
        if let Some((_, cgroup)) = steps.iter().find(|(s, _)| s.pid == parent && s.is_alive()) {
            return Some(cgroup);
        }
        at = parent;
    }
    None
}

/// The live processes that descend from `supervisor`, by pid (a scan of `/proc`).
pub fn descendants_of(supervisor: ProcessId) -> Vec<u32> {
    if !supervisor.is_alive() {
        return Vec::new();
    }
    let steps = [(supervisor, String::new())];
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .filter(|&pid| descends_from(pid, &steps).is_some())
        .collect();
    pids.sort_unstable();
    pids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_descends_from_this_process_and_not_from_another() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().expect("sleep");
        let me = ProcessId::current().expect("this process");
        assert_eq!(parent_of(child.id()), Some(me.pid));
        let steps = vec![(me, "w1".to_string())];
        assert_eq!(descends_from(child.id(), &steps), Some("w1"));
        let recycled = vec![(ProcessId { pid: me.pid, start_time: me.start_time + 1 }, "w1".to_string())];
        assert_eq!(descends_from(child.id(), &recycled), None, "a pid with another start time is another process");
        assert_eq!(descends_from(me.pid, &steps), None, "not its own descendant");
        assert!(descendants_of(me).contains(&child.id()));
        let _ = child.kill();
        let _ = child.wait();
    }
}
