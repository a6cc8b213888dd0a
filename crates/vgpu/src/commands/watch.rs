//! `vgpu watch`: run the enforcer in the foreground, logging to stderr (systemd's journal).
//! SIGHUP reloads the config; SIGTERM or SIGINT stops it (exit 0). Under systemd
//! (`Type=notify`) it says READY=1 after its first round, RELOADING=1 and READY=1 around a
//! reload, STOPPING=1, and WATCHDOG=1 after every round and while it waits.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use clap::Args;
use sd_notify::NotifyState;
use signal_hook::consts::signal::{SIGHUP, SIGINT, SIGTERM};

use vgpu_host::context::Context;
use vgpu_daemon::watch::journal;
use vgpu_daemon::watch::notify;
use vgpu_daemon::watch::Event;
use vgpu_daemon::watch::Level;
use vgpu_daemon::watch::Watch;

#[derive(Debug, Args)]
pub struct WatchArgs {}

pub fn run(ctx: &Context, _args: &WatchArgs) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        anyhow::bail!("vgpu watch must run as root: it reconciles the store, signals workloads and freezes cgroups");
    }
    // Before anything opens a descriptor: the endpoint's connection cap is sized from it.
    let nofile = match vgpu_host::fdlimit::raise() {
        Ok(n) => Event::debug(format!("descriptor limit {} (inherited {}, hard {})", n.soft, n.inherited, n.hard)),
        Err(e) => Event::warn(format!("cannot raise the descriptor limit: {e}; the metrics endpoint's connection cap is sized from the one inherited")),
    };
    let mut watch = Watch::start(ctx.clone())?;
    print(vec![nofile]);
    if let Some(addr) = watch.metrics_addr() {
        print(vec![Event::info(format!("metrics on http://{addr}/metrics"))]);
    }
    let signals = SignalRelay::start()?;
    // systemd's WatchdogSec: ping at half of it.
    let ping = sd_notify::watchdog_enabled().map(|timeout| timeout / 2);
    tracing::info!("vgpu watch started (pid {}, state {}, interval {})", std::process::id(), ctx.state_dir.display(), humantime::format_duration(watch.interval()));
    let mut ready = false;
    let stopped_by = 'rounds: loop {
        let started = Instant::now();
        print(watch.tick());
        if !ready {
            ready = true;
            tell(&[NotifyState::Ready]);
            print(vec![Event::info("ready")]);
        }
        if ping.is_some() {
            tell(&[NotifyState::Watchdog]);
        }
        // A reload does not start a round: the next is due one (new) interval after this one
        // started, so a burst of SIGHUPs cannot make the rounds run back to back.
        loop {
            let due = watch.next_round(started);
            match wait(&signals.rx, due, ping) {
                Wake::Round => break,
                Wake::Signal(SIGHUP) => reload(&mut watch),
                Wake::Signal(signal) => break 'rounds signal,
                Wake::Closed => break 'rounds 0,
            }
        }
    };
    tell(&[NotifyState::Stopping]);
    print(watch.shutdown());
    signals.stop();
    print(vec![Event::info(format!("stopped (signal {stopped_by})"))]);
    Ok(())
}

pub(crate) enum Wake {
    /// The next round is due.
    Round,
    Signal(i32),
    /// The signal relay is gone (it never is before `handle.close()`).
    Closed,
}

/// Wait until `due` or a signal, whichever first; a signal already pending wins over a round
/// that is already due. With a watchdog, ping it every `ping` meanwhile. (`vgpu watch`
/// and `vgpu service run` wait between their rounds with it.)
pub(crate) fn wait(rx: &Receiver<i32>, due: Instant, ping: Option<Duration>) -> Wake {
    loop {
        let left = due.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return match rx.try_recv() {
                Ok(signal) => Wake::Signal(signal),
                Err(TryRecvError::Empty) => Wake::Round,
                Err(TryRecvError::Disconnected) => Wake::Closed,
            };
        }
        match rx.recv_timeout(ping.map_or(left, |p| p.min(left))) {
            Ok(signal) => return Wake::Signal(signal),
            // The round pings when it is done; a slice that ends before it pings here.
            Err(RecvTimeoutError::Timeout) if ping.is_some() && Instant::now() < due => tell(&[NotifyState::Watchdog]),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return Wake::Closed,
        }
    }
}

/// SIGHUP: load the config again as at start. A config that does not load is one warning;
/// the running one stays.
fn reload(watch: &mut Watch) {
    // systemd 253+ pairs RELOADING=1 with the time it was sent; older ones ignore it.
    match NotifyState::monotonic_usec_now() {
        Ok(now) => tell(&[NotifyState::Reloading, now]),
        Err(_) => tell(&[NotifyState::Reloading]),
    }
    match Context::load(watch.context().origin.clone()) {
        Ok(new) => print(watch.reload(new)),
        Err(e) => print(vec![Event::warn(format!("kept the running config: {:#}", anyhow::Error::from(e)))]),
    }
    tell(&[NotifyState::Ready]);
}

/// SIGHUP, SIGINT and SIGTERM as messages on a channel, which a daemon's loop (`vgpu watch`,
/// `vgpu service run`) waits on with a timeout.
pub(crate) struct SignalRelay {
    pub rx: Receiver<i32>,
    handle: signal_hook::iterator::Handle,
    thread: std::thread::JoinHandle<()>,
}

impl SignalRelay {
    pub(crate) fn start() -> Result<SignalRelay> {
        let (tx, rx) = mpsc::channel::<i32>();
        let mut signals = signal_hook::iterator::Signals::new([SIGHUP, SIGINT, SIGTERM]).context("installing signal handlers")?;
        let handle = signals.handle();
        let thread = std::thread::spawn(move || {
            for signal in signals.forever() {
                if tx.send(signal).is_err() {
                    break;
                }
            }
        });
        Ok(SignalRelay { rx, handle, thread })
    }

    pub(crate) fn stop(self) {
        self.handle.close();
        let _ = self.thread.join();
    }
}

/// Events on stderr, as the daemon's log: what it did and found (unless `-q`), and with
/// `-vv` the rounds it skipped.
fn print(events: Vec<Event>) {
    print_as(None, events)
}

/// [`print`] for a daemon whose lines carry its name (`vgpu service run: …`).
pub(crate) fn print_as(daemon: Option<&str>, events: Vec<Event>) {
    for e in events {
        let shown = match e.level {
            Level::Warn | Level::Info => tracing::enabled!(tracing::Level::WARN),
            Level::Debug => tracing::enabled!(tracing::Level::DEBUG),
        };
        if shown {
            match daemon {
                Some(name) => journal::write_as(name, e.level, &e.message),
                None => journal::write(e.level, &e.message),
            }
        }
    }
}

/// Tell systemd (`Type=notify`); nothing happens outside systemd.
pub(crate) fn tell(state: &[NotifyState]) {
    if let Err(e) = notify::send(state) {
        tracing::debug!("sd_notify: {e}");
    }
}
