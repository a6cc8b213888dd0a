//! A new workload's id and default name.

use std::path::Path;

use vgpu_store::state::DamagedRecord;

use vgpu_store::state::Workload;

/// Eight hex digits no workload, damaged record included, has.
pub fn new_id(existing: &[Workload], damaged: &[DamagedRecord]) -> String {
    loop {
        let mut bytes = [0u8; 4];
        if getrandom::fill(&mut bytes).is_err() {
            let t = vgpu_store::clock::now_ms() ^ u64::from(std::process::id());
            bytes = (t as u32).to_le_bytes();
        }
        let id: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        // Never the id of a damaged record: its file would be overwritten.
        if !existing.iter().any(|w| w.id == id) && !damaged.iter().any(|d| d.id.as_deref() == Some(id.as_str())) {
            return id;
        }
    }
}

/// `<program>-<id>` (the program's file name, tidied), or the id alone.
pub fn default_name(program: &str, id: &str) -> String {
    let base = Path::new(program).file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let clean: String = base.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_').take(32).collect();
    if clean.is_empty() {
        id.to_string()
    } else {
        format!("{clean}-{id}")
    }
}
