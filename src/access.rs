//! Who may write what in a vGPU's directory (the README's ownership table):
//!
//! - the directory itself and its `limits` file: root (0755, 0644);
//! - its `usage` file and `procs/`: the workload's user (0600, 0700), or, for a partition
//!   shared by a group, root and that group (0660, 0770); a partition of one user: that user.
//!
//! So a tenant can never write another tenant's counters or limits, and nobody but root can
//! change a quota or a share.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::Path;

use nix::unistd::{Group, User};
use vgpu_abi::usage::Tenant;

use crate::state::{Partition, Workload};

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

/// Make `dir` a directory owned by root with exactly `mode`: created if missing (never
/// through a link); an existing one must be a real directory owned by root.
pub fn root_dir(dir: &Path, mode: u32) -> Result<(), AccessError> {
    let meta = real_dir(dir, mode)?;
    if meta.uid() != 0 && meta.uid() != nix::unistd::geteuid().as_raw() {
        return Err(AccessError::Unsafe { path: dir.display().to_string(), reason: format!("owned by uid {}", meta.uid()) });
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).map_err(io(dir))
}

/// Create `dir` with `mode` unless it exists; it must be a real directory (not a link).
fn real_dir(dir: &Path, mode: u32) -> Result<std::fs::Metadata, AccessError> {
    match std::fs::DirBuilder::new().mode(mode).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io(dir)(e)),
    }
    let meta = std::fs::symlink_metadata(dir).map_err(io(dir))?;
    if !meta.file_type().is_dir() {
        let reason = format!("a {}, not a directory", vgpu_abi::mapping::kind_name(&meta.file_type()));
        return Err(AccessError::Unsafe { path: dir.display().to_string(), reason });
    }
    Ok(meta)
}

/// Make the vGPU directory `dir` (root's, 0755) and its `procs/` (the tenant's, with the
/// tenant's mode). `dir`'s parent is the store's `vgpus/`, which only root can write, so
/// once `dir` is checked to be root's own directory nothing in it can be swapped under us.
pub fn vgpu_dirs(dir: &Path, tenant: Tenant) -> Result<(), AccessError> {
    root_dir(dir, 0o755)?;
    let procs = dir.join(vgpu_abi::layout::PROCS_DIR);
    real_dir(&procs, tenant.dir_mode())?;
    std::os::unix::fs::lchown(&procs, Some(tenant.uid), Some(tenant.gid)).map_err(io(&procs))?;
    // After the chown, which may clear set-id bits; the mode is exactly the tenant's.
    std::fs::set_permissions(&procs, std::fs::Permissions::from_mode(tenant.dir_mode())).map_err(io(&procs))
}
