//! The decision log: one JSON object per line in `<lib_dir>/carbon.jsonl`, appended by every
//! `apply` and `reset` (and every re-plan when a workload starts or ends), so that anyone
//! can audit what was capped, when and why.
//!
//! **Rotation.** When a line would take the log past `[carbon] log_max_bytes` (default
//! 16 MiB), the log is renamed to `carbon.jsonl.1` (an older `.1` to `.2`, … up to
//! `log_keep` old files; the oldest is dropped) and a new one is started. Each step is one
//! `rename`, so a SIGKILL between steps loses at most the history being rotated out, and
//! the next append carries on from whatever files are there. Appenders (the timer, `vgpu
//! run`s) take `carbon.jsonl.lock` (the store's kind of lock: bounded wait) around the size
//! check, the rotation and the write.
//!
//! **Whole lines.** A line is written with one `write` on an `O_APPEND` descriptor. If the
//! file does not end with a newline (a write cut short by a full disk), the next line starts
//! on a line of its own, and [`read_history`] skips the torn line.
//!
//! **Files.** Opened with `O_NOFOLLOW` (a link in place of the log is refused, never
//! followed; the library directory itself is resolved once by `Context`), regular files
//! only, made mode 0644 (the log is for anyone to audit) by the writer, root.

use std::fs::File;
use std::io::Write as _;
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::apply::GpuOutcome;
use super::intensity::Intensity;
use super::planner::ClockPlan;

pub const LOG_FILE: &str = "carbon.jsonl";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    Apply,
    Reset,
}

/// One line of the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub time: DateTime<Utc>,
    pub action: Action,
    /// gCO2/kWh and where it came from (apply only).
    pub intensity: Option<f64>,
    pub intensity_source: Option<Intensity>,
    pub budget_g_per_hour: Option<f64>,
    pub predicted_g_per_hour: Option<f64>,
    pub budget_met: Option<bool>,
    pub notes: Vec<String>,
    pub gpus: Vec<GpuOutcome>,
    /// Why vgpu decided on its own, e.g. "workload started 3f2a…" (clocks that follow the
    /// work); absent for `vgpu carbon apply`/`reset`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The daily and monthly budgets' figures when the plan was made for them (budget,
    /// spent, remaining, planned, allotted now); absent with a per-hour budget only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub horizons: Vec<super::budget::HorizonFigures>,
}

impl Decision {
    /// The decision to apply `plan`, made for `intensity`, with what happened on each GPU.
    pub fn applied(plan: &ClockPlan, intensity: &Intensity, gpus: Vec<GpuOutcome>, reason: Option<String>) -> Decision {
        Decision {
            time: Utc::now(),
            action: Action::Apply,
            intensity: Some(plan.intensity),
            intensity_source: Some(intensity.clone()),
            budget_g_per_hour: plan.budget_g_per_hour,
            predicted_g_per_hour: Some(plan.predicted_g_per_hour),
            budget_met: Some(plan.budget_met),
            notes: plan.notes.clone(),
            gpus,
            reason,
            horizons: Vec::new(),
        }
    }
}

#[derive(Debug, Error)]
#[error("cannot append to {}: {source}", .path.display())]
pub struct LogError {
    pub path: PathBuf,
    pub source: std::io::Error,
}

/// The log's mode: anyone may audit it.
pub const LOG_MODE: u32 = 0o644;
pub use crate::config::{Rotation, DEFAULT_KEEP, DEFAULT_MAX_BYTES};

/// `carbon.jsonl.N`: the N-th most recent rotated file.
pub fn rotated_path(path: &Path, n: u32) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

fn lock_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

/// Append `decision` as one line, rotating first if the line would take the log past
/// `rotation.max_bytes` (see the module's notes).
pub fn append(path: &Path, decision: &Decision, rotation: Rotation) -> Result<(), LogError> {
    let err = |source| LogError { path: path.to_path_buf(), source };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        crate::create_dir(dir).map_err(err)?;
    }
    let mut line = serde_json::to_vec(decision).map_err(|e| err(e.into()))?;
    line.push(b'\n');
    let _lock = vgpu_store::state::StoreLock::acquire(&lock_path(path)).map_err(|e| err(std::io::Error::other(e.to_string())))?;
    let mut file = open_log(path).map_err(err)?;
    let size = file.metadata().map_err(err)?.len();
    if size > 0 && size.saturating_add(line.len() as u64) > rotation.max_bytes {
        drop(file);
        rotate(path, rotation.keep.max(1)).map_err(err)?;
        file = open_log(path).map_err(err)?;
    } else if size > 0 && !ends_with_newline(&file, size) {
        line.insert(0, b'\n');
    }
    file.write_all(&line).map_err(err)
}

/// Open (creating, mode [`LOG_MODE`]) the log for appending: never through a link, never
/// blocking on a FIFO, a regular file only.
fn open_log(path: &Path) -> std::io::Result<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(LOG_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => std::io::Error::other("a symbolic link, not the decision log; not followed"),
            _ => e,
        })?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        let kind = vgpu_abi::mapping::kind_name(&meta.file_type());
        return Err(std::io::Error::other(format!("a {kind}, not the decision log")));
    }
    if meta.permissions().mode() & 0o7777 != LOG_MODE {
        // Made under another umask, or by an older vgpu.
        file.set_permissions(std::fs::Permissions::from_mode(LOG_MODE))?;
    }
    Ok(file)
}

fn ends_with_newline(file: &File, size: u64) -> bool {
    let mut last = [0u8; 1];
    matches!(file.read_at(&mut last, size - 1), Ok(1) if last[0] == b'\n')
}

/// Shift the rotated files up by one (dropping the one past `keep`) and the log to `.1`.
/// Each step is a `rename` (a link in the way is replaced, not followed); a file missing
/// (a rotation killed half-way) is skipped.
fn rotate(path: &Path, keep: u32) -> std::io::Result<()> {
    for n in (1..keep).rev() {
        match std::fs::rename(rotated_path(path, n), rotated_path(path, n + 1)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    vgpu_store::stop_point::stop_point("carbon-log:shifted");
    std::fs::rename(path, rotated_path(path, 1))?;
    vgpu_store::stop_point::stop_point("carbon-log:rotated");
    Ok(())
}

/// Every decision in the log file at `path`, oldest first; a missing file or a damaged line
/// is an error.
pub fn read(path: &Path) -> Result<Vec<Decision>, LogError> {
    let missing = || LogError { path: path.to_path_buf(), source: std::io::ErrorKind::NotFound.into() };
    let text = read_text(path)?.ok_or_else(missing)?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(n, l)| {
            serde_json::from_str(l).map_err(|e| LogError {
                path: path.to_path_buf(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, format!("line {}: {e}", n + 1)),
            })
        })
        .collect()
}

/// The whole history, oldest first: the rotated files (`.keep` … `.1`) then the log; missing
/// files are skipped, and so are lines that are not decisions (a torn line), counted in the
/// second value.
pub fn read_history(path: &Path, keep: u32) -> Result<(Vec<Decision>, usize), LogError> {
    let mut decisions = Vec::new();
    let mut skipped = 0;
    let files = (1..=keep.max(1)).rev().map(|n| rotated_path(path, n)).chain([path.to_path_buf()]);
    for file in files {
        let Some(text) = read_text(&file)? else { continue };
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            match serde_json::from_str(line) {
                Ok(d) => decisions.push(d),
                Err(_) => skipped += 1,
            }
        }
    }
    Ok((decisions, skipped))
}

/// A log file's text; `None` when it does not exist. Never through a link.
fn read_text(path: &Path) -> Result<Option<String>, LogError> {
    let err = |source| LogError { path: path.to_path_buf(), source };
    let bytes = match vgpu_store::state::atomic::read_regular(path, 1 << 40) {
        Ok(bytes) => bytes,
        Err(vgpu_store::state::StateError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Ok(None)
        }
        Err(e) => return Err(err(std::io::Error::other(e.to_string()))),
    };
    Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(action: Action) -> Decision {
        Decision {
            time: Utc::now(),
            action,
            intensity: Some(300.0),
            intensity_source: None,
            budget_g_per_hour: Some(100.0),
            predicted_g_per_hour: Some(90.0),
            budget_met: Some(true),
            notes: vec![],
            gpus: vec![],
            reason: None,
            horizons: Vec::new(),
        }
    }

    #[test]
    fn appends_one_line_per_decision() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lib").join(LOG_FILE);
        append(&path, &decision(Action::Apply), Rotation::default()).unwrap();
        append(&path, &decision(Action::Reset), Rotation::default()).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 2);
        assert!(text.lines().next().unwrap().contains("\"action\":\"apply\""));
        let read = read(&path).unwrap();
        assert_eq!(read.iter().map(|d| d.action).collect::<Vec<_>>(), vec![Action::Apply, Action::Reset]);
    }

    #[test]
    fn unwritable_log_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "").unwrap();
        let err = append(&file.join(LOG_FILE), &decision(Action::Apply), Rotation::default()).unwrap_err().to_string();
        assert!(err.starts_with("cannot append to ") && err.contains(LOG_FILE), "{err}");
    }

    fn line_len() -> u64 {
        serde_json::to_vec(&decision(Action::Apply)).unwrap().len() as u64 + 1
    }

    fn lines(path: &Path) -> usize {
        std::fs::read_to_string(path).map(|t| t.lines().count()).unwrap_or(0)
    }

    #[test]
    fn a_full_log_is_rotated_keeping_whole_lines_and_the_newest_history() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOG_FILE);
        // Three lines fit, the fourth rotates.
        let rotation = Rotation { max_bytes: 3 * line_len() + 10, keep: 2 };
        for _ in 0..3 {
            append(&path, &decision(Action::Apply), rotation).unwrap();
        }
        assert!(!rotated_path(&path, 1).exists(), "not full yet");
        append(&path, &decision(Action::Reset), rotation).unwrap();
        assert_eq!((lines(&rotated_path(&path, 1)), lines(&path)), (3, 1));
        for _ in 0..6 {
            append(&path, &decision(Action::Apply), rotation).unwrap();
        }
        // 10 lines written, 3 per file: the log, .1 and .2 hold the newest 7 (or more), the
        // oldest dropped; no file is over the cap.
        for f in [path.clone(), rotated_path(&path, 1), rotated_path(&path, 2)] {
            assert!(std::fs::metadata(&f).unwrap().len() <= rotation.max_bytes, "{}", f.display());
        }
        assert!(!rotated_path(&path, 3).exists(), "only `keep` old files");
        let (history, skipped) = read_history(&path, rotation.keep).unwrap();
        assert_eq!((history.len(), skipped), (3 + 3 + 1, 0));
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777, LOG_MODE);
    }

    #[test]
    fn history_is_read_oldest_first_across_the_rotated_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOG_FILE);
        let rotation = Rotation { max_bytes: line_len(), keep: 3 };
        for action in [Action::Apply, Action::Reset, Action::Apply] {
            append(&path, &decision(action), rotation).unwrap();
        }
        let (history, _) = read_history(&path, 3).unwrap();
        assert_eq!(history.iter().map(|d| d.action).collect::<Vec<_>>(), [Action::Apply, Action::Reset, Action::Apply]);
    }

    #[test]
    fn a_torn_last_line_does_not_swallow_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOG_FILE);
        std::fs::write(&path, "{\"time\":\"20").unwrap();
        append(&path, &decision(Action::Apply), Rotation::default()).unwrap();
        let (history, skipped) = read_history(&path, 1).unwrap();
        assert_eq!((history.len(), skipped), (1, 1));
    }

    #[test]
    fn a_rotation_killed_half_way_carries_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOG_FILE);
        let rotation = Rotation { max_bytes: line_len(), keep: 2 };
        // Killed after renaming the log to .1, before a new log was made.
        std::fs::write(rotated_path(&path, 1), serde_json::to_string(&decision(Action::Reset)).unwrap() + "\n").unwrap();
        append(&path, &decision(Action::Apply), rotation).unwrap();
        let (history, skipped) = read_history(&path, 2).unwrap();
        assert_eq!(history.iter().map(|d| d.action).collect::<Vec<_>>(), [Action::Reset, Action::Apply]);
        assert_eq!(skipped, 0);
    }

    #[test]
    fn a_link_in_place_of_the_log_is_refused_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, "").unwrap();
        let path = dir.path().join(LOG_FILE);
        std::os::unix::fs::symlink(&target, &path).unwrap();
        let err = append(&path, &decision(Action::Apply), Rotation::default()).unwrap_err().to_string();
        assert!(err.contains("symbolic link"), "{err}");
        assert_eq!(std::fs::read(&target).unwrap(), b"");
    }
}
