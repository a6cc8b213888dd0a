//! A workload's vGPU: its directory, limits and usage files, `procs/`, and its slot on the
//! board of each of its GPUs.

use std::path::Path;

use anyhow::{Context as _, Result};
use vgpu_abi::layout::USAGE_FILE;
use vgpu_abi::usage::{DeviceQuota, Tenant, UsageFile};

use vgpu_store::state::Store;

use vgpu_store::state::Workload;

/// Create the vGPU directory, its limits and usage files and `procs/`, owned as the
/// user guide's table (docs/security.md) says ([`vgpu_store::access`]) — a partition's exist after its first use — and
/// its slot on the board of each of its GPUs, the tenant's (one that cannot be made is only
/// a warning). `turn_max_us`: the longest turn while a higher priority is active
/// (`[compute] turn`, `--turn`; 0: none), for a vGPU made now.
pub fn ensure_vgpu(store: &Store, dir: &Path, w: &Workload, tenant: Tenant, turn_max_us: u32) -> Result<()> {
    vgpu_store::compute::ensure_slots(&store.state_dir, &w.vgpu, w.gpus.iter().map(|g| g.uuid.as_str()), (tenant.uid, tenant.gid), tenant.group_writable);
    let usage_path = dir.join(USAGE_FILE);
    if w.partition.is_some() && std::fs::symlink_metadata(&usage_path).is_ok() {
        match UsageFile::open(&usage_path) {
            Ok(_) => return Ok(()),
            // Made by an older vgpu and used by no workload now: nothing in it counts any more.
            Err(vgpu_abi::usage::LayoutError::Version { found, .. })
                if found < vgpu_abi::layout::LAYOUT_VERSION
                    && !store.workloads().0.iter().any(|o| o.id != w.id && o.partition == w.partition) =>
            {
                tracing::info!("{}: made by an older vgpu (layout {found}); made again", dir.display());
                // Not its board slots: they were made (again) just above, for the same vGPU.
                std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
            }
            Err(e) => return Err(e).with_context(|| format!("opening {}", usage_path.display())),
        }
    }
    vgpu_store::access::vgpu_dirs(dir, tenant)?;
    let quotas: Vec<DeviceQuota> = w
        .gpus
        .iter()
        .map(|g| DeviceQuota {
            uuid: g.uuid.clone(),
            quota_bytes: g.mem_bytes,
            compute_pct: g.compute_pct,
            policy: w.compute_policy.abi(),
            priority: vgpu_store::compute::abi_priority(w.priority),
            turn_max_us,
        })
        .collect();
    UsageFile::create_for(&usage_path, &quotas, tenant).with_context(|| format!("creating {}", usage_path.display()))?;
    Ok(())
}
