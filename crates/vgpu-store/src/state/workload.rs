//! One workload's definition, as stored in `<state-dir>/workloads/<id>.json`.

use std::path::Path;

use serde::{Deserialize, Serialize};
use vgpu_abi::process::ProcessId;

use super::{atomic, StateError};

/// Bumped when the JSON shape changes incompatibly; older files are refused with a clear
/// message instead of being misread.
pub const WORKLOAD_FORMAT: u32 = 1;

/// The most of a command line vgpu stores (the record's `command`, and from it `vgpu ps`,
/// the history's `workloads.command`, the log): its arguments joined by spaces, marker
/// included. A tenant's 1 MB of arguments is not copied into root's files.
pub const MAX_COMMAND_BYTES: usize = 4096;

/// Room kept for the marker (`… [cut 1023.99 KiB]` and its space) below the cap.
const MARKER_ROOM: usize = 32;

/// `argv` as vgpu stores it: whole when its arguments joined by spaces fit in
/// [`MAX_COMMAND_BYTES`]; else its first arguments up to that (the last one kept cut on a
/// character boundary) and one more, `… [cut SIZE]`, SIZE being what was left out. The
/// workload itself always gets its whole argv. Idempotent: what it returns fits.
pub fn bounded_command(argv: &[String]) -> Vec<String> {
    let joined = argv.iter().map(String::len).sum::<usize>() + argv.len().saturating_sub(1);
    if joined <= MAX_COMMAND_BYTES {
        return argv.to_vec();
    }
    let mut budget = MAX_COMMAND_BYTES - MARKER_ROOM;
    let mut kept: Vec<String> = Vec::new();
    for arg in argv {
        let sep = usize::from(!kept.is_empty());
        if arg.len() + sep <= budget {
            budget -= arg.len() + sep;
            kept.push(arg.clone());
            continue;
        }
        if budget > sep {
            let mut end = budget - sep;
            while !arg.is_char_boundary(end) {
                end -= 1;
            }
            if end > 0 {
                kept.push(arg[..end].to_string());
            }
        }
        break;
    }
    let stored = kept.iter().map(String::len).sum::<usize>() + kept.len().saturating_sub(1);
    kept.push(format!("… [cut {}]", vgpu_abi::size::format_size((joined - stored) as u64)));
    kept
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkloadState {
    /// Waiting for pool blocks (`vgpu run --tflops N --wait`).
    Waiting,
    /// Admitted; the child is being started.
    Starting,
    Running,
    /// Frozen (manually, or preempted by a higher-priority workload).
    Suspended,
}

impl WorkloadState {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadState::Waiting => "waiting",
            WorkloadState::Starting => "starting",
            WorkloadState::Running => "running",
            WorkloadState::Suspended => "suspended",
        }
    }
}

/// The user the workload runs as.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserSpec {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub home: String,
}

/// One GPU slice of the workload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadGpu {
    pub index: u32,
    pub uuid: String,
    /// Device memory quota in bytes (the partition's when the workload uses one).
    pub mem_bytes: u64,
    /// Total device memory, for percentages in listings.
    pub device_bytes: u64,
    /// Share of this GPU's SM time, percent (100 = unlimited).
    pub compute_pct: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    pub format: u32,
    pub id: String,
    pub name: String,
    pub command: Vec<String>,
    pub user: UserSpec,
    pub gpus: Vec<WorkloadGpu>,
    /// The vGPU whose quota it uses: its own (`id`) or a partition's (`p-<name>`).
    pub vgpu: String,
    pub partition: Option<String>,
    pub priority: i32,
    /// How its compute share is applied (`--compute-policy`, the partition's, or the
    /// config's `[compute] policy`). Records written before policies existed read as strict.
    #[serde(default)]
    pub compute_policy: crate::compute::ComputePolicy,
    /// TFLOPS blocks held in the compute pool (`--tflops`), if any.
    pub pool_blocks: Option<u64>,
    /// Identity of declared pool devices (NPUs, FPGAs) handed to the workload.
    #[serde(default)]
    pub pool_env: Vec<(String, String)>,
    /// How much its speed depends on the GPU clock, 0..=1 (`--freq-sensitivity`), for the
    /// carbon planner; None: the config's default.
    #[serde(default)]
    pub freq_sensitivity: Option<f64>,
    /// Name of its cgroup under the `vgpu` parent in each hierarchy.
    pub cgroup: String,
    /// Where that `vgpu` parent is and which cgroup manager chose it (absent: each
    /// hierarchy's root, cgroupfs).
    #[serde(default, skip_serializing_if = "vgpu_cgroups::CgroupHome::is_cgroupfs")]
    pub cgroup_home: vgpu_cgroups::CgroupHome,
    /// The `vgpu run` process that supervises it.
    pub supervisor: ProcessIdRecord,
    /// The workload's first process, once started.
    pub pid: Option<u32>,
    pub state: WorkloadState,
    /// Why it is suspended, e.g. "manual" or "preempted by <id>".
    pub suspended_reason: Option<String>,
    /// While suspended: where its device memory is (None: running, or recorded before
    /// suspension released memory, which reads as held on the device).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspended_memory: Option<SuspendedMemory>,
    /// Who suspended it by hand (`vgpu suspend`): `root`, or the user who ran it through
    /// sudo (`alice (through sudo)`), for the line its own `vgpu run` says. None: running,
    /// preempted (the reason names the preemptor), or recorded before this was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspended_by: Option<String>,
    pub created_unix_ms: u64,
    /// What `vgpu watch` is doing to it, and why (None: nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enforcement: Option<Enforcement>,
    /// The service it is a replica of (`vgpu run --service NAME --replica N`, as `vgpu
    /// watch` and `vgpu service run` start replicas); None: an ordinary workload. A runner
    /// that starts finds the replicas a previous one left running by this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceRef>,
    /// The Slurm job step it fences (made by `spank_vgpu.so` through `vgpu slurm
    /// step-begin`; its tasks stay in Slurm's own cgroups and its supervisor is the step's
    /// slurmstepd); None: not a Slurm step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<SlurmStep>,
}

/// The Slurm job step a workload is: the job id, the step id as Slurm prints it (`0`,
/// `batch`, …) and the node (`SLURMD_NODENAME`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlurmStep {
    pub job: u32,
    pub step: String,
    pub node: String,
}

/// Which service a workload is a replica of, and which replica (0-based).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceRef {
    pub name: String,
    pub replica: u32,
}

/// What `vgpu watch` does to a workload that breaks its slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EnforcementAction {
    /// Its cgroup freezer is duty-cycled down to its compute share.
    Throttled,
    /// Processes of it were killed at its first offence (its cgroup frozen meanwhile).
    Killed,
    /// The whole workload was killed: a second offence within `[watch] offence_window`.
    Ended,
}

impl EnforcementAction {
    pub fn as_str(self) -> &'static str {
        match self {
            EnforcementAction::Throttled => "throttled",
            EnforcementAction::Killed => "killed",
            EnforcementAction::Ended => "ended",
        }
    }

    /// Which outranks which in a record: an end outranks a kill, which outranks a throttle.
    pub fn rank(self) -> u8 {
        match self {
            EnforcementAction::Throttled => 0,
            EnforcementAction::Killed => 1,
            EnforcementAction::Ended => 2,
        }
    }

    /// Whether it is an offence of the workload (a kill or an end), as the watch counts them.
    pub fn is_offence(self) -> bool {
        self != EnforcementAction::Throttled
    }
}

/// Where a suspended workload's device memory is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "on", rename_all = "lowercase")]
pub enum SuspendedMemory {
    /// Its CUDA processes were checkpointed (the CUDA checkpoint API): their device memory
    /// is in host memory and the GPU's is free for others. Its quota stays its own: it
    /// resumes once that fits again.
    Host,
    /// Only frozen: its device memory stays allocated on the GPU. `why` says why the
    /// checkpoint API was not used (an older driver, a process it refused, the config).
    Device { why: String },
}

impl SuspendedMemory {
    /// `host` or `device`, as `vgpu ps` shows it.
    pub fn place(&self) -> &'static str {
        match self {
            SuspendedMemory::Host => "host",
            SuspendedMemory::Device { .. } => "device",
        }
    }
}

/// Recorded in the workload's record by `vgpu watch`, shown by `vgpu ps` as the state
/// (`killed: over memory quota: …`), said by `vgpu run` when its workload ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Enforcement {
    pub action: EnforcementAction,
    /// One line: "over memory quota on GPU 0: 6.0 GiB of 1 GiB, 6.0 GiB not counted by the shim".
    pub reason: String,
    /// The processes it was applied to.
    pub pids: Vec<u32>,
    /// The `vgpu watch` that applied it (a throttle lasts only while that process runs).
    pub by: ProcessIdRecord,
    pub since_unix_ms: u64,
}

/// `ProcessId` in the JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessIdRecord {
    pub pid: u32,
    pub start_time: u64,
}

impl From<ProcessId> for ProcessIdRecord {
    fn from(p: ProcessId) -> Self {
        ProcessIdRecord { pid: p.pid, start_time: p.start_time }
    }
}

impl From<ProcessIdRecord> for ProcessId {
    fn from(p: ProcessIdRecord) -> Self {
        ProcessId { pid: p.pid, start_time: p.start_time }
    }
}

impl Workload {
    pub fn read(path: &Path) -> Result<Workload, StateError> {
        let bytes = atomic::read_regular(path, atomic::MAX_RECORD_BYTES)?;
        Workload::parse(&bytes, path)
    }

    /// Decode and check a record's bytes, as [`Workload::read`] does; `path` names the file
    /// in errors, and its name must be the record's id.
    pub fn parse(bytes: &[u8], path: &Path) -> Result<Workload, StateError> {
        // Straight into the record: what every command does for every record, so it is
        // done once, not through a `serde_json::Value` first. Anything that does not decode
        // so (another format, a duplicate key, damage) takes the path that says why.
        let w = match serde_json::from_slice::<Workload>(bytes) {
            Ok(w) if w.format == WORKLOAD_FORMAT => w,
            _ => Workload::decode_checking_format(bytes, path)?,
        };
        // These are joined to paths (its vGPU directory, its cgroup, its record): plain names only.
        for (field, name) in [("id", Some(&w.id)), ("vgpu", Some(&w.vgpu)), ("cgroup", Some(&w.cgroup)), ("partition", w.partition.as_ref())] {
            if let Some(name) = name.filter(|n| !super::is_plain_name(n)) {
                return Err(StateError::Damaged { path: path.to_path_buf(), message: format!("{field} {name:?} is not a plain name") });
            }
        }
        // And they must be the ones vgpu gives a workload: a forged record cannot point its
        // clean-up at another workload's cgroup or vGPU, or at a partition's.
        let damaged = |message: String| StateError::Damaged { path: path.to_path_buf(), message };
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
        if w.id != stem {
            return Err(damaged(format!("id {:?} is not its file's name {stem:?}", w.id)));
        }
        if w.cgroup != w.id {
            return Err(damaged(format!("cgroup {:?} is not its id {:?}", w.cgroup, w.id)));
        }
        let own_vgpu = match &w.partition {
            None => w.id.clone(),
            Some(p) => format!("p-{p}"),
        };
        if w.vgpu != own_vgpu {
            return Err(damaged(format!("vGPU {:?} is not {own_vgpu:?}", w.vgpu)));
        }
        Ok(w)
    }

    /// Decode through a `serde_json::Value`: a record of another format is refused as such
    /// (its other fields are not read by this version's rules), else the decoding error.
    fn decode_checking_format(bytes: &[u8], path: &Path) -> Result<Workload, StateError> {
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| StateError::Damaged { path: path.to_path_buf(), message: e.to_string() })?;
        let format = value.get("format").and_then(|f| f.as_u64()).unwrap_or(0);
        if format != u64::from(WORKLOAD_FORMAT) {
            return Err(StateError::Damaged {
                path: path.to_path_buf(),
                message: format!("format {format} is not the format {WORKLOAD_FORMAT} this vgpu reads (written by another vgpu version)"),
            });
        }
        serde_json::from_value(value).map_err(|e| StateError::Damaged { path: path.to_path_buf(), message: e.to_string() })
    }

    /// Write the record (runtime state: not synced, see [`atomic`]).
    pub fn write(&self, path: &Path) -> Result<(), StateError> {
        atomic::write_json_as(path, self, atomic::Durability::Runtime)
    }

    /// Record it suspended, for `reason`, with its memory where `memory` says.
    pub fn set_suspended(&mut self, reason: String, memory: SuspendedMemory) {
        self.state = WorkloadState::Suspended;
        self.suspended_reason = Some(reason);
        self.suspended_memory = Some(memory);
        self.suspended_by = None;
    }

    /// Record it running again (a suspended one resumed).
    pub fn set_resumed(&mut self) {
        if self.state == WorkloadState::Suspended {
            self.state = WorkloadState::Running;
        }
        self.suspended_reason = None;
        self.suspended_memory = None;
        self.suspended_by = None;
    }

    /// Whether its device memory is off the GPUs (suspended through the checkpoint API):
    /// admission counts that memory as free, and it resumes only once it fits again.
    pub fn memory_on_host(&self) -> bool {
        self.state == WorkloadState::Suspended && self.suspended_memory == Some(SuspendedMemory::Host)
    }

    /// Whether its supervisor (the exact process, not a recycled pid) still runs.
    pub fn supervisor_alive(&self) -> bool {
        ProcessId::from(self.supervisor).is_alive()
    }

    /// Whether `query` names this workload: its name, or a prefix of its id.
    pub fn matches(&self, query: &str) -> bool {
        self.name == query || (!query.is_empty() && self.id.starts_with(query))
    }
}

#[cfg(any(test, feature = "test-support"))]
pub mod tests {
    use super::*;

    pub fn sample() -> Workload {
        Workload {
            format: WORKLOAD_FORMAT,
            id: "a1b2c3d4".into(),
            name: "train".into(),
            command: vec!["python".into(), "train.py".into()],
            user: UserSpec { name: "root".into(), uid: 0, gid: 0, groups: vec![0], home: "/root".into() },
            gpus: vec![WorkloadGpu { index: 0, uuid: "GPU-x".into(), mem_bytes: 4 << 30, device_bytes: 16 << 30, compute_pct: 100 }],
            vgpu: "a1b2c3d4".into(),
            partition: None,
            priority: 0,
            compute_policy: Default::default(),
            pool_blocks: None,
            pool_env: Vec::new(),
            freq_sensitivity: None,
            cgroup: "a1b2c3d4".into(),
            cgroup_home: Default::default(),
            supervisor: ProcessIdRecord { pid: 1, start_time: 1 },
            pid: None,
            state: WorkloadState::Running,
            suspended_reason: None,
            suspended_memory: None,
            suspended_by: None,
            created_unix_ms: 0,
            enforcement: None,
            service: None,
            slurm: None,
        }
    }

    #[test]
    fn round_trip_and_format_check() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a1b2c3d4.json");
        let w = sample();
        w.write(&path).unwrap();
        assert_eq!(Workload::read(&path).unwrap(), w);
        let text = std::fs::read_to_string(&path).unwrap().replace("\"format\": 1", "\"format\": 9");
        std::fs::write(&path, text).unwrap();
        let err = Workload::read(&path).unwrap_err().to_string();
        assert!(err.contains("format 9") && err.contains("a1b2c3d4.json"), "{err}");
    }

    #[test]
    fn what_the_straight_decoding_refuses_reads_as_through_a_value() {
        // A duplicate key: a record decoded straight refuses it, a `serde_json::Value` keeps
        // the last; records read as they always did.
        let text = serde_json::to_string(&sample()).unwrap().replacen("\"name\":\"train\"", "\"name\":\"first\",\"name\":\"train\"", 1);
        assert!(serde_json::from_str::<Workload>(&text).is_err(), "{text}");
        assert_eq!(Workload::parse(text.as_bytes(), Path::new("a1b2c3d4.json")).unwrap(), sample());
        // Another format is refused as such, whatever else it holds.
        let other = serde_json::to_string(&sample()).unwrap().replace("\"format\":1", "\"format\":2");
        let err = Workload::parse(other.as_bytes(), Path::new("a1b2c3d4.json")).unwrap_err().to_string();
        assert!(err.contains("format 2 is not the format 1"), "{err}");
    }

    #[test]
    fn records_without_a_policy_read_as_strict() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a1b2c3d4.json");
        let mut w = sample();
        w.compute_policy = crate::compute::ComputePolicy::Fair;
        w.write(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("\"compute_policy\": \"fair\""), "{text}");
        let mut value: serde_json::Value = serde_json::from_str(&text).unwrap();
        value.as_object_mut().unwrap().remove("compute_policy");
        std::fs::write(&path, value.to_string()).unwrap();
        assert_eq!(Workload::read(&path).unwrap().compute_policy, crate::compute::ComputePolicy::Strict);
    }

    #[test]
    fn forged_names_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a1b2c3d4.json");
        let forge = |edit: &dyn Fn(&mut Workload)| {
            let mut w = sample();
            edit(&mut w);
            w.write(&path).unwrap();
            Workload::read(&path).unwrap_err().to_string()
        };
        assert!(forge(&|w| w.vgpu = "../../../etc".into()).contains("not a plain name"));
        assert!(forge(&|w| w.vgpu = "other".into()).contains("vGPU \"other\""));
        assert!(forge(&|w| w.vgpu = "p-svc".into()).contains("is not \"a1b2c3d4\""));
        assert!(forge(&|w| w.cgroup = "victim".into()).contains("cgroup"));
        assert!(forge(&|w| w.id = "deadbeef".into()).contains("file's name"));
        let mut w = sample();
        w.partition = Some("svc".into());
        w.vgpu = "p-svc".into();
        w.write(&path).unwrap();
        assert_eq!(Workload::read(&path).unwrap(), w);
    }

    #[test]
    fn a_damaged_record_is_named_on_one_line() {
        // serde quotes an unknown value as it is; the message must stay one line.
        let text = serde_json::to_string(&sample()).unwrap().replace("\"running\"", "\"run\\nning\"");
        let err = Workload::parse(text.as_bytes(), Path::new("w.json")).unwrap_err().to_string();
        assert!(err.starts_with("damaged state file w.json: unknown variant `run?ning`"), "{err}");
    }

    #[test]
    fn matching_by_name_or_id_prefix() {
        let w = sample();
        assert!(w.matches("train"));
        assert!(w.matches("a1b"));
        assert!(!w.matches("b1"));
        assert!(!w.matches(""));
    }

    #[test]
    fn a_long_command_is_cut_on_a_character_boundary_with_a_marker() {
        let short: Vec<String> = vec!["python".into(), "train.py".into()];
        assert_eq!(bounded_command(&short), short);
        let joined = |v: &[String]| v.join(" ").len();
        // 1.2 MB of arguments, multi-byte characters where the cut falls.
        let mut argv: Vec<String> = vec!["sh".into(), "-c".into(), "exit 0".into()];
        argv.extend((0..12).map(|_| "é".repeat(50_000)));
        let stored = bounded_command(&argv);
        assert!(joined(&stored) <= MAX_COMMAND_BYTES, "{}", joined(&stored));
        assert_eq!(&stored[..3], &argv[..3]);
        let marker = stored.last().unwrap();
        assert!(marker.starts_with("… [cut 1.1") && marker.ends_with("MiB]"), "{marker}");
        assert!(stored[3].chars().all(|c| c == 'é') && stored[3].len() > 3000, "{}", stored[3].len());
        // What it returns fits as it is.
        assert_eq!(bounded_command(&stored), stored);
        // One huge first argument is cut too; an exact fit is kept whole.
        let stored = bounded_command(&["x".repeat(10_000)]);
        assert_eq!(stored.len(), 2);
        assert!(joined(&stored) <= MAX_COMMAND_BYTES);
        let fits = vec!["y".repeat(MAX_COMMAND_BYTES - 2), "z".into()];
        assert_eq!(bounded_command(&fits), fits);
    }
}
