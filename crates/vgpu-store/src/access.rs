//! Who may write what in a vGPU's directory (the user guide's ownership table, docs/security.md):
//!
//! - the directory itself and its `limits` file: root (0755, 0644);
//! - its `usage` file and `procs/`: the workload's user (0600, 0700), or, for a partition
//!   shared by a group, root and that group (0660, 0770); a partition of one user: that user.
//!
//! So a tenant can never write another tenant's counters or limits, and nobody but root can
//! change a quota or a share.

use std::path::Path;

use nix::unistd::{Group, User};
use vgpu_abi::usage::Tenant;

use crate::state::Partition;

use crate::state::Workload;

#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    #[error("unknown user {0:?}")]
    UnknownUser(String),
    #[error("unknown group {0:?}")]
    UnknownGroup(String),
    #[error("partition {partition:?} is for {owner}; the workload runs as {user}")]
    NotAllowed { partition: String, owner: String, user: String },
    #[error("{path}: {reason}; not used (remove it, as root, and run again)")]
    Unsafe { path: String, reason: String },
    #[error("{path}: {source}")]
    Io { path: String, #[source] source: std::io::Error },
    #[error("cannot read the user database: {0}")]
    Lookup(#[from] nix::Error),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> AccessError + '_ {
    move |source| AccessError::Io { path: path.display().to_string(), source }
}

/// Check the names `partition create --user/--group` gives.
pub fn check_partition_owner(user: Option<&str>, group: Option<&str>) -> Result<(), AccessError> {
    if let Some(name) = user {
        User::from_name(name)?.ok_or_else(|| AccessError::UnknownUser(name.into()))?;
    }
    if let Some(name) = group {
        Group::from_name(name)?.ok_or_else(|| AccessError::UnknownGroup(name.into()))?;
    }
    Ok(())
}

/// Who writes the counters of the vGPU `w` uses (`partition`: the partition it runs in), and
/// whether `w` may use it at all (a partition's user or group, or root).
pub fn tenant_for(w: &Workload, partition: Option<&Partition>) -> Result<Tenant, AccessError> {
    let Some(p) = partition else {
        return Ok(Tenant { uid: w.user.uid, gid: w.user.gid, group_writable: false });
    };
    let refuse = |owner: String| AccessError::NotAllowed { partition: p.name.clone(), owner, user: w.user.name.clone() };
    if let Some(name) = &p.user {
        let user = User::from_name(name)?.ok_or_else(|| AccessError::UnknownUser(name.clone()))?;
        if w.user.uid != 0 && w.user.uid != user.uid.as_raw() {
            return Err(refuse(format!("user {name}")));
        }
        return Ok(Tenant { uid: user.uid.as_raw(), gid: user.gid.as_raw(), group_writable: false });
    }
    if let Some(name) = &p.group {
        let gid = Group::from_name(name)?.ok_or_else(|| AccessError::UnknownGroup(name.clone()))?.gid.as_raw();
        if w.user.uid != 0 && w.user.gid != gid && !w.user.groups.contains(&gid) {
            return Err(refuse(format!("group {name}")));
        }
        return Ok(Tenant { uid: 0, gid, group_writable: true });
    }
    if w.user.uid != 0 {
        return Err(refuse("root only (no --user or --group)".into()));
    }
    Ok(Tenant { uid: 0, gid: 0, group_writable: false })
}

/// Make `dir` a directory of this process's user (root) with exactly `mode`, or of
/// `owner` — never through a link ([`vgpu_abi::mapping::ensure_dir`]).
fn own_dir(dir: &Path, mode: u32, owner: Option<(u32, u32)>) -> Result<(), AccessError> {
    vgpu_abi::mapping::ensure_dir(dir, mode, owner).map_err(|e| match e {
        vgpu_abi::mapping::DirError::Io(source) => io(dir)(source),
        vgpu_abi::mapping::DirError::Unsafe(reason) => AccessError::Unsafe { path: dir.display().to_string(), reason },
    })
}

/// Make the vGPU directory `dir` (root's, 0755) and its `procs/` (the tenant's, with the
/// tenant's mode). `dir`'s parent is the store's `vgpus/`, which only root can write, so
/// once `dir` is checked to be root's own directory nothing in it can be swapped under us.
pub fn vgpu_dirs(dir: &Path, tenant: Tenant) -> Result<(), AccessError> {
    own_dir(dir, 0o755, None)?;
    own_dir(&dir.join(vgpu_abi::layout::PROCS_DIR), tenant.dir_mode(), Some((tenant.uid, tenant.gid)))
}
