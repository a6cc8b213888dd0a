//! The watch's effects for the memory audit and processes in no vGPU: gather each vGPU's
//! figures from the snapshot and the shim's files, judge them (`audit::memory`), signal the
//! offenders (`audit::terminate`) and record why in the workload's record.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use vgpu_abi::layout::USAGE_FILE;
use vgpu_abi::process::ProcessId;
use vgpu_abi::usage::UsageFile;

use super::Event;
use crate::audit::memory::{Breach, ProcessMemory, VgpuMemory};
use crate::audit::{Owner, Snapshot};
use crate::state::{Enforcement, EnforcementAction, StateError, Store, Workload};

/// How long recording an enforcement waits for the store lock before it is retried at the
/// next round.
const RECORD_WAIT: Duration = Duration::from_millis(500);

/// Each vGPU's memory on each GPU where it has processes or a quota.
pub fn vgpu_memory(store: &Store, workloads: &[Workload], snapshot: &Snapshot) -> Vec<VgpuMemory> {
    let mut vgpus: Vec<&str> = workloads.iter().map(|w| w.vgpu.as_str()).collect();
    vgpus.sort_unstable();
    vgpus.dedup();
    let mut out = Vec::new();
    for vgpu in vgpus {
        let members: Vec<&Workload> = workloads.iter().filter(|w| w.vgpu == vgpu).collect();
        let cgroups: HashSet<&str> = members.iter().map(|w| w.cgroup.as_str()).collect();
        let usage = UsageFile::open(&store.vgpu_dir(vgpu).join(USAGE_FILE)).ok();
        let devices = usage.as_ref().map(|u| u.devices()).unwrap_or_default();
        let shim_processes = usage.as_ref().map(|u| u.processes()).unwrap_or_default();
        for gpu in &snapshot.gpus {
            let record_quota = members.iter().flat_map(|w| &w.gpus).find(|g| g.uuid == gpu.uuid).map(|g| g.mem_bytes);
            let device = devices.iter().position(|d| d.uuid == gpu.uuid);
            // The quota the shim enforces (root's limits file), else the record's.
            let quota = device.map(|i| devices[i].quota_bytes).or(record_quota);
            let processes: Vec<ProcessMemory> = gpu
                .processes
                .iter()
                .filter(|p| matches!(&p.owner, Owner::Workload(c) if cgroups.contains(c.as_str())))
                .filter_map(|p| {
                    let process = p.process_id()?;
                    let shim_bytes = device.and_then(|i| {
                        shim_processes
                            .iter()
                            .find(|s| s.alive && s.pid == process.pid && s.start_time == process.start_time)
                            .and_then(|s| s.used_bytes.get(i).copied())
                    });
                    Some(ProcessMemory { process, driver_bytes: p.memory_bytes.unwrap_or(0), shim_bytes })
                })
                .collect();
            if quota.is_none() && processes.is_empty() {
                continue;
            }
            out.push(VgpuMemory {
                vgpu: vgpu.to_string(),
                gpu_index: gpu.index,
                gpu_uuid: gpu.uuid.clone(),
                quota: quota.unwrap_or(0),
                in_vgpu: quota.is_some(),
                processes,
            });
        }
    }
    out
}

/// The workload (cgroup = id) each GPU process of the snapshot belongs to.
pub fn owners(snapshot: &Snapshot) -> HashMap<u32, String> {
    snapshot
        .gpus
        .iter()
        .flat_map(|g| &g.processes)
        .filter_map(|p| match &p.owner {
            Owner::Workload(c) => Some((p.pid, c.clone())),
            _ => None,
        })
        .collect()
}

/// "workload train (a1b2c3d4)".
pub fn whose(workloads: &[Workload], id: &str) -> String {
    match workloads.iter().find(|w| w.id == id) {
        Some(w) => format!("workload {} ({})", w.name, w.id),
        None => format!("workload {id}"),
    }
}

/// Enforcements decided but not yet written into their records (the lock was busy).
#[derive(Debug, Default)]
pub struct Records {
    pending: Vec<(String, Enforcement)>,
}

impl Records {
    /// Note `e` for workload `id`; written at [`Records::flush`].
    pub fn add(&mut self, id: &str, e: Enforcement) {
        match self.pending.iter_mut().find(|(i, p)| i == id && p.action == e.action) {
            Some((_, p)) => merge(p, &e),
            None => self.pending.push((id.to_string(), e)),
        }
    }

    /// Write what is pending into the records, under the store lock; keep what could not
    /// be written for the next round.
    pub fn flush(&mut self, store: &Store, events: &mut Vec<Event>) {
        if self.pending.is_empty() {
            return;
        }
        let lock = match store.lock_within(RECORD_WAIT) {
            Ok(lock) => lock,
            Err(e) => {
                events.push(Event::debug(format!("enforcement records wait for the next round: {e}")));
                return;
            }
        };
        self.pending.retain(|(id, e)| match write(store, id, e) {
            Ok(()) => false,
            Err(StateError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => false,
            Err(err) => {
                events.push(Event::warn(format!("cannot record what was done to workload {id}: {err}")));
                false
            }
        });
        drop(lock);
    }
}

fn merge(into: &mut Enforcement, e: &Enforcement) {
    for pid in &e.pids {
        if !into.pids.contains(pid) {
            into.pids.push(*pid);
        }
    }
    into.reason.clone_from(&e.reason);
}

/// Set (or extend) the enforcement in workload `id`'s record. Call with the store lock.
fn write(store: &Store, id: &str, e: &Enforcement) -> Result<(), StateError> {
    let mut w = Workload::read(&store.workload_path(id))?;
    match &mut w.enforcement {
        Some(have) if have.action == e.action => merge(have, e),
        // A kill outranks a throttle.
        Some(have) if have.action == EnforcementAction::Killed => return Ok(()),
        slot => *slot = Some(e.clone()),
    }
    store.write_workload(&w)
}

/// The enforcement to record for a breach's processes of one workload.
pub fn killed(me: ProcessId, reason: &str, pids: Vec<u32>) -> Enforcement {
    Enforcement {
        action: EnforcementAction::Killed,
        reason: reason.to_string(),
        pids,
        by: me.into(),
        since_unix_ms: crate::commands::run::now_ms(),
    }
}

/// The offenders of `breach`, grouped by the workload they belong to.
pub fn by_workload(breach: &Breach, owners: &HashMap<u32, String>) -> Vec<(String, Vec<ProcessId>)> {
    let mut out: Vec<(String, Vec<ProcessId>)> = Vec::new();
    for p in &breach.offenders {
        let Some(id) = owners.get(&p.pid) else { continue };
        match out.iter_mut().find(|(i, _)| i == id) {
            Some((_, list)) => list.push(*p),
            None => out.push((id.clone(), vec![*p])),
        }
    }
    out
}
