//! Carbon-budgeted clocks (SPEC 1.3, 4.5).
//!
//! * [`account`]: who used the energy the GPUs measured, and what it emitted (`carbon report`).
//!   [`report`]: `vgpu carbon report`'s window, from the history.
//! * [`intensity`]: where the grid's carbon intensity comes from (sources, cache, fallback).
//! * [`model`]: power and speed as functions of clock and GPU count.
//! * [`workload`]: the workloads planned for, and the seam the state store will feed.
//! * [`planner`]: the two-stage greedy planner (pure).
//! * [`horizon`]: a budget for a day or a month allotted across the forecast's slots (pure).
//! * [`apply`]: turning a plan into NVML locked clocks or power limits, idempotently.
//! * [`log`]: the decision log, `<lib_dir>/carbon.jsonl`.
//! * [`follow`]: re-planning at once when a workload starts or ends.
//! * [`host`]: what is planned with on this host (NVML devices, recorded workloads, the
//!   intensity now); [`range`]: stage 1 for `vgpu run --gpus MIN-MAX`.
//! * [`profile`]: `vgpu carbon profile`, a GPU's measured power and speed model;
//!   [`sensitivity`]: each workload's frequency sensitivity learned from the history.
//! * [`traces`]: a site's own intensity history as `benches/carbon_sim`'s traces.

pub mod fit;

pub mod account;
pub mod apply;
pub mod budget;
pub mod config;
pub mod horizon;
pub mod intensity;
pub mod log;
pub mod model;
pub mod planner;
pub mod traces;
pub mod workload;

/// Make the directory of a carbon file (the lib dir, normally made already) as the store
/// makes its directories ([`vgpu_store::state::dirs::ensure_dir`]: root's, 0755, checked), never
/// with the umask's mode.
pub fn create_dir(dir: &std::path::Path) -> std::io::Result<()> {
    vgpu_store::state::dirs::ensure_dir(dir, vgpu_store::state::dirs::DIR_MODE).map_err(|e| std::io::Error::other(e.to_string()))
}
