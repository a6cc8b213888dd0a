//! `vgpu suspend|resume|kill ID...`: manual control of workloads through their cgroups.
//! Every ID is resolved first (an unknown or ambiguous one is a usage error and nothing is
//! done); then each workload is acted on in turn, one line (or one `--json` element) each.

use anyhow::{Context as _, Result};
use clap::Args;
use nix::sys::signal::Signal;
use serde::Serialize;

use vgpu_cgroups::Cgroup;

use vgpu_cgroups::FreezerState;

use vgpu_cgroups::Layout;
use vgpu_host::context::Context;
use crate::output::print_json;
use vgpu_store::state::intent;
use vgpu_store::state::Partitions;
use vgpu_store::state::Store;
use vgpu_store::state::SuspendedMemory;
use vgpu_store::state::Workload;
use vgpu_store::state::WorkloadState;

#[derive(Debug, Args)]
pub struct IdArgs {
    /// Workload ids (a unique prefix is enough) or names; all are found (through sudo, each must run as the caller) before any is touched
    #[arg(value_name = "ID", required = true, add = crate::args::workload_candidates())]
    pub ids: Vec<String>,
    /// Print the outcome for each workload as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct KillArgs {
    /// Workload ids (a unique prefix is enough) or names; all are found (through sudo, each must run as the caller) before any is signalled
    #[arg(value_name = "ID", required = true, add = crate::args::workload_candidates())]
    pub ids: Vec<String>,
    /// Signal to send, by name or number
    #[arg(short, long, default_value = "TERM", add = crate::args::signal_candidates())]
    pub signal: String,
    /// Print the outcome for each workload as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ResumeArgs {
    /// Workload ids (a unique prefix is enough) or names; all are found (through sudo, each must run as the caller) before any is resumed
    #[arg(value_name = "ID", required = true, add = crate::args::workload_candidates())]
    pub ids: Vec<String>,
    /// When its memory (moved to host memory while suspended) does not fit back on the GPU
    /// yet: wait (up to DURATION, e.g. --wait=10m; default forever) instead of refusing
    #[arg(long, value_name = "DURATION", num_args = 0..=1, require_equals = true, default_missing_value = "forever")]
    pub wait: Option<String>,
    /// Print the outcome for each workload as JSON
    #[arg(long)]
    pub json: bool,
}

/// What happened to one workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Did {
    Suspended,
    AlreadySuspended,
    Resumed,
    NotSuspended,
    Signalled,
    Failed,
}

/// One workload's outcome, a line of the output (an element of `--json`'s `workloads`).
#[derive(Debug, Serialize)]
pub struct Outcome {
    pub id: String,
    pub name: String,
    pub result: Did,
    /// suspend: where its device memory is now (`host` or `device`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suspended_memory: Option<&'static str>,
    /// kill: the signal and how many processes got it, and whether it had to be thawed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process_count: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thawed: Option<bool>,
    /// The line a person reads (also the error, for `failed`).
    pub message: String,
}

impl Outcome {
    fn of(w: &Workload, result: Did, message: String) -> Outcome {
        Outcome { id: w.id.clone(), name: w.name.clone(), result, suspended_memory: None, signal: None, process_count: None, thawed: None, message }
    }
}

#[derive(Serialize)]
struct Outcomes<'a> {
    workloads: &'a [Outcome],
}

/// Every query resolved to one workload, or a usage error naming each that is not (nothing
/// is touched then). A workload named twice is acted on once.
fn resolve(workloads: &[Workload], queries: &[String]) -> Result<Vec<Workload>> {
    let mut found: Vec<Workload> = Vec::new();
    let mut errors = Vec::new();
    for q in queries {
        match vgpu_host::lifecycle::find(workloads, q) {
            Ok(w) if found.iter().any(|f| f.id == w.id) => {}
            Ok(w) => found.push(w.clone()),
            Err(e) => errors.push(e.to_string()),
        }
    }
    if !errors.is_empty() {
        vgpu_store::usage!("{}; nothing was changed", errors.join("; "));
    }
    Ok(found)
}

/// Print the outcomes (a line each, or JSON), and fail when any failed.
fn report(outcomes: &[Outcome], json: bool) -> Result<()> {
    if json {
        print_json(&Outcomes { workloads: outcomes })?;
    } else {
        for o in outcomes.iter().filter(|o| o.result != Did::Failed) {
            println!("{}", o.message);
        }
    }
    let failed: Vec<&str> = outcomes.iter().filter(|o| o.result == Did::Failed).map(|o| o.message.as_str()).collect();
    match failed.as_slice() {
        [] => Ok(()),
        _ => anyhow::bail!("{}", failed.join("; ")),
    }
}

/// A failed step as an outcome: its error and causes on one line.
fn failed(w: &Workload, e: anyhow::Error) -> Outcome {
    Outcome::of(w, Did::Failed, format!("{e:#}"))
}

/// `vgpu suspend ID...`: each one's CUDA processes checkpointed where the driver can
/// (device memory to host memory), then its cgroup frozen.
pub fn suspend(ctx: &Context, args: &IdArgs) -> Result<()> {
    let store = Store::new(&ctx.state_dir, &ctx.lib_dir);
    let lock = store.lock()?;
    vgpu_host::lifecycle::reconcile_store(&store, &lock);
    let (workloads, _) = store.workloads();
    let targets = resolve(&workloads, &args.ids)?;
    crate::commands::check_owned(&targets.iter().collect::<Vec<_>>(), "suspend")?;
    let outcomes: Vec<Outcome> = targets.iter().map(|w| suspend_one(&store, w).unwrap_or_else(|e| failed(w, e))).collect();
    drop(lock);
    report(&outcomes, args.json)
}

/// Who runs this `vgpu suspend`, for the workload's record: `root`, or the user who ran it
/// through sudo (`alice (through sudo)`; uid N when the name cannot be had).
fn suspender() -> String {
    match vgpu_store::identity::sudo_caller(std::env::var("SUDO_UID").ok().as_deref()) {
        Ok(Some(caller)) => format!("{} (through sudo)", caller.name),
        _ => "root".to_string(),
    }
}

/// Suspend one workload; call under the store lock.
fn suspend_one(store: &Store, w: &Workload) -> Result<Outcome> {
    if w.state == WorkloadState::Suspended {
        return Ok(Outcome::of(w, Did::AlreadySuspended, format!("{} ({}) is already suspended", w.name, w.id)));
    }
    let cgroup = open_cgroup(w)?;
    // The intent is recorded before anything is touched: if this command dies before the
    // record is written, the next reconcile undoes the suspension (restores, thaws).
    let intent = intent::begin(store, intent::Op::Suspend, &[&w.id])?;
    let (memory, checkpointed) = vgpu_host::suspension::suspend_counted(&cgroup).with_context(|| format!("suspending {} ({})", w.name, w.id))?;
    vgpu_store::stop_point::stop_point("suspend:frozen");
    let mut record = w.clone();
    record.set_suspended("manual".into(), memory.clone());
    record.suspended_by = Some(suspender());
    store.write_workload(&record)?;
    intent.done();
    let message = match &memory {
        SuspendedMemory::Host if checkpointed == 0 => format!("suspended {} ({}): frozen; it has no CUDA context, so no device memory to move", w.name, w.id),
        SuspendedMemory::Host => format!("suspended {} ({}): its device memory is in host memory", w.name, w.id),
        SuspendedMemory::Device { why } => format!("suspended {} ({}): frozen, its device memory held on the GPU ({why})", w.name, w.id),
    };
    let mut outcome = Outcome::of(w, Did::Suspended, message);
    outcome.suspended_memory = Some(memory.place());
    Ok(outcome)
}

/// `vgpu resume ID... [--wait]`: each thawed, and its memory restored if it was moved to
/// host memory, once that fits beside the others' again (in the order given).
pub fn resume(ctx: &Context, args: &ResumeArgs) -> Result<()> {
    let limit = crate::commands::wait_limit(args.wait.as_deref())?;
    let store = Store::new(&ctx.state_dir, &ctx.lib_dir);
    let targets = {
        let lock = store.lock()?;
        vgpu_host::lifecycle::reconcile_store(&store, &lock);
        let (workloads, _) = store.workloads();
        resolve(&workloads, &args.ids)?
    };
    crate::commands::check_owned(&targets.iter().collect::<Vec<_>>(), "resume")?;
    let started = std::time::Instant::now();
    let outcomes: Vec<Outcome> = targets.iter().map(|w| resume_one(&store, w, limit, started).unwrap_or_else(|e| failed(w, e))).collect();
    report(&outcomes, args.json)
}

/// Resume workload `target` (found by its exact id), waiting with `limit` as `--wait` says.
fn resume_one(store: &Store, target: &Workload, limit: Option<Option<std::time::Duration>>, started: std::time::Instant) -> Result<Outcome> {
    let mut said_waiting = false;
    loop {
        let lock = store.lock()?;
        vgpu_host::lifecycle::reconcile_store(store, &lock);
        let (workloads, _) = store.workloads();
        let Some(w) = workloads.iter().find(|w| w.id == target.id).cloned() else {
            anyhow::bail!("{} ({}) has ended", target.name, target.id);
        };
        if let Some(reason) = w.suspended_reason.as_deref().filter(|r| r.starts_with("preempted")) {
            anyhow::bail!("{} ({}) is {reason}: it resumes by itself when its pool blocks are free again", w.name, w.id);
        }
        let cgroup = open_cgroup(&w)?;
        // A frozen cgroup is thawed whatever the record says.
        let frozen = cgroup.state().with_context(|| format!("reading the freezer state of {}", w.id))? != FreezerState::Thawed;
        if w.state != WorkloadState::Suspended && !frozen {
            return Ok(Outcome::of(&w, Did::NotSuspended, format!("{} ({}) is not suspended", w.name, w.id)));
        }
        let partitions = Partitions::load(&store.partitions_path())?;
        if let Err(reason) = vgpu_store::admission::check_fits_back(&w, &workloads, &partitions.partitions) {
            let Some(limit) = limit else {
                anyhow::bail!("cannot resume {} ({}): {reason} (`vgpu resume --wait` waits until it fits)", w.name, w.id);
            };
            if limit.is_some_and(|l| started.elapsed() >= l) {
                anyhow::bail!("cannot resume {} ({}): still waiting after {}: {reason}", w.name, w.id, humantime::format_duration(limit.unwrap_or_default()));
            }
            if !said_waiting {
                vgpu_host::notice!("waiting to resume {} ({}): {reason}…", w.name, w.id);
                said_waiting = true;
            }
            drop(lock);
            std::thread::sleep(crate::commands::WAIT_POLL);
            continue;
        }
        let intent = intent::begin(store, intent::Op::Resume, &[&w.id])?;
        vgpu_host::suspension::resume(&cgroup, w.suspended_memory.as_ref()).with_context(|| format!("resuming {} ({})", w.name, w.id))?;
        vgpu_store::stop_point::stop_point("resume:thawed");
        let mut record = w.clone();
        record.set_resumed();
        store.write_workload(&record)?;
        intent.done();
        return Ok(Outcome::of(&w, Did::Resumed, format!("resumed {} ({})", w.name, w.id)));
    }
}

fn open_cgroup(w: &Workload) -> Result<Cgroup> {
    let layout = Layout::detect().context("no cgroup filesystem is mounted")?;
    Cgroup::open_at(&layout, &w.cgroup_home, &w.cgroup).with_context(|| format!("workload {}", w.id))
}

/// `vgpu kill [--signal SIG] ID...`: the signal to every process of each.
pub fn kill(ctx: &Context, args: &KillArgs) -> Result<()> {
    let signal = parse_signal(&args.signal)?;
    let store = Store::new(&ctx.state_dir, &ctx.lib_dir);
    let targets = {
        let lock = store.lock()?;
        vgpu_host::lifecycle::reconcile_store(&store, &lock);
        let (workloads, _) = store.workloads();
        resolve(&workloads, &args.ids)?
    };
    crate::commands::check_owned(&targets.iter().collect::<Vec<_>>(), "signal")?;
    let outcomes: Vec<Outcome> = targets.iter().map(|w| kill_one(&store, w, signal).unwrap_or_else(|e| failed(w, e))).collect();
    report(&outcomes, args.json)
}

fn kill_one(store: &Store, w: &Workload, signal: Signal) -> Result<Outcome> {
    let layout = Layout::detect().context("no cgroup filesystem is mounted")?;
    let cgroup = Cgroup::open_at(&layout, &w.cgroup_home, &w.cgroup).with_context(|| format!("workload {}", w.id))?;
    let count = cgroup.kill(signal).with_context(|| format!("signalling the processes of {}", w.id))?;
    let mut message = format!("sent {signal} to {count} process(es) of {} ({})", w.name, w.id);
    // A frozen process acts on a signal only once it runs again: one that asks it to end
    // thaws it (as `vgpu run` does when it relays one).
    let thawed = vgpu_store::supervise::TERMINATING.contains(&(signal as i32)) && vgpu_host::lifecycle::wake_to_terminate(store, &w.id, &w.cgroup)?;
    if thawed {
        message.push_str(&format!("; it was suspended: resumed so that it acts on {signal}"));
    }
    let mut outcome = Outcome::of(w, Did::Signalled, message);
    outcome.signal = Some(signal.as_str().to_string());
    outcome.process_count = Some(count);
    outcome.thawed = Some(thawed);
    Ok(outcome)
}

/// `TERM`, `SIGTERM`, `term` or `15`.
pub fn parse_signal(text: &str) -> Result<Signal> {
    if let Ok(n) = text.parse::<i32>() {
        return Signal::try_from(n).map_err(|_| vgpu_store::error::UsageError::new(format!("unknown signal {text}")).into());
    }
    let upper = text.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") { upper } else { format!("SIG{upper}") };
    name.parse::<Signal>().map_err(|_| vgpu_store::error::UsageError::new(format!("unknown signal {text}")).into())
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
