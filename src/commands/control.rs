//! `vgpu suspend|resume|kill ID`: manual control of a workload through its cgroup.

use anyhow::{Context as _, Result};
use clap::Args;
use nix::sys::signal::Signal;

use crate::cgroup::{Cgroup, FreezerState, Layout};
use crate::context::Context;
use crate::state::{intent, Partitions, Store, SuspendedMemory, WorkloadState};

#[derive(Debug, Args)]
pub struct IdArgs {
    /// Workload id (a unique prefix is enough) or name
    #[arg(add = crate::cli::workload_candidates())]
    pub id: String,
}

#[derive(Debug, Args)]
pub struct KillArgs {
    /// Workload id (a unique prefix is enough) or name
    #[arg(add = crate::cli::workload_candidates())]
    pub id: String,
    /// Signal to send, by name or number
    #[arg(short, long, default_value = "TERM", add = crate::cli::signal_candidates())]
    pub signal: String,
}

#[derive(Debug, Args)]
pub struct ResumeArgs {
    /// Workload id (a unique prefix is enough) or name
    #[arg(add = crate::cli::workload_candidates())]
    pub id: String,
    /// When its memory (moved to host memory while suspended) does not fit back on the GPU
    /// yet: wait (up to DURATION, e.g. --wait=10m; default forever) instead of refusing
    #[arg(long, value_name = "DURATION", num_args = 0..=1, require_equals = true, default_missing_value = "forever")]
    pub wait: Option<String>,
}

/// `vgpu suspend ID`: its CUDA processes checkpointed where the driver can (device memory
/// to host memory), then its cgroup frozen.
pub fn suspend(ctx: &Context, args: &IdArgs) -> Result<()> {
    let store = Store::new(&ctx.state_dir, &ctx.lib_dir);
    let lock = store.lock()?;
    crate::lifecycle::reconcile_store(&store, &lock);
    let (workloads, _) = store.workloads();
    let w = crate::lifecycle::find(&workloads, &args.id)?.clone();
    if w.state == WorkloadState::Suspended {
        println!("{} ({}) is already suspended", w.name, w.id);
        return Ok(());
    }
    let cgroup = open_cgroup(&w)?;
    // The intent is recorded before anything is touched: if this command dies before the
    // record is written, the next reconcile undoes the suspension (restores, thaws).
    let intent = intent::begin(&store, intent::Op::Suspend, &[&w.id])?;
    let memory = crate::suspension::suspend(&cgroup).with_context(|| format!("suspending {} ({})", w.name, w.id))?;
    crate::stop_point::stop_point("suspend:frozen");
    let mut record = w.clone();
    record.set_suspended("manual".into(), memory.clone());
    store.write_workload(&record)?;
    intent.done();
    match memory {
        SuspendedMemory::Host => println!("suspended {} ({}): its device memory is in host memory", w.name, w.id),
        SuspendedMemory::Device { why } => println!("suspended {} ({}): frozen, its device memory held on the GPU ({why})", w.name, w.id),
    }
    Ok(())
}

/// `vgpu resume ID [--wait]`: thawed, and its memory restored if it was moved to host
/// memory, once that fits beside the others' again.
pub fn resume(ctx: &Context, args: &ResumeArgs) -> Result<()> {
    let limit = crate::commands::wait_limit(args.wait.as_deref())?;
    let store = Store::new(&ctx.state_dir, &ctx.lib_dir);
    let started = std::time::Instant::now();
    let mut said_waiting = false;
    loop {
        let lock = store.lock()?;
        crate::lifecycle::reconcile_store(&store, &lock);
        let (workloads, _) = store.workloads();
        let w = crate::lifecycle::find(&workloads, &args.id)?.clone();
        if let Some(reason) = w.suspended_reason.as_deref().filter(|r| r.starts_with("preempted")) {
            anyhow::bail!("{} ({}) is {reason}: it resumes by itself when its pool blocks are free again", w.name, w.id);
        }
        let cgroup = open_cgroup(&w)?;
        // A frozen cgroup is thawed whatever the record says.
        let frozen = cgroup.state().with_context(|| format!("reading the freezer state of {}", w.id))? != FreezerState::Thawed;
        if w.state != WorkloadState::Suspended && !frozen {
            println!("{} ({}) is not suspended", w.name, w.id);
            return Ok(());
        }
        let partitions = Partitions::load(&store.partitions_path())?;
        if let Err(reason) = crate::admission::check_fits_back(&w, &workloads, &partitions.partitions) {
            let Some(limit) = limit else {
                anyhow::bail!("cannot resume {} ({}): {reason} (`vgpu resume --wait` waits until it fits)", w.name, w.id);
            };
            if limit.is_some_and(|l| started.elapsed() >= l) {
                anyhow::bail!("cannot resume {} ({}): still waiting after {}: {reason}", w.name, w.id, humantime::format_duration(limit.unwrap_or_default()));
            }
            if !said_waiting {
                eprintln!("vgpu: waiting to resume {} ({}): {reason}…", w.name, w.id);
                said_waiting = true;
            }
            drop(lock);
            std::thread::sleep(crate::commands::WAIT_POLL);
            continue;
        }
        let intent = intent::begin(&store, intent::Op::Resume, &[&w.id])?;
        crate::suspension::resume(&cgroup, w.suspended_memory.as_ref()).with_context(|| format!("resuming {} ({})", w.name, w.id))?;
        crate::stop_point::stop_point("resume:thawed");
        let mut record = w.clone();
        record.set_resumed();
        store.write_workload(&record)?;
        intent.done();
        println!("resumed {} ({})", w.name, w.id);
        return Ok(());
    }
}

fn open_cgroup(w: &crate::state::Workload) -> Result<Cgroup> {
    let layout = Layout::detect().context("no cgroup filesystem is mounted")?;
    Cgroup::open_at(&layout, &w.cgroup_home, &w.cgroup).with_context(|| format!("workload {}", w.id))
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
    let cgroup = Cgroup::open_at(&layout, &w.cgroup_home, &w.cgroup).with_context(|| format!("workload {}", w.id))?;
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
