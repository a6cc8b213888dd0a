//! The boot mark, `<state>/boot_id`: the kernel's id of the boot in which the store was
//! last reconciled (`/proc/sys/kernel/random/boot_id`).
//!
//! The runtime state is not synced to the disk ([`super::atomic`]): whatever kills a `vgpu`
//! process leaves every file whole, but a crash of the machine can leave a state directory
//! that lives on a disk with files cut short. Everything in them described processes of
//! that boot, which are gone. The first reconcile of a later boot finds the mark naming
//! another boot, has what the crash may have damaged repaired
//! (`vgpu_host::repair::after_reboot`), and only then marks the store as this boot's. On a
//! tmpfs (`/run`, the default) nothing outlives a boot and the mark is always this boot's.
//!
//! The mark itself is synced, and so is the directory entry that names it.

use std::path::{Path, PathBuf};

use super::{atomic, StateError, Store};

/// The mark's file name in the state directory.
pub const BOOT_FILE: &str = "boot_id";

/// Where the kernel says which boot this is.
const KERNEL_BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// What the mark says of the store, with this boot's id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mark {
    /// Reconciled in this boot already.
    ThisBoot,
    /// Never marked: a new store, or one an older vgpu kept (which synced every write).
    Unmarked(String),
    /// Last reconciled in another boot (or the mark cannot be read): what it holds may have
    /// been cut short by a crash of the machine.
    Earlier(String),
}

/// This boot's id, as the kernel gives it.
pub fn this_boot() -> Result<String, StateError> {
    let path = Path::new(KERNEL_BOOT_ID);
    let id = std::fs::read_to_string(path).map_err(|e| StateError::io(path, e))?.trim().to_string();
    if id.is_empty() {
        return Err(StateError::Damaged { path: path.to_path_buf(), message: "no boot id".into() });
    }
    Ok(id)
}

impl Store {
    /// The boot mark's path.
    pub fn boot_path(&self) -> PathBuf {
        self.state_dir.join(BOOT_FILE)
    }

    /// What the mark says of the store (call under the store lock).
    pub fn boot_mark(&self) -> Result<Mark, StateError> {
        let this = this_boot()?;
        Ok(self.mark_against(this))
    }

    fn mark_against(&self, this: String) -> Mark {
        match atomic::read_regular(&self.boot_path(), 64) {
            Ok(bytes) if String::from_utf8_lossy(&bytes).trim() == this => Mark::ThisBoot,
            Err(StateError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => Mark::Unmarked(this),
            // Another boot's id, or a mark that cannot be read (cut short, not a file).
            _ => Mark::Earlier(this),
        }
    }

    /// Mark the store as reconciled in boot `id`: written atomically and synced, and so is
    /// the state directory's entry for it (call under the store lock).
    pub fn set_boot_mark(&self, id: &str) -> Result<(), StateError> {
        atomic::write_atomic(&self.boot_path(), format!("{id}\n").as_bytes(), 0o644)?;
        let dir = std::fs::File::open(&self.state_dir).map_err(|e| StateError::io(&self.state_dir, e))?;
        dir.sync_all().map_err(|e| StateError::io(&self.state_dir, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::state::temp_store as store;

    #[test]
    fn unmarked_then_this_boot_and_another_boot_is_earlier() {
        let (_dir, store) = store();
        let this = this_boot().unwrap();
        assert_eq!(this.len(), 36, "{this}");
        assert_eq!(store.boot_mark().unwrap(), Mark::Unmarked(this.clone()));
        store.set_boot_mark(&this).unwrap();
        assert_eq!(store.boot_mark().unwrap(), Mark::ThisBoot);
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(store.boot_path()).unwrap().permissions()) & 0o777;
        assert_eq!(mode, 0o644);
        store.set_boot_mark("00000000-0000-0000-0000-000000000000").unwrap();
        assert_eq!(store.boot_mark().unwrap(), Mark::Earlier(this.clone()));
        // Cut short by a crash, or not a regular file: read as an earlier boot's.
        std::fs::write(store.boot_path(), "").unwrap();
        assert_eq!(store.boot_mark().unwrap(), Mark::Earlier(this.clone()));
        std::fs::remove_file(store.boot_path()).unwrap();
        std::os::unix::fs::symlink("/proc/sys/kernel/random/boot_id", store.boot_path()).unwrap();
        assert_eq!(store.boot_mark().unwrap(), Mark::Earlier(this.clone()));
        // Marking replaces the link itself, never what it points to.
        store.set_boot_mark(&this).unwrap();
        assert_eq!(store.boot_mark().unwrap(), Mark::ThisBoot);
        assert!(std::fs::symlink_metadata(store.boot_path()).unwrap().file_type().is_file());
    }
}
