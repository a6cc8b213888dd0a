//! The carbon side of vgpu, end to end: intensity sources, `vgpu carbon plan/apply/reset`
//! through the simulated driver's clocks, daily and monthly budgets, clocks that follow the
//! work, `carbon profile`, `carbon report` on a history database, the decision log, and
//! `vgpu run --gpus MIN-MAX`. They run the real `vgpu` binary against the simulated driver
//! (`common::Sim`).
//!
//! An area of the integration harness (tests/integration.rs): each file of tests/carbon/ is
//! a module here. This area: `cargo test --test integration carbon::`; one file's tests:
//! `cargo test --test integration carbon::carbon_budget::`.


#[path = "carbon/carbon_intensity.rs"]
mod carbon_intensity;
#[path = "carbon/carbon_apply.rs"]
mod carbon_apply;
#[path = "carbon/carbon_budget.rs"]
mod carbon_budget;
#[path = "carbon/carbon_follow.rs"]
mod carbon_follow;
#[path = "carbon/carbon_profile.rs"]
mod carbon_profile;
#[path = "carbon/carbon_report.rs"]
mod carbon_report;
#[path = "carbon/carbon_log.rs"]
mod carbon_log;
#[path = "carbon/carbon_run.rs"]
mod carbon_run;
