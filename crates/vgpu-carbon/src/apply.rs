//! Turning a plan into caps through NVML, and undoing them.
//!
//! * A GPU planned below its maximum clock gets locked graphics clocks
//!   `nvmlDeviceSetGpuLockedClocks(lowest supported, planned)`: a cap, the driver may still
//!   go lower. Where locking is not supported, the power limit is set to the planned power
//!   instead (clamped to the device's range). A GPU planned at its maximum is uncapped.
//! * Persistence mode is enabled where it is off: without it the driver tears the device
//!   down when its last client exits and forgets the cap.
//! * Idempotent: what to write is a pure function ([`decide`]) of what the device reports,
//!   the target, and what vgpu set last time. NVML cannot read locked clocks back, so the
//!   last cap is remembered per GPU UUID in `<state_dir>/carbon-applied.json` (under /run:
//!   gone after a reboot, like the caps) and trusted only while persistence mode is on.
//!   The power limit and persistence mode are read back from the device.
//! * One GPU's failure does not stop the others; each outcome says what happened.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use nvml_wrapper::enum_wrappers::device::Clock;
use nvml_wrapper::enums::device::GpuLockedClocksSetting;
use nvml_wrapper::error::NvmlError;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::config::CarbonConfig;
use super::model::{self, GpuModel, ModelError, Tunables};
use super::planner::{ClockPlan, GpuPlan};
use vgpu_gpu::explain;
use vgpu_gpu::Nvml;

pub const APPLIED_FILE: &str = "carbon-applied.json";

/// What can be read back from a device.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceState {
    pub index: u32,
    pub uuid: String,
    /// `None`: the device cannot report it (not supported).
    pub persistence: Option<bool>,
    pub power_limit_mw: Option<u32>,
    pub default_power_limit_mw: Option<u32>,
    pub power_limit_range_mw: Option<(u32, u32)>,
}

/// A cap vgpu has set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Cap {
    /// Clocks unlocked (and any power limit vgpu had set restored).
    Uncapped,
    LockedClocks {
        min_mhz: u32,
        max_mhz: u32,
    },
    PowerLimit {
        mw: u32,
    },
}

/// What vgpu set on one GPU last time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    pub uuid: String,
    pub cap: Cap,
    /// The device refused clock locking as not supported: caps go through the power limit.
    #[serde(default)]
    pub locking_unsupported: bool,
}

/// The planned setting of one GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Target {
    pub clock_mhz: u32,
    pub min_clock_mhz: u32,
    pub max_clock_mhz: u32,
    pub power_w: f64,
}

impl From<&GpuPlan> for Target {
    fn from(gpu: &GpuPlan) -> Target {
        Target {
            clock_mhz: gpu.clock_mhz,
            min_clock_mhz: gpu.min_clock_mhz,
            max_clock_mhz: gpu.max_clock_mhz,
            power_w: gpu.power_w,
        }
    }
}

/// One NVML write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Write {
    EnablePersistence,
    LockClocks { min_mhz: u32, max_mhz: u32 },
    ResetClocks,
    SetPowerLimit { mw: u32 },
}

impl std::fmt::Display for Write {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Write::EnablePersistence => write!(f, "persistence mode on"),
            Write::LockClocks { min_mhz, max_mhz } => write!(f, "clocks locked {min_mhz}–{max_mhz} MHz"),
            Write::ResetClocks => write!(f, "clocks unlocked"),
            Write::SetPowerLimit { mw } => write!(f, "power limit {} W", mw / 1000),
        }
    }
}

/// Power limits within this of each other are the same setting (drivers round to watts).
const POWER_LIMIT_SLACK_MW: u32 = 1000;

/// The cap a target asks for on a device.
pub fn wanted_cap(state: &DeviceState, target: &Target, locking_unsupported: bool) -> Cap {
    if target.clock_mhz >= target.max_clock_mhz {
        Cap::Uncapped
    } else if !locking_unsupported {
        Cap::LockedClocks { min_mhz: target.min_clock_mhz, max_mhz: target.clock_mhz }
    } else {
        Cap::PowerLimit { mw: power_limit_mw(state, target.power_w) }
    }
}

/// The planned power as a power limit the device accepts.
pub fn power_limit_mw(state: &DeviceState, watts: f64) -> u32 {
    let mw = (watts * 1000.0).round().clamp(0.0, f64::from(u32::MAX)) as u32;
    match state.power_limit_range_mw {
        Some((lo, hi)) => mw.clamp(lo, hi.max(lo)),
        None => mw,
    }
}

/// The writes that take `state` to `target`, given what vgpu set last time (`applied`, for
/// this GPU). Pure; an identical second call after the writes succeeded decides nothing.
pub fn decide(state: &DeviceState, target: &Target, applied: Option<&Applied>) -> Vec<Write> {
    let applied = applied.filter(|a| a.uuid == state.uuid);
    let locking_unsupported = applied.is_some_and(|a| a.locking_unsupported);
    let want = wanted_cap(state, target, locking_unsupported);
    let mut writes = Vec::new();
    if state.persistence == Some(false) {
        writes.push(Write::EnablePersistence);
    }
    // Locked clocks cannot be read back: the remembered cap counts only while persistence
    // mode was on, so the driver cannot have dropped it since.
    let known = applied.filter(|_| state.persistence == Some(true)).map(|a| a.cap);
    match want {
        Cap::LockedClocks { min_mhz, max_mhz } => {
            if known != Some(want) {
                writes.push(Write::LockClocks { min_mhz, max_mhz });
            }
        }
        Cap::Uncapped | Cap::PowerLimit { .. } => {
            let maybe_locked = !matches!(known, Some(Cap::Uncapped | Cap::PowerLimit { .. }));
            if maybe_locked && !locking_unsupported {
                writes.push(Write::ResetClocks);
            }
        }
    }
    let limit = match want {
        Cap::PowerLimit { mw } => Some(mw),
        // Only a limit vgpu set is undone: an administrator's own limit is left alone.
        _ if matches!(applied.map(|a| a.cap), Some(Cap::PowerLimit { .. })) => state.default_power_limit_mw,
        _ => None,
    };
    if let Some(mw) = limit {
        if state.power_limit_mw.is_none_or(|cur| cur.abs_diff(mw) >= POWER_LIMIT_SLACK_MW) {
            writes.push(Write::SetPowerLimit { mw });
        }
    }
    writes
}

/// The writes `reset` makes: unlock clocks, restore the default power limit.
pub fn decide_reset(state: &DeviceState, applied: Option<&Applied>) -> Vec<Write> {
    let mut writes = Vec::new();
    if !applied.is_some_and(|a| a.uuid == state.uuid && a.locking_unsupported) {
        writes.push(Write::ResetClocks);
    }
    if let (Some(cur), Some(default)) = (state.power_limit_mw, state.default_power_limit_mw) {
        if cur.abs_diff(default) >= POWER_LIMIT_SLACK_MW {
            writes.push(Write::SetPowerLimit { mw: default });
        }
    }
    writes
}

/// The writes a device can take (NVML; a recorder in tests).
pub trait Control {
    fn write(&mut self, write: Write) -> Result<(), NvmlError>;
}

impl Control for nvml_wrapper::Device<'_> {
    fn write(&mut self, write: Write) -> Result<(), NvmlError> {
        match write {
            Write::EnablePersistence => self.set_persistent(true),
            Write::LockClocks { min_mhz, max_mhz } => self.set_gpu_locked_clocks(GpuLockedClocksSetting::Numeric {
                min_clock_mhz: min_mhz,
                max_clock_mhz: max_mhz,
            }),
            Write::ResetClocks => self.reset_gpu_locked_clocks(),
            Write::SetPowerLimit { mw } => self.set_power_management_limit(mw),
        }
    }
}

/// What happened on one GPU; also its line in the decision log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuOutcome {
    pub index: u32,
    pub uuid: String,
    pub workload: Option<String>,
    pub clock_mhz: u32,
    pub max_clock_mhz: u32,
    /// Predicted power, watts, and emission rate, gCO2/h (apply only).
    pub power_w: Option<f64>,
    pub g_per_hour: Option<f64>,
    /// The cap in force after this run, as far as vgpu knows.
    pub cap: Option<Cap>,
    /// The NVML writes made (empty: nothing needed changing).
    pub writes: Vec<Write>,
    /// Things worth saying that are not failures.
    pub notes: Vec<String>,
    /// Why the GPU could not be set, in one line.
    pub error: Option<String>,
}

/// Carry out the writes for one GPU, falling back to the power limit where clock locking
/// is not supported. Returns the outcome's writes, notes and error, and the record to keep.
pub fn execute(
    control: &mut dyn Control,
    state: &DeviceState,
    target: &Target,
    applied: Option<&Applied>,
) -> (Execution, Option<Applied>) {
    let applied = applied.filter(|a| a.uuid == state.uuid);
    let mut run = Execution::default();
    let mut locking_unsupported = applied.is_some_and(|a| a.locking_unsupported);
    for write in decide(state, target, applied) {
        match control.write(write) {
            Ok(()) => run.writes.push(write),
            Err(NvmlError::NotSupported) if write == Write::EnablePersistence => run.notes.push(
                "persistence mode is not supported: the driver may forget the cap when no process uses the GPU".into(),
            ),
            Err(NvmlError::NotSupported) if write == Write::ResetClocks => locking_unsupported = true,
            Err(NvmlError::NotSupported) if matches!(write, Write::LockClocks { .. }) => {
                locking_unsupported = true;
                let note = "clock locking is not supported: capping through the power limit";
                let mw = power_limit_mw(state, target.power_w);
                if state.power_limit_mw.is_some_and(|cur| cur.abs_diff(mw) < POWER_LIMIT_SLACK_MW) {
                    run.notes.push(note.into());
                    continue;
                }
                let fallback = Write::SetPowerLimit { mw };
                match control.write(fallback) {
                    Ok(()) => {
                        run.writes.push(fallback);
                        run.notes.push(note.into());
                    }
                    Err(e) => {
                        run.error = Some(format!(
                            "cannot lock clocks (not supported) nor set the power limit: {}",
                            explain(&e)
                        ));
                        break;
                    }
                }
            }
            Err(e) => {
                run.error = Some(format!("{}: {}", failed_action(write), explain(&e)));
                break;
            }
        }
    }
    if run.error.is_some() {
        // The device is in an unknown state: forget the record so the next run writes again.
        return (run, None);
    }
    let cap = wanted_cap(state, target, locking_unsupported);
    run.cap = Some(cap);
    (run, Some(Applied { uuid: state.uuid.clone(), cap, locking_unsupported }))
}

/// Carry out `reset` on one GPU.
pub fn execute_reset(control: &mut dyn Control, state: &DeviceState, applied: Option<&Applied>) -> Execution {
    let mut run = Execution::default();
    for write in decide_reset(state, applied) {
        match control.write(write) {
            Ok(()) => run.writes.push(write),
            Err(NvmlError::NotSupported) if write == Write::ResetClocks => {}
            Err(e) => {
                run.error = Some(format!("{}: {}", failed_action(write), explain(&e)));
                return run;
            }
        }
    }
    run.cap = Some(Cap::Uncapped);
    run
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Execution {
    pub writes: Vec<Write>,
    pub notes: Vec<String>,
    pub error: Option<String>,
    pub cap: Option<Cap>,
}

fn failed_action(write: Write) -> &'static str {
    match write {
        Write::EnablePersistence => "cannot enable persistence mode",
        Write::LockClocks { .. } => "cannot lock clocks",
        Write::ResetClocks => "cannot unlock clocks",
        Write::SetPowerLimit { .. } => "cannot set the power limit",
    }
}

// ---- the remembered caps ----

#[derive(Debug, Error)]
pub enum ApplyError {
    #[error("cannot read {}: {source}", .path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cannot write {}: {source}", .path.display())]
    Write { path: PathBuf, source: std::io::Error },
    #[error("GPU {index}: {what}: {}", explain(.source))]
    Nvml { index: u32, what: &'static str, source: NvmlError },
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("GPU {0}: NVML reports no power limits; set [carbon] power_max_w")]
    NoPower(u32),
    /// Another `apply` or `reset` held the lock past the deadline (named in the message).
    #[error(transparent)]
    Busy(#[from] vgpu_store::state::StateError),
}

/// `<state_dir>/carbon-applied.json`: the caps vgpu set, by GPU UUID.
pub struct AppliedStore {
    path: PathBuf,
}

impl AppliedStore {
    pub fn new(path: impl Into<PathBuf>) -> AppliedStore {
        AppliedStore { path: path.into() }
    }

    /// The records; a missing or damaged file means none (the next apply writes again).
    pub fn load(&self) -> Vec<Applied> {
        match std::fs::read_to_string(&self.path) {
            Ok(text) => serde_json::from_str(&text).unwrap_or_else(|e| {
                tracing::warn!("ignoring damaged {}: {e}", self.path.display());
                Vec::new()
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                tracing::warn!("cannot read {}: {e}", self.path.display());
                Vec::new()
            }
        }
    }

    /// Serialise appliers (the timer and a person at the same moment): the store's kind of
    /// lock ([`vgpu_store::state::StoreLock`]: an exclusive `flock` beside the file, mode 0600,
    /// never opened through a link, dropped by the kernel when the holder dies) and like it
    /// never waited for forever: past the deadline, an error naming the holder's pid and
    /// command. `None` when the lock file cannot be made (e.g. not root: nothing will be
    /// written anyway).
    pub fn lock(&self) -> Result<Option<vgpu_store::state::StoreLock>, vgpu_store::state::StateError> {
        let path = self.path.with_extension("lock");
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if let Err(e) = crate::create_dir(dir) {
                tracing::debug!("no lock {}: {e}", path.display());
                return Ok(None);
            }
        }
        match vgpu_store::state::StoreLock::acquire(&path) {
            Ok(lock) => Ok(Some(lock)),
            Err(vgpu_store::state::StateError::Io { source, .. }) if source.kind() == std::io::ErrorKind::PermissionDenied => {
                tracing::debug!("no lock {}: {source}", path.display());
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    pub fn save(&self, records: &[Applied]) -> Result<(), ApplyError> {
        let err = |source| ApplyError::Write { path: self.path.clone(), source };
        let dir = self.path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        crate::create_dir(dir).map_err(err)?;
        let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(err)?;
        let text = serde_json::to_string_pretty(records).map_err(|e| err(e.into()))?;
        tmp.write_all(text.as_bytes()).map_err(err)?;
        tmp.persist(&self.path).map_err(|e| err(e.error))?;
        Ok(())
    }
}

// ---- reading devices through NVML ----

/// One GPU as apply and the planner need it.
#[derive(Debug, Clone)]
pub struct CarbonGpu {
    pub state: DeviceState,
    pub model: GpuModel,
    pub name: String,
    /// PIDs of its compute processes.
    pub pids: Vec<u32>,
    /// Where `model`'s power figures come from.
    pub model_source: ModelSource,
}

/// Where a GPU's power model comes from (`vgpu carbon plan` says it).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "source", rename_all = "kebab-case")]
pub enum ModelSource {
    /// The defaults (and whatever `[carbon]` overrides).
    Default,
    /// `[carbon] power_idle_w`, `power_max_w` and `gamma` all set.
    Config,
    /// `vgpu carbon profile`'s fit of GPU `gpu_uuid` (this one's, or one of the same name),
    /// with `overrides`: the `[carbon]` keys that still win over it.
    Measured { gpu_uuid: String, measured_ms: i64, overrides: Vec<&'static str> },
}

impl std::fmt::Display for ModelSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ModelSource::Default => f.write_str("default"),
            ModelSource::Config => f.write_str("config"),
            ModelSource::Measured { gpu_uuid, measured_ms, overrides } => {
                let day = chrono::DateTime::from_timestamp_millis(*measured_ms)
                    .map(|t| t.format("%Y-%m-%d").to_string())
                    .unwrap_or_else(|| "?".into());
                write!(f, "measured {day} on {gpu_uuid}")?;
                if !overrides.is_empty() {
                    write!(f, " ([carbon] {} override)", overrides.join(", "))?;
                }
                Ok(())
            }
        }
    }
}

/// Read every GPU: state, model inputs, processes.
pub fn read_devices(nvml: &Nvml, config: &CarbonConfig, tunables: &Tunables) -> Result<Vec<CarbonGpu>, ApplyError> {
    let count = nvml.count().map_err(|source| ApplyError::Nvml { index: 0, what: "cannot count GPUs", source })?;
    (0..count).map(|index| read_device(nvml, index, config, tunables)).collect()
}

fn read_device(nvml: &Nvml, index: u32, config: &CarbonConfig, tunables: &Tunables) -> Result<CarbonGpu, ApplyError> {
    let nvml_err = |what| move |source| ApplyError::Nvml { index, what, source };
    let device = nvml.device(index).map_err(nvml_err("cannot open"))?;
    let uuid = device.uuid().map_err(nvml_err("cannot read the UUID"))?;
    let name = device.name().unwrap_or_default();
    let state = DeviceState {
        index,
        uuid,
        persistence: device.is_in_persistent_mode().ok(),
        power_limit_mw: device.power_management_limit().ok(),
        default_power_limit_mw: device.power_management_limit_default().ok(),
        power_limit_range_mw: device.power_management_limit_constraints().ok().map(|c| (c.min_limit, c.max_limit)),
    };
    let clocks = supported_clocks(&device).map_err(nvml_err("cannot read the supported clocks"))?;
    let max_w = config
        .power_max_w
        .or(state.default_power_limit_mw.map(milliwatts))
        .or(device.enforced_power_limit().ok().map(milliwatts))
        .ok_or(ApplyError::NoPower(index))?;
    let idle_w = config.power_idle_w.unwrap_or(max_w * model::DEFAULT_IDLE_FRACTION).min(max_w);
    let model = GpuModel::new(index, clocks, idle_w, max_w, tunables.gamma)?;
    let pids = device.running_compute_processes().map(|ps| ps.into_iter().map(|p| p.pid).collect()).unwrap_or_default();
    let all_set = config.power_idle_w.is_some() && config.power_max_w.is_some() && config.gamma.is_some();
    let model_source = if all_set { ModelSource::Config } else { ModelSource::Default };
    Ok(CarbonGpu { state, model, name, pids, model_source })
}

fn milliwatts(mw: u32) -> f64 {
    f64::from(mw) / 1000.0
}

/// The supported graphics clocks at the highest memory clock; where the driver lists none,
/// a ladder of 16ths of the maximum SM clock from a quarter up (such GPUs usually cannot
/// lock clocks either, and are capped through the power limit).
pub fn supported_clocks(device: &nvml_wrapper::Device<'_>) -> Result<Vec<u32>, NvmlError> {
    let listed = device
        .supported_memory_clocks()
        .ok()
        .and_then(|mem| mem.into_iter().max())
        .and_then(|mem| device.supported_graphics_clocks(mem).ok())
        .filter(|clocks| !clocks.is_empty());
    if let Some(clocks) = listed {
        return Ok(clocks);
    }
    let max = device.max_clock_info(Clock::Graphics).or_else(|_| device.max_clock_info(Clock::SM))?;
    Ok((4..=16).map(|k| max * k / 16).collect())
}

/// Apply `plan` to every GPU; one GPU's failure does not stop the others. The remembered
/// caps are updated; failing to save them is returned beside the outcomes (the caps are set,
/// only the next run's idempotence suffers).
pub fn apply_plan(
    nvml: &Nvml,
    devices: &[CarbonGpu],
    plan: &ClockPlan,
    store: &AppliedStore,
) -> Result<(Vec<GpuOutcome>, Option<ApplyError>), ApplyError> {
    let _lock = store.lock()?;
    let before = store.load();
    let mut records = before.clone();
    let mut outcomes = Vec::new();
    for (gpu, dev) in targets(plan, devices) {
        let previous = records.iter().find(|r| r.uuid == dev.state.uuid).cloned();
        let (run, record) = match nvml.device(dev.state.index) {
            Ok(mut handle) => execute(&mut handle, &dev.state, &Target::from(gpu), previous.as_ref()),
            Err(e) => (
                Execution { error: Some(format!("cannot open the GPU: {}", explain(&e))), ..Execution::default() },
                None,
            ),
        };
        records.retain(|r| r.uuid != dev.state.uuid);
        records.extend(record);
        outcomes.push(outcome(gpu, dev, run));
    }
    let saved = if records == before { None } else { store.save(&records).err() };
    Ok((outcomes, saved))
}

/// Undo every cap: unlock clocks, restore default power limits, forget the records.
pub fn reset_all(nvml: &Nvml, devices: &[CarbonGpu], store: &AppliedStore) -> Result<(Vec<GpuOutcome>, Option<ApplyError>), ApplyError> {
    let _lock = store.lock()?;
    let mut records = store.load();
    let before = records.clone();
    let mut outcomes = Vec::new();
    for dev in devices {
        let previous = records.iter().find(|r| r.uuid == dev.state.uuid).cloned();
        let run = match nvml.device(dev.state.index) {
            Ok(mut handle) => execute_reset(&mut handle, &dev.state, previous.as_ref()),
            Err(e) => {
                Execution { error: Some(format!("cannot open the GPU: {}", explain(&e))), ..Execution::default() }
            }
        };
        if run.error.is_none() {
            records.retain(|r| r.uuid != dev.state.uuid);
        }
        outcomes.push(GpuOutcome {
            index: dev.state.index,
            uuid: dev.state.uuid.clone(),
            workload: None,
            clock_mhz: dev.model.max_clock(),
            max_clock_mhz: dev.model.max_clock(),
            power_w: None,
            g_per_hour: None,
            cap: run.cap,
            writes: run.writes,
            notes: run.notes,
            error: run.error,
        });
    }
    let saved = if records == before { None } else { store.save(&records).err() };
    Ok((outcomes, saved))
}

fn outcome(gpu: &GpuPlan, dev: &CarbonGpu, run: Execution) -> GpuOutcome {
    GpuOutcome {
        index: gpu.index,
        uuid: dev.state.uuid.clone(),
        workload: gpu.workload.clone(),
        clock_mhz: gpu.clock_mhz,
        max_clock_mhz: gpu.max_clock_mhz,
        power_w: Some(gpu.power_w),
        g_per_hour: Some(gpu.g_per_hour),
        cap: run.cap,
        writes: run.writes,
        notes: run.notes,
        error: run.error,
    }
}

/// The plan's GPU entries joined with the devices, in plan order.
pub fn targets<'a>(plan: &'a ClockPlan, devices: &'a [CarbonGpu]) -> impl Iterator<Item = (&'a GpuPlan, &'a CarbonGpu)> {
    plan.gpus.iter().filter_map(move |gpu| devices.iter().find(|d| d.state.index == gpu.index).map(|d| (gpu, d)))
}

#[cfg(test)]
mod tests;
