//! The decision log: one JSON object per line in `<lib_dir>/carbon.jsonl`, appended by every
//! `apply` and `reset`, so that anyone can audit what was capped, when and why.

use std::io::Write as _;
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
        }
    }
}

#[derive(Debug, Error)]
#[error("cannot append to {}: {source}", .path.display())]
pub struct LogError {
    pub path: PathBuf,
    pub source: std::io::Error,
}

/// Append `decision` as one line (one `write` of the whole line, so concurrent writers
/// do not interleave within a line).
pub fn append(path: &Path, decision: &Decision) -> Result<(), LogError> {
    let err = |source| LogError { path: path.to_path_buf(), source };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    let mut line = serde_json::to_vec(decision).map_err(|e| err(e.into()))?;
    line.push(b'\n');
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(err)?;
    file.write_all(&line).map_err(err)
}

/// Every decision in the log, oldest first (for `report`-style readers and tests).
pub fn read(path: &Path) -> Result<Vec<Decision>, LogError> {
    let text = std::fs::read_to_string(path).map_err(|source| LogError { path: path.to_path_buf(), source })?;
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
        }
    }

    #[test]
    fn appends_one_line_per_decision() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lib").join(LOG_FILE);
        append(&path, &decision(Action::Apply)).unwrap();
        append(&path, &decision(Action::Reset)).unwrap();
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
        let err = append(&file.join(LOG_FILE), &decision(Action::Apply)).unwrap_err().to_string();
        assert!(err.starts_with("cannot append to ") && err.contains(LOG_FILE), "{err}");
    }
}
