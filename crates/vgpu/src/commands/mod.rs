//! One module per subcommand: each is thin and calls into the library crates. The command
//! line that routes to them is `cli`; their shared argument types are `args`.

pub mod carbon;
pub mod completions;
pub mod control;
pub mod devices;
pub mod doctor;
pub mod partition;
pub mod pool;
pub mod ps;
pub mod run;
pub mod service;
pub mod service_run;
pub mod slurm;
pub mod update;
pub mod watch;

use anyhow::Result;


/// Through sudo by a user other than root, `vgpu update|suspend|resume|kill` act only on
/// the caller's own workloads (those whose record runs them as the caller, whoever started
/// them); root (no sudo, or root's own) acts on any. Every target is checked before any is
/// touched: one that is not the caller's is a usage error (one line, exit 2) and nothing is
/// changed. `verb` names the action ("suspend").
pub(crate) fn check_owned(targets: &[&vgpu_store::state::Workload], verb: &str) -> Result<()> {
    let sudo_uid = std::env::var("SUDO_UID").ok();
    let caller = vgpu_store::identity::sudo_caller(sudo_uid.as_deref()).map_err(|e| vgpu_store::error::UsageError::new(e.to_string()))?;
    let Some(caller) = caller else { return Ok(()) };
    if let Some(w) = targets.iter().find(|w| w.user.uid != caller.uid) {
        vgpu_store::usage!(
            "{} ({}) runs as {}: started through sudo by {}, you may {verb} only your own workloads (root may {verb} any); nothing was changed",
            w.name,
            w.id,
            w.user.name,
            caller.name
        );
    }
    Ok(())
}

pub use vgpu_host::launch::WAIT_POLL;

/// `--wait[=DURATION]`: None without the flag (refuse instead of waiting); Some(None)
/// without a value (wait forever); Some(Some(limit)).
pub fn wait_limit(text: Option<&str>) -> Result<Option<Option<std::time::Duration>>> {
    match text {
        None => Ok(None),
        Some("forever") => Ok(Some(None)),
        Some(text) => humantime::parse_duration(text)
            .map(|d| Some(Some(d)))
            .map_err(|e| vgpu_store::error::UsageError::new(format!("--wait {text:?}: {e}")).into()),
    }
}
