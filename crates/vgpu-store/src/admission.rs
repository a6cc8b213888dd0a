//! Admission (pure): does a memory request fit a GPU, given the running workloads and the
//! partitions? The sum of memory quotas on a GPU never exceeds its memory unless the
//! caller allows oversubscription.

use std::fmt::Write as _;

use vgpu_abi::size::{format_size, parse_size};

use crate::state::DamagedRecord;

use crate::state::Partition;

use crate::state::Workload;

/// A device as admission sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmissionGpu {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory: u64,
}

/// `--mem`: bytes, or a percentage of the device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MemSpec {
    Bytes(u64),
    Percent(f64),
}

/// The smallest vGPU a size may ask for, as `--memory`'s floor for host RAM: below it a
/// size is a mistake (a bare `4096` read as bytes made a 4 KiB vGPU), never a slice.
pub const MIN_MEM_BYTES: u64 = 16 << 20;

impl MemSpec {
    /// A size with a unit (`4G`, `512M`, `1.5GiB`) of at least [`MIN_MEM_BYTES`], or `NN%` of
    /// the device. A bare number is refused with the sizes it may have meant: GPU memory
    /// is never counted in bytes on a command line.
    pub fn parse(text: &str) -> Result<MemSpec, String> {
        let text = text.trim();
        if let Some(pct) = text.strip_suffix('%') {
            let value: f64 = pct.trim().parse().map_err(|_| format!("invalid percentage {text:?}"))?;
            if !(value > 0.0 && value <= 100.0) {
                return Err(format!("percentage {text:?} must be above 0 and at most 100"));
            }
            return Ok(MemSpec::Percent(value));
        }
        if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit() || b == b'.') && text.parse::<f64>().is_ok_and(|v| v > 0.0) {
            return Err(bare_number_hint(text));
        }
        let bytes = parse_size(text).map_err(|e| e.to_string())?;
        if bytes == 0 {
            return Err(format!("memory size {text:?} must be above zero"));
        }
        if bytes < MIN_MEM_BYTES {
            return Err(format!("memory size {text:?} is below the smallest vGPU, {}", format_size(MIN_MEM_BYTES)));
        }
        Ok(MemSpec::Bytes(bytes))
    }

    pub fn bytes_of(&self, device_memory: u64) -> u64 {
        match *self {
            MemSpec::Bytes(b) => b,
            MemSpec::Percent(p) => ((device_memory as f64) * p / 100.0) as u64,
        }
    }
}

/// The refusal of a bare number as a size, with the units it may have meant: `4096` →
/// 4096M or 4G, `4` → 4G or 4M.
fn bare_number_hint(text: &str) -> String {
    let whole = text.parse::<f64>().ok().filter(|v| *v >= 1024.0 && (v / 1024.0).fract() == 0.0);
    let meant = match whole {
        Some(v) => format!("{text}M or {}G", v / 1024.0),
        None => format!("{text}G or {text}M"),
    };
    format!("{text:?} has no unit: did you mean {meant}? (sizes take a unit: 512M, 4G, or NN% of the device)")
}

/// One holder of memory on a GPU, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub what: String,
    pub bytes: u64,
}

/// Memory reserved on `uuid`: partitions, and workloads that have a vGPU of their own
/// (workloads in a partition live inside the partition's reservation), except those
/// suspended with their memory on the host (`Workload::memory_on_host`): theirs is free
/// until they resume, which they do only once it fits again ([`check_fits_back`]).
pub fn holders(uuid: &str, workloads: &[Workload], partitions: &[Partition]) -> Vec<Holder> {
    let mut out = Vec::new();
    for p in partitions.iter().filter(|p| p.gpu_uuid == uuid) {
        out.push(Holder { what: format!("partition {}", p.name), bytes: p.mem_bytes });
    }
    for w in workloads.iter().filter(|w| w.partition.is_none() && !w.memory_on_host()) {
        for g in w.gpus.iter().filter(|g| g.uuid == uuid) {
            out.push(Holder { what: format!("workload {} ({})", w.name, w.id), bytes: g.mem_bytes });
        }
    }
    out
}

pub fn reserved(uuid: &str, workloads: &[Workload], partitions: &[Partition]) -> u64 {
    total(&holders(uuid, workloads, partitions))
}

/// The holders' bytes, saturating: oversubscribed quotas (`--mem 15E --oversubscribe`) or a
/// damaged record may claim more than a u64 counts, which must read as "full", not wrap.
fn total(holders: &[Holder]) -> u64 {
    holders.iter().fold(0, |sum, h| sum.saturating_add(h.bytes))
}

/// The GPU with the most unreserved memory (lowest index on ties).
pub fn pick_default<'a>(devices: &'a [AdmissionGpu], workloads: &[Workload], partitions: &[Partition]) -> Option<&'a AdmissionGpu> {
    devices
        .iter()
        .max_by_key(|d| (d.memory.saturating_sub(reserved(&d.uuid, workloads, partitions)), std::cmp::Reverse(d.index)))
}

/// Refuse `bytes` on `device` if it does not fit, with a message naming what holds it.
pub fn check_fits(device: &AdmissionGpu, bytes: u64, workloads: &[Workload], partitions: &[Partition]) -> Result<(), String> {
    let holders = holders(&device.uuid, workloads, partitions);
    let reserved = total(&holders);
    let free = device.memory.saturating_sub(reserved);
    if bytes <= free {
        return Ok(());
    }
    let mut msg = format!(
        "{} does not fit on GPU {} ({}, {}): {} unreserved",
        format_size(bytes),
        device.index,
        device.name,
        format_size(device.memory),
        format_size(free)
    );
    if !holders.is_empty() {
        let list: Vec<String> = holders.iter().map(|h| format!("{} {}", h.what, format_size(h.bytes))).collect();
        let _ = write!(msg, "; held by {}", list.join(", "));
    }
    msg.push_str(" (use --oversubscribe to allow it anyway)");
    Err(msg)
}

/// Whether a workload suspended with its memory on the host may resume: each of its
/// slices must fit beside what the others (not itself) hold now, on the device sizes its
/// record keeps. Workloads in a partition resume inside the partition's reservation, which
/// never left.
pub fn check_fits_back(workload: &Workload, others: &[Workload], partitions: &[Partition]) -> Result<(), String> {
    if !workload.memory_on_host() || workload.partition.is_some() {
        return Ok(());
    }
    let others: Vec<Workload> = others.iter().filter(|w| w.id != workload.id).cloned().collect();
    for g in &workload.gpus {
        let holders = holders(&g.uuid, &others, partitions);
        let free = g.device_bytes.saturating_sub(total(&holders));
        if g.mem_bytes > free {
            let mut msg = format!(
                "its {} of GPU {} are in host memory and do not fit back yet: {} unreserved",
                format_size(g.mem_bytes),
                g.index,
                format_size(free)
            );
            if !holders.is_empty() {
                let list: Vec<String> = holders.iter().map(|h| format!("{} {}", h.what, format_size(h.bytes))).collect();
                let _ = write!(msg, "; held by {}", list.join(", "));
            }
            return Err(msg);
        }
    }
    Ok(())
}

/// Refuse any memory on `device` while a damaged workload record may hold some there: what
/// it reserved is unknown, and a damaged record must never free its reservation. The
/// message names the file and how to clear it.
pub fn check_not_blocked(device: &AdmissionGpu, damaged: &[DamagedRecord]) -> Result<(), String> {
    let Some(d) = damaged.iter().find(|d| d.may_hold(&device.uuid)) else { return Ok(()) };
    let cgroup = d.id.as_deref().map(|id| format!(" (in cgroup vgpu/{id})")).unwrap_or_default();
    Err(format!(
        "GPU {} is blocked: the workload record {} is damaged ({}), so the memory it reserves {} is unknown; \
         `sudo vgpu doctor --repair` removes it once no process is left in its workload{cgroup}",
        device.index,
        d.path.display(),
        d.problem,
        if d.gpus.is_some() { "there" } else { "on any GPU" },
    ))
}

/// Find a device by index or UUID (a unique UUID prefix is enough).
pub fn find_device<'a>(devices: &'a [AdmissionGpu], query: &str) -> Result<&'a AdmissionGpu, String> {
    if let Ok(index) = query.parse::<u32>() {
        return devices
            .iter()
            .find(|d| d.index == index)
            .ok_or_else(|| format!("no GPU with index {index} (this host has {} GPU(s), see `vgpu devices`)", devices.len()));
    }
    let matches: Vec<&AdmissionGpu> = devices.iter().filter(|d| d.uuid.starts_with(query)).collect();
    match matches.as_slice() {
        [one] => Ok(one),
        [] => Err(format!("no GPU with UUID {query:?} (see `vgpu devices`)")),
        _ => Err(format!("{query:?} matches several GPUs; give more of the UUID")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::workload::ProcessIdRecord;
    use crate::state::workload::UserSpec;
    use crate::state::workload::WorkloadState;
    use crate::state::workload::WORKLOAD_FORMAT;
    use crate::state::WorkloadGpu;

    const GIB: u64 = 1 << 30;

    fn dev(index: u32, gib: u64) -> AdmissionGpu {
        AdmissionGpu { index, uuid: format!("GPU-{index}"), name: "Sim".into(), memory: gib * GIB }
    }

    fn workload(name: &str, uuid: &str, gib: u64, partition: Option<&str>) -> Workload {
        Workload {
            format: WORKLOAD_FORMAT,
            id: format!("id{name}"),
            name: name.into(),
            command: vec!["x".into()],
            user: UserSpec { name: "root".into(), uid: 0, gid: 0, groups: vec![], home: "/".into() },
            gpus: vec![WorkloadGpu { index: 0, uuid: uuid.into(), mem_bytes: gib * GIB, device_bytes: 0, compute_pct: 100 }],
            vgpu: name.into(),
            partition: partition.map(str::to_string),
            priority: 0,
            compute_policy: Default::default(),
            pool_blocks: None,
            pool_env: Vec::new(),
            freq_sensitivity: None,
            cgroup: name.into(),
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

    fn partition(name: &str, uuid: &str, gib: u64) -> Partition {
        Partition { name: name.into(), gpu_index: 0, gpu_uuid: uuid.into(), mem_bytes: gib * GIB, compute_pct: 100, compute_policy: Default::default(), created_unix_ms: 0, user: None, group: None }
    }

    #[test]
    fn mem_specs() {
        assert_eq!(MemSpec::parse("4G").unwrap(), MemSpec::Bytes(4 * GIB));
        assert_eq!(MemSpec::parse("1.5G").unwrap(), MemSpec::Bytes(3 * GIB / 2));
        assert_eq!(MemSpec::parse("25%").unwrap().bytes_of(16 * GIB), 4 * GIB);
        for bad in ["0", "0%", "101%", "-1G", "abc", "%", "4X", "0G", "1K", "15M"] {
            assert!(MemSpec::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(MemSpec::parse("16M").unwrap(), MemSpec::Bytes(MIN_MEM_BYTES));
    }

    #[test]
    fn a_bare_number_is_refused_with_the_sizes_it_may_mean() {
        let hint = |text: &str| MemSpec::parse(text).unwrap_err();
        assert!(hint("4096").contains("did you mean 4096M or 4G?"), "{}", hint("4096"));
        assert!(hint("4").contains("did you mean 4G or 4M?"), "{}", hint("4"));
        assert!(hint("1.5").contains("did you mean 1.5G or 1.5M?"), "{}", hint("1.5"));
        assert!(hint("100").contains("no unit"), "{}", hint("100"));
    }

    #[test]
    fn reserved_counts_partitions_and_own_vgpus_but_not_partition_members() {
        let ws = vec![workload("a", "GPU-0", 4, None), workload("b", "GPU-0", 6, Some("p")), workload("c", "GPU-1", 2, None)];
        let ps = vec![partition("p", "GPU-0", 6)];
        assert_eq!(reserved("GPU-0", &ws, &ps), 10 * GIB);
        assert_eq!(reserved("GPU-1", &ws, &ps), 2 * GIB);
    }

    #[test]
    fn refusal_names_the_holders() {
        let d = dev(0, 16);
        let ws = vec![workload("a", "GPU-0", 12, None)];
        assert!(check_fits(&d, 4 * GIB, &ws, &[]).is_ok());
        let err = check_fits(&d, 5 * GIB, &ws, &[]).unwrap_err();
        assert!(err.contains("workload a (ida) 12 GiB") && err.contains("4 GiB unreserved"), "{err}");
    }

    #[test]
    fn a_damaged_record_blocks_its_gpus_or_all() {
        let damaged = |gpus: Option<Vec<String>>| DamagedRecord {
            path: "/run/vgpu/workloads/ab.json".into(),
            id: Some("ab".into()),
            problem: "EOF".into(),
            gpus,
            supervisor: None,
        };
        let known = [damaged(Some(vec!["GPU-0".into()]))];
        let err = check_not_blocked(&dev(0, 16), &known).unwrap_err();
        assert!(err.contains("/run/vgpu/workloads/ab.json") && err.contains("vgpu doctor --repair") && err.contains("vgpu/ab"), "{err}");
        assert!(check_not_blocked(&dev(1, 16), &known).is_ok());
        let unknown = [damaged(None)];
        assert!(check_not_blocked(&dev(1, 16), &unknown).unwrap_err().contains("on any GPU"));
        assert!(check_not_blocked(&dev(1, 16), &[]).is_ok());
    }

    #[test]
    fn reservations_beyond_u64_read_as_full() {
        // Caught by the `workload_record` fuzz check: two oversubscribed quotas of 15 EiB summed
        // past u64::MAX, a panic in debug builds and a small wrapped total (room) in release.
        let mut ws = vec![workload("a", "GPU-0", 0, None), workload("b", "GPU-0", 0, None)];
        for w in &mut ws {
            w.gpus[0].mem_bytes = MemSpec::parse("15E").unwrap().bytes_of(0);
        }
        assert_eq!(reserved("GPU-0", &ws, &[]), u64::MAX);
        let err = check_fits(&dev(0, 16), 1, &ws, &[]).unwrap_err();
        assert!(err.contains("0 B unreserved"), "{err}");
        assert_eq!(pick_default(&[dev(0, 16)], &ws, &[]).unwrap().index, 0);
    }

    #[test]
    fn default_is_most_unreserved() {
        let devices = vec![dev(0, 16), dev(1, 16), dev(2, 8)];
        let ws = vec![workload("a", "GPU-0", 4, None)];
        assert_eq!(pick_default(&devices, &ws, &[]).unwrap().index, 1);
        assert_eq!(pick_default(&devices, &[], &[]).unwrap().index, 0);
    }

    #[test]
    fn find_by_index_or_uuid_prefix() {
        let devices = vec![dev(0, 16), dev(1, 16)];
        assert_eq!(find_device(&devices, "1").unwrap().index, 1);
        assert_eq!(find_device(&devices, "GPU-1").unwrap().index, 1);
        assert!(find_device(&devices, "GPU-").unwrap_err().contains("several"));
        assert!(find_device(&devices, "7").is_err());
        assert!(find_device(&devices, "GPU-9").is_err());
    }
}
