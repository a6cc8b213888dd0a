//! `vgpu suspend|resume|kill ID`: manual control of a workload through its cgroup.

use anyhow::{Context as _, Result};
use clap::Args;
use nix::sys::signal::Signal;

use crate::cgroup::{Cgroup, FreezerState, Layout};
use crate::context::Context;
use crate::state::{intent, Store, WorkloadState};

#[derive(Debug, Args)]
pub struct IdArgs {
    /// Workload id (a unique prefix is enough) or name
    pub id: String,
}

#[derive(Debug, Args)]
pub struct KillArgs {
    /// Workload id (a unique prefix is enough) or name
    pub id: String,
    /// Signal to send, by name or number
    #[arg(short, long, default_value = "TERM")]
    pub signal: String,
}

#[derive(Debug, Clone, Copy)]
pub enum Action {
    Suspend,
    Resume,
}

pub fn suspend_or_resume(ctx: &Context, args: &IdArgs, action: Action) -> Result<()> {
    let store = Store::new(&ctx.state_dir, &ctx.lib_dir);
    let lock = store.lock()?;
    crate::lifecycle::reconcile_store(&store, &lock);
    let (workloads, _) = store.workloads();
    let w = crate::lifecycle::find(&workloads, &args.id)?.clone();
    let layout = Layout::detect().context("no cgroup filesystem is mounted")?;
    let cgroup = Cgroup::open(&layout, &w.cgroup).with_context(|| format!("workload {}", w.id))?;
    let mut record = w.clone();
    // The intent is recorded before the freezer is touched: if this command dies before the
    // record is written, the next reconcile undoes a suspend and finishes a resume.
    let intent = match action {
        Action::Suspend => {
            if w.state == WorkloadState::Suspended {
                println!("{} ({}) is already suspended", w.name, w.id);
                return Ok(());
            }
            let intent = intent::begin(&store, intent::Op::Suspend, &[&w.id])?;
            cgroup.freeze().with_context(|| format!("suspending {}", w.id))?;
            crate::stop_point::stop_point("suspend:frozen");
            record.state = WorkloadState::Suspended;
            record.suspended_reason = Some("manual".into());
            intent
        }
        Action::Resume => {
            if let Some(reason) = w.suspended_reason.as_deref().filter(|r| r.starts_with("preempted")) {
                anyhow::bail!(
                    "{} ({}) is {reason}: it resumes by itself when its pool blocks are free again",
                    w.name,
                    w.id
                );
            }
            // A frozen cgroup is thawed whatever the record says.
            let frozen = cgroup.state().with_context(|| format!("reading the freezer state of {}", w.id))? != FreezerState::Thawed;
            if w.state != WorkloadState::Suspended && !frozen {
                println!("{} ({}) is not suspended", w.name, w.id);
                return Ok(());
            }
            let intent = intent::begin(&store, intent::Op::Resume, &[&w.id])?;
            cgroup.thaw().with_context(|| format!("resuming {}", w.id))?;
            crate::stop_point::stop_point("resume:thawed");
            if record.state == WorkloadState::Suspended {
                record.state = WorkloadState::Running;
            }
            record.suspended_reason = None;
            intent
        }
    };
    store.write_workload(&record)?;
    intent.done();
    let verb = match action {
        Action::Suspend => "suspended",
        Action::Resume => "resumed",
    };
    println!("{verb} {} ({})", w.name, w.id);
    Ok(())
}

pub fn kill(ctx: &Context, args: &KillArgs) -> Result<()> {
    let signal = parse_signal(&args.signal)?;
    let store = Store::new(&ctx.state_dir, &ctx.lib_dir);
    let lock = store.lock()?;
    crate::lifecycle::reconcile_store(&store, &lock);
    let (workloads, _) = store.workloads();
    let w = crate::lifecycle::find(&workloads, &args.id)?.clone();
    drop(lock);
    let layout = Layout::detect().context("no cgroup filesystem is mounted")?;
    let cgroup = Cgroup::open(&layout, &w.cgroup).with_context(|| format!("workload {}", w.id))?;
    let count = cgroup.kill(signal).with_context(|| format!("signalling the processes of {}", w.id))?;
    println!("sent {signal} to {count} process(es) of {} ({})", w.name, w.id);
    // A frozen process acts on a signal only once it runs again: one that asks it to end
    // thaws it (as `vgpu run` does when it relays one).
    if crate::supervise::TERMINATING.contains(&(signal as i32)) && crate::lifecycle::wake_to_terminate(&store, &w.id, &w.cgroup)? {
        println!("{} ({}) was suspended: resumed so that it acts on {signal}", w.name, w.id);
    }
    Ok(())
}

/// `TERM`, `SIGTERM`, `term` or `15`.
pub fn parse_signal(text: &str) -> Result<Signal> {
    if let Ok(n) = text.parse::<i32>() {
        return Signal::try_from(n).map_err(|_| crate::error::UsageError::new(format!("unknown signal {text}")).into());
    }
    let upper = text.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") { upper } else { format!("SIG{upper}") };
    name.parse::<Signal>().map_err(|_| crate::error::UsageError::new(format!("unknown signal {text}")).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals() {
        assert_eq!(parse_signal("TERM").unwrap(), Signal::SIGTERM);
        assert_eq!(parse_signal("sigkill").unwrap(), Signal::SIGKILL);
        assert_eq!(parse_signal("9").unwrap(), Signal::SIGKILL);
        assert!(parse_signal("NOPE").is_err());
        assert!(parse_signal("999").is_err());
    }
}
