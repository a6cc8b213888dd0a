//! The watch's effects for the memory and compute audits and processes in no vGPU: gather
//! each vGPU's figures from the snapshot and the shim's files, judge them (`audit::memory`,
//! `audit::compute`), signal the offenders (`audit::terminate`) and record why in the
//! workload's record (and clear a throttle from it when throttling ends).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use vgpu_abi::layout::USAGE_FILE;
use vgpu_abi::process::ProcessId;
use vgpu_abi::usage::{DeviceUsage, ProcessUsage, UsageFile};

use super::Event;
use crate::audit::compute::ProcessCompute;
use crate::audit::compute::VgpuCompute;
use crate::audit::memory::Breach;
use crate::audit::memory::ProcessMemory;
use crate::audit::memory::VgpuMemory;
use vgpu_gpu::snapshot::GpuProcessSample;
use vgpu_gpu::snapshot::GpuSample;
use vgpu_gpu::snapshot::Owner;
use vgpu_gpu::snapshot::Snapshot;
use vgpu_store::state::workload::ProcessIdRecord;
use vgpu_store::state::Enforcement;
use vgpu_store::state::EnforcementAction;
use vgpu_store::state::StateError;
use vgpu_store::state::Store;
use vgpu_store::state::StoreLock;
use vgpu_store::state::Workload;
use vgpu_store::state::WorkloadGpu;

/// How long recording an enforcement waits for the store lock before it is retried at the
/// next round.
const RECORD_WAIT: Duration = Duration::from_millis(500);

/// One vGPU as the audits see it: the workloads that use it and what its usage file says
/// (root reads every tenant's; the figures in it are the tenant's to write, so they only
/// explain and pick whom to blame).
pub struct VgpuFiles<'a> {
    vgpu: &'a str,
    members: Vec<&'a Workload>,
    cgroups: HashSet<&'a str>,
    devices: Vec<DeviceUsage>,
    shim: Vec<ProcessUsage>,
}

impl<'a> VgpuFiles<'a> {
    /// Every vGPU the workloads use, once: read once per round, for both audits.
    pub fn all(store: &Store, workloads: &'a [Workload]) -> Vec<VgpuFiles<'a>> {
        let mut vgpus: Vec<&str> = workloads.iter().map(|w| w.vgpu.as_str()).collect();
        vgpus.sort_unstable();
        vgpus.dedup();
        vgpus
            .into_iter()
            .map(|vgpu| {
                let members: Vec<&Workload> = workloads.iter().filter(|w| w.vgpu == vgpu).collect();
                let cgroups = members.iter().map(|w| w.cgroup.as_str()).collect();
                let usage = UsageFile::open(&store.vgpu_dir(vgpu).join(USAGE_FILE)).ok();
                let devices = usage.as_ref().map(|u| u.devices()).unwrap_or_default();
                let shim = usage.as_ref().map(|u| u.processes()).unwrap_or_default();
                VgpuFiles { vgpu, members, cgroups, devices, shim }
            })
            .collect()
    }

    /// Each device's compute limit and ledger, for the history.
    pub fn ledgers(&self) -> impl Iterator<Item = vgpu_history::tick::Ledger> + '_ {
        self.devices.iter().map(|d| vgpu_history::tick::Ledger {
            vgpu: self.vgpu.to_string(),
            gpu_uuid: d.uuid.clone(),
            compute_pct: d.compute_pct,
            charged_ns: d.charged_ns,
        })
    }

    /// Its device record for `gpu` in the usage file (the limits root wrote), if any.
    fn device(&self, gpu: &GpuSample) -> Option<(usize, &DeviceUsage)> {
        self.devices.iter().enumerate().find(|(_, d)| d.uuid == gpu.uuid)
    }

    /// Its slice of `gpu` in its workloads' records.
    fn recorded(&self, gpu: &GpuSample) -> Option<&WorkloadGpu> {
        self.members.iter().flat_map(|w| &w.gpus).find(|g| g.uuid == gpu.uuid)
    }

    /// Its processes on `gpu`, each with its per-process file's entry for that GPU's
    /// device record (None: no shim in it, or no such device).
    fn processes<'s>(&'s self, gpu: &'s GpuSample) -> impl Iterator<Item = (ProcessId, &'s GpuProcessSample, Option<(usize, &'s ProcessUsage)>)> + 's {
        let device = self.device(gpu).map(|(i, _)| i);
        gpu.processes.iter().filter(|p| matches!(&p.owner, Owner::Workload(c) if self.cgroups.contains(c.as_str()))).filter_map(move |p| {
            let process = p.process_id()?;
            let shim = device.and_then(|i| {
                self.shim.iter().find(|s| s.alive && s.pid == process.pid && s.start_time == process.start_time).map(|s| (i, s))
            });
            Some((process, p, shim))
        })
    }
}

/// Each vGPU's memory on each GPU where it has processes or a quota; `context_bytes` says
/// what one CUDA context takes on a GPU (each process's allowance there).
pub fn vgpu_memory(files: &[VgpuFiles<'_>], snapshot: &Snapshot, context_bytes: impl Fn(&GpuSample) -> u64) -> Vec<VgpuMemory> {
    let mut out = Vec::new();
    for v in files {
        for gpu in &snapshot.gpus {
            // The quota the shim enforces (root's limits file), else the record's.
            let quota = v.device(gpu).map(|(_, d)| d.quota_bytes).or(v.recorded(gpu).map(|g| g.mem_bytes));
            let processes: Vec<ProcessMemory> = v
                .processes(gpu)
                .map(|(process, p, shim)| ProcessMemory {
                    process,
                    driver_bytes: p.memory_bytes.unwrap_or(0),
                    shim_bytes: shim.and_then(|(i, s)| s.used_bytes.get(i).copied()),
                })
                .collect();
            if quota.is_none() && processes.is_empty() {
                continue;
            }
            out.push(VgpuMemory {
                vgpu: v.vgpu.to_string(),
                gpu_index: gpu.index,
                gpu_uuid: gpu.uuid.clone(),
                quota: quota.unwrap_or(0),
                in_vgpu: quota.is_some(),
                context_bytes: context_bytes(gpu),
                processes,
            });
        }
    }
    out
}

/// Each vGPU's compute on each GPU of it: its share there (the limits file's, else the
/// record's), its ledger's measured share, and its processes' NVML utilization and the GPU
/// time the shim charged to each. And on each GPU outside it where its processes are: a
/// share of 0 there.
pub fn vgpu_compute(files: &[VgpuFiles<'_>], snapshot: &Snapshot) -> Vec<VgpuCompute> {
    let mut out = Vec::new();
    for v in files {
        for gpu in &snapshot.gpus {
            let device = v.device(gpu).map(|(_, d)| d);
            let share = device.map(|d| d.compute_pct).or(v.recorded(gpu).map(|g| g.compute_pct));
            if share.is_none() && v.processes(gpu).next().is_none() {
                continue;
            }
            let processes = v
                .processes(gpu)
                .map(|(process, p, shim)| ProcessCompute {
                    process,
                    driver_pct: p.sm_util_pct.unwrap_or(0),
                    shim_ns: shim.and_then(|(i, s)| s.compute_ns.get(i).copied()),
                })
                .collect();
            out.push(VgpuCompute {
                vgpu: v.vgpu.to_string(),
                gpu_index: gpu.index,
                gpu_uuid: gpu.uuid.clone(),
                share_pct: share.unwrap_or(0),
                in_vgpu: share.is_some(),
                ledger_ppm: device.and_then(|d| d.measured_share_ppm),
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

/// A change to a record, pending.
#[derive(Debug)]
enum Change {
    Set(Enforcement),
    /// Remove a throttle that this watch (`by`) recorded; anything else stays.
    ClearThrottle(ProcessIdRecord),
}

/// Enforcements decided but not yet written into their records (the lock was busy).
#[derive(Debug, Default)]
pub struct Records {
    pending: Vec<(String, Change)>,
}

impl Records {
    /// Note `e` for workload `id`; written at [`Records::flush`]. A throttle cancels a
    /// pending [`Records::clear_throttle`] of the same workload.
    pub fn add(&mut self, id: &str, e: Enforcement) {
        if e.action == EnforcementAction::Throttled {
            self.pending.retain(|(i, c)| !(i == id && matches!(c, Change::ClearThrottle(_))));
        }
        let same = self.pending.iter_mut().find_map(|(i, c)| match c {
            Change::Set(p) if i == id && p.action == e.action => Some(p),
            _ => None,
        });
        match same {
            Some(p) => merge(p, &e),
            None => self.pending.push((id.to_string(), Change::Set(e))),
        }
    }

    /// Note that workload `id` is no longer throttled by the watch `by`: its record's
    /// throttle is removed at [`Records::flush`] (a kill recorded since stays), and a
    /// pending throttle of it is dropped.
    pub fn clear_throttle(&mut self, id: &str, by: ProcessId) {
        self.pending.retain(|(i, c)| !(i == id && matches!(c, Change::Set(e) if e.action == EnforcementAction::Throttled)));
        if !self.pending.iter().any(|(i, c)| i == id && matches!(c, Change::ClearThrottle(_))) {
            self.pending.push((id.to_string(), Change::ClearThrottle(by.into())));
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
        self.flush_locked(store, &lock, events);
    }

    /// [`Records::flush`] by a caller that holds the store lock.
    pub fn flush_locked(&mut self, store: &Store, _lock: &StoreLock, events: &mut Vec<Event>) {
        self.pending.retain(|(id, change)| match write(store, id, change) {
            Ok(()) => false,
            Err(StateError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => false,
            Err(err) => {
                events.push(Event::warn(format!("cannot record what was done to workload {id}: {err}")));
                false
            }
        });
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

/// Set (or extend) the enforcement in workload `id`'s record, or clear a throttle from it.
/// Call with the store lock.
fn write(store: &Store, id: &str, change: &Change) -> Result<(), StateError> {
    let mut w = Workload::read(&store.workload_path(id))?;
    match (change, &mut w.enforcement) {
        (Change::Set(e), Some(have)) if have.action == e.action => merge(have, e),
        // An end outranks a kill, which outranks a throttle.
        (Change::Set(e), Some(have)) if have.action.rank() > e.action.rank() => return Ok(()),
        (Change::Set(e), slot) => *slot = Some(e.clone()),
        (Change::ClearThrottle(by), slot) if slot.as_ref().is_some_and(|e| is_throttle_by(e, *by)) => *slot = None,
        (Change::ClearThrottle(_), _) => return Ok(()),
    }
    store.write_workload(&w)
}

/// Whether `e` is a throttle recorded by the watch `by`.
pub fn is_throttle_by(e: &Enforcement, by: ProcessIdRecord) -> bool {
    e.action == EnforcementAction::Throttled && e.by == by
}

/// Remove every throttle the watch `me` recorded (it stops), waiting at most `wait` for the
/// store lock. Returns the workloads cleared.
pub fn clear_all_throttles(store: &Store, me: ProcessId, wait: Duration) -> Result<Vec<Workload>, StateError> {
    let _lock = store.lock_within(wait)?;
    let (workloads, _) = store.workloads();
    let mut cleared = Vec::new();
    for mut w in workloads {
        if w.enforcement.as_ref().is_some_and(|e| is_throttle_by(e, me.into())) {
            w.enforcement = None;
            store.write_workload(&w)?;
            cleared.push(w);
        }
    }
    Ok(cleared)
}

/// The enforcement to record for a breach's processes of one workload.
pub fn killed(me: ProcessId, reason: &str, pids: Vec<u32>) -> Enforcement {
    Enforcement {
        action: EnforcementAction::Killed,
        reason: reason.to_string(),
        pids,
        by: me.into(),
        since_unix_ms: vgpu_store::clock::now_ms(),
    }
}

/// The enforcement to record for a workload ended whole at its second offence.
pub fn ended(me: ProcessId, reason: &str, pids: Vec<u32>) -> Enforcement {
    Enforcement { action: EnforcementAction::Ended, ..killed(me, reason, pids) }
}

/// The enforcement to record for a workload whose freezer this watch duty-cycles.
pub fn throttled(me: ProcessId, reason: &str, pids: Vec<u32>) -> Enforcement {
    Enforcement { action: EnforcementAction::Throttled, ..killed(me, reason, pids) }
}

/// The offenders of `breach`, grouped by the workload they belong to.
pub fn by_workload(breach: &Breach, owners: &HashMap<u32, String>) -> Vec<(String, Vec<ProcessId>)> {
    by_owner(&breach.offenders, owners)
}

/// `offenders` grouped by the workload they belong to.
pub fn by_owner(offenders: &[ProcessId], owners: &HashMap<u32, String>) -> Vec<(String, Vec<ProcessId>)> {
    let mut out: Vec<(String, Vec<ProcessId>)> = Vec::new();
    for p in offenders {
        let Some(id) = owners.get(&p.pid) else { continue };
        match out.iter_mut().find(|(i, _)| i == id) {
            Some((_, list)) => list.push(*p),
            None => out.push((id.clone(), vec![*p])),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_store::state::workload::tests::sample;

    fn store() -> (tempfile::TempDir, Store) {
        let (dir, store) = vgpu_store::state::temp_store();
        store.write_workload(&sample()).unwrap();
        (dir, store)
    }

    fn recorded(store: &Store) -> Option<EnforcementAction> {
        Workload::read(&store.workload_path(&sample().id)).unwrap().enforcement.map(|e| e.action)
    }

    #[test]
    fn a_throttle_is_recorded_and_cleared_and_a_kill_outranks_it() {
        let (_dir, store) = store();
        let me = ProcessId::current().unwrap();
        let id = sample().id;
        let mut records = Records::default();
        let mut events = Vec::new();
        records.add(&id, throttled(me, "GPU 0 at 97% by the driver", vec![7]));
        records.flush(&store, &mut events);
        assert_eq!(recorded(&store), Some(EnforcementAction::Throttled));
        // Another watch's clear does not touch it; this one's does.
        records.clear_throttle(&id, ProcessId { start_time: me.start_time + 1, ..me });
        records.flush(&store, &mut events);
        assert_eq!(recorded(&store), Some(EnforcementAction::Throttled));
        records.clear_throttle(&id, me);
        records.flush(&store, &mut events);
        assert_eq!(recorded(&store), None);
        // A clear then a throttle in one round: throttled; a throttle then a clear: not.
        records.clear_throttle(&id, me);
        records.add(&id, throttled(me, "r", vec![7]));
        records.flush(&store, &mut events);
        assert_eq!(recorded(&store), Some(EnforcementAction::Throttled));
        records.add(&id, throttled(me, "r", vec![7]));
        records.clear_throttle(&id, me);
        records.flush(&store, &mut events);
        assert_eq!(recorded(&store), None);
        // An escalation: the kill stays whatever the order.
        records.add(&id, throttled(me, "r", vec![7]));
        records.flush(&store, &mut events);
        records.add(&id, killed(me, "throttling did not bring it down", vec![7]));
        records.clear_throttle(&id, me);
        records.flush(&store, &mut events);
        assert_eq!(recorded(&store), Some(EnforcementAction::Killed));
        assert!(events.is_empty(), "{events:?}");
    }

    #[test]
    fn stopping_clears_only_this_watchs_throttles() {
        let (_dir, store) = store();
        let me = ProcessId::current().unwrap();
        let mut other = sample();
        other.id = "e5f6a7b8".into();
        other.cgroup = other.id.clone();
        other.vgpu = other.id.clone();
        other.enforcement = Some(killed(me, "over memory quota", vec![1]));
        store.write_workload(&other).unwrap();
        let mut records = Records::default();
        records.add(&sample().id, throttled(me, "r", vec![7]));
        records.flush(&store, &mut Vec::new());
        let cleared = clear_all_throttles(&store, me, Duration::from_secs(1)).unwrap();
        assert_eq!(cleared.iter().map(|w| w.id.as_str()).collect::<Vec<_>>(), [sample().id.as_str()]);
        assert_eq!(recorded(&store), None);
        assert!(Workload::read(&store.workload_path("e5f6a7b8")).unwrap().enforcement.is_some(), "a kill stays");
    }
}
