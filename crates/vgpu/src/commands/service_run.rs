//! `vgpu service run NAME`: run one service's replicas in the foreground, as `vgpu watch`
//! runs every service (`vgpu_daemon::service::runner`), for `vgpu-service@NAME.service`. It holds
//! the service's lock, so the watch leaves the service to it. SIGTERM or SIGINT stops the
//! replicas (SIGTERM, SIGKILL after the service's grace) and it (exit 0); SIGHUP reloads the
//! config. Under systemd (`Type=notify`) it says READY=1 after its first round, STOPPING=1,
//! and WATCHDOG=1 each round when the unit has a watchdog.

use std::time::Instant;

use anyhow::{Context as _, Result};
use clap::Args;
use sd_notify::NotifyState;
use signal_hook::consts::signal::SIGHUP;

use vgpu_host::context::Context;
use vgpu_daemon::service::runner::Runner;
use crate::commands::watch::print_as;
use crate::commands::watch::tell;
use crate::commands::watch::wait;
use crate::commands::watch::SignalRelay;
use crate::commands::watch::Wake;
use vgpu_daemon::watch::Event;

#[derive(Debug, Args)]
pub struct ServiceRunArgs {
    /// The service (/var/lib/vgpu/services/NAME.toml)
    pub name: String,
}

const DAEMON: &str = "vgpu service run";

pub fn run(ctx: &Context, args: &ServiceRunArgs) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        anyhow::bail!("vgpu service run must run as root: it starts the replicas with vgpu run");
    }
    // Through sudo by a user other than root: its replicas' `vgpu run` would inherit the
    // caller's SUDO_UID and be refused (--service, --report-fd) in a restart loop, while it
    // held the service's lock, keeping the watch off a service that may not be the caller's.
    if std::env::var("SUDO_UID").ok().is_some_and(|uid| uid != "0") {
        vgpu_store::usage!("vgpu service run is root's daemon, not for sudo: `systemctl start vgpu-service@{}` runs the service (or `vgpu watch` does)", args.name);
    }
    let mut runner = Runner::one(ctx, &args.name).with_context(|| format!("cannot run service {}", args.name))?;
    leave_the_unit_root(ctx)?;
    let signals = SignalRelay::start()?;
    // systemd's WatchdogSec: ping at half of it, as `vgpu watch` does.
    let ping = sd_notify::watchdog_enabled().map(|timeout| timeout / 2);
    let mut ctx = ctx.clone();
    print(vec![Event::info(format!(
        "running service {} (pid {}, interval {})",
        args.name,
        std::process::id(),
        humantime::format_duration(ctx.config.watch.interval)
    ))]);
    let mut ready = false;
    let stopped_by = 'rounds: loop {
        let started = Instant::now();
        let mut events = Vec::new();
        runner.tick(&mut events);
        print(events);
        if !ready {
            ready = true;
            tell(&[NotifyState::Ready]);
            print(vec![Event::info("ready")]);
        }
        if ping.is_some() {
            tell(&[NotifyState::Watchdog]);
        }
        if runner.is_empty() {
            print(vec![Event::info(format!("service {} was removed: nothing left to run", args.name))]);
            break 0;
        }
        loop {
            let due = started + ctx.config.watch.interval;
            match wait(&signals.rx, due, ping) {
                Wake::Round => break,
                Wake::Signal(SIGHUP) => match Context::load(ctx.origin.clone()) {
                    Ok(new) => {
                        ctx = Context { state_dir: ctx.state_dir.clone(), lib_dir: ctx.lib_dir.clone(), ..new };
                        runner.reload(&ctx);
                        print(vec![Event::info("reloaded the config")]);
                    }
                    Err(e) => print(vec![Event::warn(format!("kept the running config: {:#}", anyhow::Error::from(e)))]),
                },
                Wake::Signal(signal) => break 'rounds signal,
                Wake::Closed => break 'rounds 0,
            }
        }
    };
    tell(&[NotifyState::Stopping]);
    print(runner.stop());
    signals.stop();
    print(vec![Event::info(format!("stopped (signal {stopped_by})"))]);
    Ok(())
}

/// In a delegated unit (`vgpu-service@NAME.service`, `Delegate=yes`) on cgroup v2, move to
/// the unit's `supervisor` leaf, as each replica's `vgpu run` does before it makes its
/// workload's cgroup: the unit's own cgroup must hold no process to hand controllers down.
fn leave_the_unit_root(ctx: &Context) -> Result<()> {
    let Some(layout) = vgpu_cgroups::Layout::detect() else { return Ok(()) };
    let choice = vgpu_cgroups::home::choose(&layout, ctx.config.cgroup.manager).context("choosing the cgroup manager")?;
    if choice.home.manager == vgpu_cgroups::ManagerKind::Delegated {
        vgpu_cgroups::home::prepare(&layout, &choice.home).context("moving to the unit's supervisor cgroup")?;
    }
    Ok(())
}

/// Events on stderr (the journal under systemd) as `vgpu service run: …`, unless `-q`;
/// debug ones with `-vv`.
fn print(events: Vec<Event>) {
    print_as(Some(DAEMON), events)
}
