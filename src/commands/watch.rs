//! `vgpu watch`: run the enforcer in the foreground, logging to stderr (systemd's journal).
//! SIGHUP reloads the config; SIGTERM or SIGINT stops it.

use std::sync::mpsc;
use std::time::Instant;

use anyhow::{Context as _, Result};
use clap::Args;
use signal_hook::consts::signal::{SIGHUP, SIGINT, SIGTERM};

use crate::context::Context;
use crate::watch::{Event, Level, Watch};

#[derive(Debug, Args)]
pub struct WatchArgs {}

pub fn run(ctx: &Context, _args: &WatchArgs) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        anyhow::bail!("vgpu watch must run as root: it reconciles the store, signals workloads and freezes cgroups");
    }
    let mut watch = Watch::start(ctx.clone())?;
    if let Some(addr) = watch.metrics_addr() {
        print(vec![Event::info(format!("metrics on http://{addr}/metrics"))]);
    }
    let (tx, rx) = mpsc::channel::<i32>();
    let mut signals = signal_hook::iterator::Signals::new([SIGHUP, SIGINT, SIGTERM]).context("installing signal handlers")?;
    let handle = signals.handle();
    let relay = std::thread::spawn(move || {
        for signal in signals.forever() {
            if tx.send(signal).is_err() {
                break;
            }
        }
    });
    tracing::info!("vgpu watch started (pid {}, state {}, interval {})", std::process::id(), ctx.state_dir.display(), humantime::format_duration(watch.interval()));
    let mut ready = false;
    let stopped_by = loop {
        let started = Instant::now();
        print(watch.tick());
        if !ready {
            ready = true;
            notify(&[sd_notify::NotifyState::Ready]);
            if tracing::enabled!(tracing::Level::WARN) {
                eprintln!("vgpu watch: ready");
            }
        }
        let next = watch.next_round(started);
        match rx.recv_timeout(next.saturating_duration_since(Instant::now())) {
            Ok(SIGHUP) => {
                notify(&[sd_notify::NotifyState::Reloading]);
                match Context::load(watch.context().origin.clone()) {
                    Ok(new) => print(watch.reload(new)),
                    Err(e) => eprintln!("vgpu watch: warning: kept the running config: {e}"),
                }
                notify(&[sd_notify::NotifyState::Ready]);
            }
            Ok(signal) => break signal,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break 0,
        }
    };
    notify(&[sd_notify::NotifyState::Stopping]);
    print(watch.shutdown());
    handle.close();
    let _ = relay.join();
    eprintln!("vgpu watch: stopped (signal {stopped_by})");
    Ok(())
}

/// Events on stderr, as the daemon's log: what it did (unless `-q`), warnings, and with
/// `-vv` the rounds it skipped.
fn print(events: Vec<Event>) {
    for e in events {
        match e.level {
            Level::Warn => tracing::warn!("{}", e.message),
            Level::Info if tracing::enabled!(tracing::Level::WARN) => eprintln!("vgpu watch: {}", e.message),
            Level::Info => {}
            Level::Debug => tracing::debug!("{}", e.message),
        }
    }
}

/// Tell systemd (`Type=notify`); nothing happens outside systemd.
fn notify(state: &[sd_notify::NotifyState]) {
    if let Err(e) = sd_notify::notify(state) {
        tracing::debug!("sd_notify: {e}");
    }
}
