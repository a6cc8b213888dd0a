//! The workload's first process: started into its cgroup, waited for, and everything the
//! workload held removed after it.

use std::path::Path;
use std::process::ExitStatus;

use vgpu_store::supervise::Spawned;

use anyhow::{Context as _, Result};

use vgpu_cgroups::Layout;
use crate::context::Context;
use vgpu_store::state::Store;
use vgpu_store::state::Workload;
use vgpu_store::state::WorkloadState;

use super::{workload_env, Launched, Request};

/// Spawn the workload's command into its cgroup, as its user, and record its pid; with the
/// state its record has then (running, or suspended by a preemption meanwhile).
pub fn start(ctx: &Context, store: &Store, shim: &Path, launched: &Launched, request: &Request) -> Result<(Spawned, WorkloadState)> {
    let w = &launched.workload;
    let env = workload_env(ctx, store, shim, w, request)?;
    let procs = launched.cgroup.self_join_files().context("opening the cgroup's process lists")?;
    let launch = vgpu_store::supervise::Launch {
        argv: request.argv.clone(),
        env,
        cwd: request.cwd.clone(),
        user: request.user.clone(),
        cgroup_procs: procs,
    };
    // Clocks follow the work: its GPUs are re-planned (raised) before its first kernel.
    crate::carbon::follow::replan_now(ctx, store, &crate::carbon::follow::Change::started(&w.id)).log();
    let child = vgpu_store::supervise::spawn(launch).map_err(|e| {
        // The child enters --cwd as the user, after its privilege drop: a directory removed
        // or closed since it was checked fails there, and its error is not the program's.
        if let Some(Err(refused)) = request.cwd.as_deref().map(|dir| super::resolve::check_cwd_as(&request.user, dir)) {
            return refused;
        }
        match vgpu_store::error::NotRunnable::from_spawn(&request.argv[0], &e) {
            Some(not_runnable) => anyhow::Error::new(not_runnable),
            None => anyhow::Error::new(e).context(format!("cannot start {}", request.argv[0])),
        }
    })?;
    vgpu_store::stop_point::stop_point("run:spawned");
    let state = {
        // Re-read: a preemption may have changed the record since admission.
        let _lock = store.lock()?;
        let mut record = Workload::read(&store.workload_path(&w.id)).unwrap_or_else(|_| w.clone());
        record.pid = Some(child.id());
        if record.state == WorkloadState::Starting {
            record.state = WorkloadState::Running;
        }
        store.write_workload(&record)?;
        record.state
    };
    Ok((child, state))
}

/// Wait for the workload's first process, relaying the signals vgpu gets to it (resuming a
/// suspended workload first, so that it can act on them).
/// `state`: its record's when it started ([`start`]); `caught`: the signals caught before
/// the workload was spawned.
pub fn supervise(store: &Store, w: &Workload, state: WorkloadState, child: &mut Spawned, caught: vgpu_store::supervise::CaughtSignals) -> Result<ExitStatus> {
    let wake = {
        let (store, id, name, cgroup, unit) = (store.clone(), w.id.clone(), w.name.clone(), w.cgroup.clone(), w.cgroup_home.unit.clone());
        move |signal: i32, sender: Option<i32>| {
            if let Some(sender) = sender {
                crate::notice!("{}", relayed(signal, sender, unit.as_deref(), &name, &id));
            }
            match crate::lifecycle::wake_to_terminate(&store, &id, &cgroup) {
                Ok(true) => crate::notice!("{name} ({id}) was suspended: resumed so that it acts on signal {signal}"),
                Ok(false) => {}
                Err(e) => tracing::warn!("cannot resume suspended {name} ({id}) to deliver signal {signal}: {e:#}"),
            }
        }
    };
    let mut told = super::told::Told::new(store, w, state);
    let status = vgpu_store::supervise::wait_relaying_signals(child, caught, wake, super::told::LOOK_EVERY, || told.look()).context("waiting for the workload");
    // One last look: a resumption just before the end is said.
    told.look();
    status
}

/// What `vgpu run` says when another process asks its workload to end: who, and that the
/// signal went on to the workload. From systemd (pid 1) to a workload in a unit's cgroup,
/// the unit is named: that is `systemctl stop` (or `kill`) of it, which under a real
/// systemd otherwise ended a workload with no word from vgpu.
fn relayed(signal: i32, sender: i32, unit: Option<&str>, name: &str, id: &str) -> String {
    let signal = nix::sys::signal::Signal::try_from(signal).map(|s| s.as_str().to_string()).unwrap_or_else(|_| format!("signal {signal}"));
    match (sender, unit) {
        (1, Some(unit)) => format!("systemd sent {signal} to {unit} (systemctl stop or kill): relayed to {name} ({id})"),
        (1, None) => format!("{signal} from systemd (pid 1): relayed to {name} ({id})"),
        _ => {
            let comm = std::fs::read_to_string(format!("/proc/{sender}/comm")).map(|c| format!(" ({})", c.trim())).unwrap_or_default();
            format!("{signal} from pid {sender}{comm}: relayed to {name} ({id})")
        }
    }
}

/// Record in the history that the workload ended, and how (best effort: a failure is a
/// warning). It is recorded there too when it ended before the watch saw it. `history`: the
/// history as opened while the workload ran ([`vgpu_history::Ahead::open`]), if it was: the
/// record is made on its thread, while the caller removes the workload ([`finish`]); the
/// result ([`vgpu_history::Pending::wait`]) is the connection, to read its use back through,
/// and whether there is any ([`Ended`]).
pub fn record_end(ctx: &Context, w: &Workload, result: &Result<u8>, history: Option<vgpu_history::Ahead>) -> vgpu_history::Pending<Ended> {
    let (now, outcome) = (vgpu_store::clock::now_ms(), outcome(result));
    let info = vgpu_history::store::WorkloadInfo::of(w);
    let history = history.unwrap_or_else(|| vgpu_history::Ahead::none(&ctx.lib_dir, &ctx.config.history));
    history.begin("the workload's end", move |h| {
        h.record_ended(&info, now, Some(&outcome))?;
        // Kept to read the workload's use back (its last line): one open, not two.
        let reader = vgpu_history::query::Reader::from_history(h);
        let metered = reader.has_gpu_time(&info.id);
        Ok(Ended { reader, metered })
    })
}

/// How the workload ended, as the history's `outcome` says it.
pub fn outcome(result: &Result<u8>) -> String {
    match result {
        Ok(code) => format!("exit {code}"),
        Err(e) => format!("failed: {e}"),
    }
}

/// A running `vgpu watch` records the history this command would write
/// (`vgpu_store::state::ended`): its GPU list is current and names this history. With
/// when it last marked the list (the end of its latest round).
pub fn watch_records_history(ctx: &Context, store: &Store) -> Option<std::time::SystemTime> {
    if !ctx.config.history.enabled {
        return None;
    }
    let current = vgpu_store::state::inventory::current_list(store, ctx.simulate, std::time::SystemTime::now()).ok()?;
    records_history(ctx, &current)
}

/// [`watch_records_history`] of a list already found current (`Context::host_gpus`).
pub fn records_history(ctx: &Context, current: &vgpu_store::state::inventory::Current) -> Option<std::time::SystemTime> {
    let recorded = ctx.config.history.enabled && current.published.history.as_deref() == Some(ctx.lib_dir.as_path());
    recorded.then_some(current.marked)
}

/// A workload's end as recorded in the history ([`record_end`]): the connection that
/// recorded it, and whether any GPU time is recorded for the workload (`Ok(false)`: it used
/// nothing the history accounts, and its use need not be read).
pub struct Ended {
    pub reader: vgpu_history::query::Reader,
    pub metered: Result<bool, vgpu_history::db::HistoryError>,
}

/// On every exit path: kill what is left in the cgroup, remove it, the vGPU and the record,
/// give back the workload's pool blocks, and re-plan the clocks without it. `note`: the
/// workload's end, left for the watch to record (`vgpu_store::state::ended`) under the
/// same lock, before the record goes; whether it was left (else the caller records the
/// end itself).
pub fn finish(ctx: &Context, store: &Store, layout: &Layout, w: &Workload, note: Option<&vgpu_store::state::ended::EndNote>) -> (Result<()>, bool) {
    let lock = match store.lock() {
        Ok(lock) => lock,
        Err(e) => return (Err(e.into()), false),
    };
    let left = match note.map(|n| vgpu_store::state::ended::leave(store, &lock, n)) {
        Some(Ok(_)) => true,
        Some(Err(e)) => {
            tracing::debug!("workload {} ({}): its end cannot be left for vgpu watch ({e}); recorded here", w.name, w.id);
            false
        }
        None => false,
    };
    let torn_down = (|| {
        crate::lifecycle::teardown(store, w, Some(layout))?;
        crate::lifecycle::reclaim_vgpu(store, &w.vgpu);
        // Only a workload that holds pool blocks touches the pool's state (a damaged pool.json
        // must not fail the others).
        if w.pool_blocks.is_some() {
            crate::pool_effects::release(store, &lock, &w.id)?;
        }
        Ok(())
    })();
    drop(lock);
    if torn_down.is_ok() {
        crate::carbon::follow::replan_now(ctx, store, &crate::carbon::follow::Change::ended(&[&w.id])).log();
    }
    (torn_down, left)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_relayed_signal_names_who_sent_it() {
        assert_eq!(
            super::relayed(15, 1, Some("vgpu-1a2b3c4d.scope"), "train", "1a2b3c4d"),
            "systemd sent SIGTERM to vgpu-1a2b3c4d.scope (systemctl stop or kill): relayed to train (1a2b3c4d)"
        );
        assert_eq!(super::relayed(2, 1, None, "train", "1a2b3c4d"), "SIGINT from systemd (pid 1): relayed to train (1a2b3c4d)");
        let me = std::process::id() as i32;
        let said = super::relayed(1, me, None, "train", "1a2b3c4d");
        assert!(said.starts_with(&format!("SIGHUP from pid {me} (")) && said.ends_with("): relayed to train (1a2b3c4d)"), "{said}");
    }
}
