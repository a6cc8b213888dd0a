//! The systemd cgroup manager's one call: ask systemd, over its D-Bus API, for a transient
//! scope unit with `Delegate=yes` holding this process (`org.freedesktop.systemd1.Manager.
//! StartTransientUnit`, as podman's and crun's systemd cgroup managers do), and wait,
//! bounded, until its job is done (the `JobRemoved` signal).
//!
//! The scope gets vgpu's own pid, not the workload's: the workload joins its cgroup between
//! fork and exec through `cgroup.procs` files opened before (`launch/child.rs`), so its
//! cgroup must exist before it does, and a scope cannot be created empty. With vgpu in the
//! scope and the scope delegated, the workload's cgroup is `<scope>/vgpu/<id>`, made and
//! limited by the same code as for a `Delegate=yes` service (`home.rs`): limits are written
//! to its files, not set as unit properties, so they are the workload's alone (not vgpu's),
//! `vgpu update` changes them live the same way on every manager, and no further D-Bus call
//! is needed. `systemctl stop vgpu-<id>.scope` stops vgpu and the workload together (vgpu
//! relays the SIGTERM and tears down); the scope ends by itself when both are gone.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use zbus::blocking::{Connection, MessageIterator};
use zbus::message::Type;
use zbus::zvariant::{OwnedObjectPath, Value};
use zbus::MatchRule;

use super::error::{CgroupError, Result};

/// Test-only (and for a bus elsewhere): the D-Bus address of "systemd" instead of the system
/// bus, e.g. `unix:path=/tmp/bus` (tests/systemd_cgroup.rs runs a stand-in there). Only a
/// `unix:` socket: D-Bus addresses also name programs to run (`unixexec:`) and TCP peers,
/// neither of which root's vgpu should reach from an environment variable. `vgpu run`
/// refuses it through sudo.
pub const ENV_BUS: &str = "VGPU_SYSTEMD_BUS";

/// How long a `vgpu run` waits for systemd to make the scope.
pub const TIMEOUT: Duration = Duration::from_secs(10);

const DESTINATION: &str = "org.freedesktop.systemd1";
const PATH: &str = "/org/freedesktop/systemd1";
const MANAGER: &str = "org.freedesktop.systemd1.Manager";

/// The scope unit of workload `id`.
pub fn scope_name(id: &str) -> String {
    format!("vgpu-{id}.scope")
}

fn failed(what: &str, e: impl std::fmt::Display) -> CgroupError {
    CgroupError::Manager { reason: format!("systemd over D-Bus: {what}: {e}") }
}

/// `address` if it names a unix socket (`unix:path=…`, `unix:abstract=…`), the only kind
/// [`ENV_BUS`] may give.
fn unix_address(address: &str) -> std::result::Result<&str, String> {
    // One address (`;` separates alternatives), of the unix transport.
    if address.starts_with("unix:") && !address.contains(';') {
        Ok(address)
    } else {
        Err(format!("{ENV_BUS}={address:?}: give a unix socket address, e.g. unix:path=/run/test-bus"))
    }
}

/// Connects within `timeout`: zbus bounds method calls (`method_timeout`) but not the
/// connection's own handshake (authentication, `Hello`), which waits as long as a bus that
/// accepted the socket says nothing. So the handshake runs on a thread of its own; should it
/// not end in time, that thread is left blocked on its socket (it ends with the process) and
/// the caller gets an error (under `auto`, vgpu goes on with cgroupfs).
fn connect(timeout: Duration) -> Result<Connection> {
    connect_to(std::env::var(ENV_BUS).ok().filter(|a| !a.is_empty()), timeout)
}

/// [`connect`] to `address` (`None`: the system bus).
fn connect_to(address: Option<String>, timeout: Duration) -> Result<Connection> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("vgpu-dbus-connect".into())
        .spawn(move || {
            let _ = tx.send(connect_unbounded(address, timeout));
        })
        .map_err(|e| failed("cannot start a thread to connect", e))?;
    match rx.recv_timeout(timeout) {
        Ok(outcome) => outcome,
        Err(_) => Err(failed("cannot connect", format!("the bus did not complete the handshake within {timeout:?}"))),
    }
}

fn connect_unbounded(address: Option<String>, timeout: Duration) -> Result<Connection> {
    let builder = match address {
        Some(address) => {
            let address = unix_address(&address).map_err(|reason| CgroupError::Manager { reason })?;
            zbus::blocking::connection::Builder::address(address).map_err(|e| failed(&format!("{ENV_BUS}={address:?}"), e))?
        }
        None => zbus::blocking::connection::Builder::system().map_err(|e| failed("the system bus", e))?,
    };
    builder.method_timeout(timeout).build().map_err(|e| failed("cannot connect", e))
}

/// Whether systemd answers on the bus (`org.freedesktop.DBus.Peer.Ping`), for `vgpu doctor`.
pub fn ping(timeout: Duration) -> Result<()> {
    let conn = connect(timeout)?;
    let outcome = conn
        .call_method(Some(DESTINATION), PATH, Some("org.freedesktop.DBus.Peer"), "Ping", &())
        .map(|_| ())
        .map_err(|e| failed("Ping", e));
    let _ = conn.close();
    outcome
}

/// Starts the transient scope `unit` holding process `pid`, with `Delegate=yes`, and waits
/// until systemd reports its job done (at most `timeout`).
pub fn start_scope(unit: &str, pid: u32, description: &str, timeout: Duration) -> Result<()> {
    let conn = connect(timeout)?;
    let outcome = start_on(&conn, unit, pid, description, timeout);
    // Ends the listener thread too: it holds the same connection.
    let _ = conn.close();
    outcome
}

fn start_on(conn: &Connection, unit: &str, pid: u32, description: &str, timeout: Duration) -> Result<()> {
    // systemd emits job signals only to clients that subscribed; listen before asking, so
    // a job done before the reply arrives is not missed.
    conn.call_method(Some(DESTINATION), PATH, Some(MANAGER), "Subscribe", &()).map_err(|e| failed("Subscribe", e))?;
    let rule = MatchRule::builder()
        .msg_type(Type::Signal)
        .interface(MANAGER)
        .and_then(|b| b.member("JobRemoved"))
        .map_err(|e| failed("match rule", e))?
        .build();
    let signals = MessageIterator::for_match_rule(rule, conn, Some(64)).map_err(|e| failed("listening for JobRemoved", e))?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for message in signals.flatten() {
            // JobRemoved(u id, o job, s unit, s result)
            if let Ok((_, job, _, result)) = message.body().deserialize::<(u32, OwnedObjectPath, String, String)>() {
                if tx.send((job, result)).is_err() {
                    break;
                }
            }
        }
    });

    let properties: Vec<(&str, Value<'_>)> = vec![
        ("Description", Value::from(description)),
        ("PIDs", Value::from(vec![pid])),
        ("Delegate", Value::from(true)),
        // Gone from systemctl's list once it ends, even when it failed.
        ("CollectMode", Value::from("inactive-or-failed")),
    ];
    let aux: Vec<(&str, Vec<(&str, Value<'_>)>)> = Vec::new();
    let reply = conn
        .call_method(Some(DESTINATION), PATH, Some(MANAGER), "StartTransientUnit", &(unit, "fail", properties, aux))
        .map_err(|e| failed(&format!("StartTransientUnit {unit}"), e))?;
    let job: OwnedObjectPath = reply.body().deserialize().map_err(|e| failed("StartTransientUnit's reply", e))?;

    let deadline = Instant::now() + timeout;
    loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok((done, result)) if done == job => {
                return match result.as_str() {
                    "done" => Ok(()),
                    other => Err(failed(&format!("the job starting {unit}"), format!("ended {other:?}"))),
                };
            }
            Ok(_) => continue,
            Err(_) => return Err(failed(&format!("the job starting {unit}"), format!("not done within {timeout:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bus that accepts the connection and never answers (the old code waited forever in
    /// the handshake): connecting fails within its timeout. The test's own bound, on a
    /// thread, only keeps a regression from hanging the test run.
    #[test]
    fn a_silent_bus_is_given_up_on() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("bus");
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let (tx, rx) = mpsc::channel();
        let address = format!("unix:path={}", socket.display());
        std::thread::spawn(move || {
            let _ = tx.send(connect_to(Some(address), Duration::from_millis(300)).map(|_| ()));
        });
        // Accept, then say nothing.
        let (_peer, _) = listener.accept().unwrap();
        let outcome = rx.recv_timeout(Duration::from_secs(120)).expect("connect returned (a silent bus is not waited on forever)");
        let err = outcome.expect_err("connected to a silent bus");
        assert!(err.to_string().contains("handshake"), "{err}");
    }

    #[test]
    fn the_bus_override_is_a_unix_socket_only() {
        assert!(unix_address("unix:path=/tmp/bus").is_ok());
        assert!(unix_address("unix:abstract=x").is_ok());
        for bad in ["unixexec:path=/bin/sh,argv1=-c,argv2=id", "tcp:host=10.0.0.1,port=1", "unix:path=/a;unixexec:path=/bin/sh", "launchd:env=X"] {
            assert!(unix_address(bad).is_err(), "{bad}");
        }
    }
}
