//! The caps `vgpu carbon apply` set (`<state>/carbon-applied.json`; NVML cannot read locked
//! clocks back), read again only when the file changes — so a damaged file is warned about
//! once, not every round.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use vgpu_carbon::apply::Applied;

use vgpu_carbon::apply::AppliedStore;

#[derive(Debug)]
pub struct Caps {
    path: PathBuf,
    /// (inode, size, mtime ns) of the file last read; None: not there.
    stamp: Option<(u64, u64, i128)>,
    records: Vec<Applied>,
}

impl Caps {
    pub fn new(path: impl Into<PathBuf>) -> Caps {
        Caps { path: path.into(), stamp: None, records: Vec::new() }
    }

    /// The records as the file says now.
    pub fn current(&mut self) -> &[Applied] {
        let stamp = std::fs::symlink_metadata(&self.path)
            .ok()
            .map(|m| (m.ino(), m.size(), i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec())));
        if stamp != self.stamp {
            self.records = if stamp.is_some() { AppliedStore::new(&self.path).load() } else { Vec::new() };
            self.stamp = stamp;
        }
        &self.records
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_carbon::apply::Cap;

    #[test]
    fn follows_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("carbon-applied.json");
        let mut caps = Caps::new(&path);
        assert!(caps.current().is_empty());
        let records = vec![Applied { uuid: "GPU-1".into(), cap: Cap::LockedClocks { min_mhz: 210, max_mhz: 900 }, locking_unsupported: false }];
        AppliedStore::new(&path).save(&records).unwrap();
        assert_eq!(caps.current(), records.as_slice());
        std::fs::remove_file(&path).unwrap();
        assert!(caps.current().is_empty());
    }
}
