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

use std::os::unix::ffi::OsStringExt;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rustbus::connection::ll_conn::force_finish_on_error;
use rustbus::connection::Timeout;
use rustbus::message_builder::MarshalledMessage;
use rustbus::wire::marshal::traits::SignatureBuffer;
use rustbus::wire::marshal::MarshalContext;
use rustbus::wire::ObjectPath;
use rustbus::{standard_messages, Marshal, MessageBuilder, MessageType, RpcConn, Signature};

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
/// The system bus's socket (the D-Bus specification's default, which systemd's own tools use).
const SYSTEM_BUS: &str = "/run/dbus/system_bus_socket";

/// The scope unit of workload `id`.
pub fn scope_name(id: &str) -> String {
    format!("vgpu-{id}.scope")
}

fn failed(what: &str, e: impl std::fmt::Display) -> CgroupError {
    CgroupError::Manager { reason: format!("systemd over D-Bus: {what}: {e}") }
}

/// Where a unix-socket D-Bus address points.
#[derive(Debug, PartialEq, Eq)]
enum Socket {
    Path(std::path::PathBuf),
    Abstract(Vec<u8>),
}

/// The socket of `address` if it names a unix socket (`unix:path=…`, `unix:abstract=…`, with
/// the specification's `%XX` escapes and any other keys, such as `guid=`, ignored), the only
/// kind [`ENV_BUS`] may give.
fn unix_address(address: &str) -> std::result::Result<Socket, String> {
    let refuse = || format!("{ENV_BUS}={address:?}: give a unix socket address, e.g. unix:path=/run/test-bus");
    // One address (`;` separates alternatives), of the unix transport.
    let pairs = match address.strip_prefix("unix:") {
        Some(pairs) if !address.contains(';') => pairs,
        _ => return Err(refuse()),
    };
    for pair in pairs.split(',') {
        let Some((key, value)) = pair.split_once('=') else { return Err(refuse()) };
        let value = unescape(value).ok_or_else(|| format!("{ENV_BUS}={address:?}: a bad %-escape in {key}="))?;
        match key {
            "path" => return Ok(Socket::Path(std::ffi::OsString::from_vec(value).into())),
            "abstract" => return Ok(Socket::Abstract(value)),
            _ => {}
        }
    }
    Err(refuse())
}

/// A D-Bus address value with its `%XX` escapes decoded.
fn unescape(value: &str) -> Option<Vec<u8>> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(out)
}

/// Connects within `timeout`: rustbus bounds the `Hello` and every call it is given a
/// timeout for, but not its authentication handshake, which waits as long as a bus that
/// accepted the socket says nothing. So connecting runs on a thread of its own; should it
/// not end in time, that thread is left blocked on its socket (it ends with the process) and
/// the caller gets an error (under `auto`, vgpu goes on with cgroupfs).
fn connect(timeout: Duration) -> Result<RpcConn> {
    connect_to(std::env::var(ENV_BUS).ok().filter(|a| !a.is_empty()), timeout)
}

/// [`connect`] to `address` (`None`: the system bus).
fn connect_to(address: Option<String>, timeout: Duration) -> Result<RpcConn> {
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

fn connect_unbounded(address: Option<String>, timeout: Duration) -> Result<RpcConn> {
    let (socket, what) = match address {
        Some(address) => {
            let socket = unix_address(&address).map_err(|reason| CgroupError::Manager { reason })?;
            (socket, format!("{ENV_BUS}={address:?}"))
        }
        None => (Socket::Path(SYSTEM_BUS.into()), format!("the system bus ({SYSTEM_BUS})")),
    };
    let addr = match &socket {
        Socket::Path(path) => rustbus_nix::sys::socket::UnixAddr::new(path.as_path()),
        Socket::Abstract(name) => rustbus_nix::sys::socket::UnixAddr::new_abstract(name),
    }
    .map_err(|e| failed(&what, e))?;
    // Authenticates, then says Hello (within `timeout`).
    let mut conn =
        RpcConn::connect_to_path(addr, Timeout::Duration(timeout)).map_err(|e| failed(&format!("cannot connect to {what}"), dbus_error(e, timeout)))?;
    conn.set_filter(Box::new(keep));
    Ok(conn)
}

/// The messages kept on the connection: replies (rustbus files them by their reply serial,
/// and panics on one without: dropped here instead) and systemd's JobRemoved signals. Other
/// signals are dropped, so nothing piles up while vgpu waits, and a call is answered
/// UnknownMethod by rustbus.
fn keep(m: &MarshalledMessage) -> bool {
    match m.typ {
        MessageType::Reply | MessageType::Error => m.dynheader.response_serial.is_some(),
        MessageType::Signal => m.dynheader.interface.as_deref() == Some(MANAGER) && m.dynheader.member.as_deref() == Some("JobRemoved"),
        MessageType::Call | MessageType::Invalid => false,
    }
}

/// A rustbus error in words, its time-out saying how long was waited.
fn dbus_error(e: rustbus::connection::Error, timeout: Duration) -> String {
    match e {
        rustbus::connection::Error::TimedOut => format!("no answer within {timeout:?}"),
        rustbus::connection::Error::NixError(e) => e.to_string(),
        rustbus::connection::Error::IoError(e) => e.to_string(),
        other => other.to_string(),
    }
}

/// Calls `method` and returns its reply, both bounded by `deadline`; an error reply is an
/// error (`org.freedesktop.DBus.Error.…: its message`).
fn call(conn: &mut RpcConn, mut message: MarshalledMessage, deadline: Instant, timeout: Duration) -> std::result::Result<MarshalledMessage, String> {
    let left = || Timeout::Duration(deadline.saturating_duration_since(Instant::now()));
    let serial = conn
        .send_message(&mut message)
        .map_err(|e| e.to_string())?
        .write(left())
        .map_err(force_finish_on_error)
        .map_err(|e| dbus_error(e, timeout))?;
    let reply = conn.wait_response(serial, left()).map_err(|e| dbus_error(e, timeout))?;
    match (reply.typ, &reply.dynheader.error_name) {
        (MessageType::Error, _) | (_, Some(_)) => {
            let name = reply.dynheader.error_name.clone().unwrap_or_default();
            let text = reply.body.parser().get::<String>().unwrap_or_default();
            Err(format!("{name}: {text}"))
        }
        _ => Ok(reply),
    }
}

/// A call of `member` of `interface` on systemd's manager object.
fn method(interface: &str, member: &str) -> MarshalledMessage {
    MessageBuilder::new().call(member).with_interface(interface).on(PATH).at(DESTINATION).build()
}

/// Whether systemd answers on the bus (`org.freedesktop.DBus.Peer.Ping`), for `vgpu doctor`.
pub fn ping(timeout: Duration) -> Result<()> {
    let mut conn = connect(timeout)?;
    let deadline = Instant::now() + timeout;
    call(&mut conn, method("org.freedesktop.DBus.Peer", "Ping"), deadline, timeout).map(|_| ()).map_err(|e| failed("Ping", e))
}

/// Starts the transient scope `unit` holding process `pid`, with `Delegate=yes`, and waits
/// until systemd reports its job done (at most `timeout`).
pub fn start_scope(unit: &str, pid: u32, description: &str, timeout: Duration) -> Result<()> {
    let mut conn = connect(timeout)?;
    start_on(&mut conn, unit, pid, description, timeout)
    // The connection closes when dropped.
}

/// A property value of StartTransientUnit's `a(sv)`: a variant of one of these types.
enum Value<'a> {
    Str(&'a str),
    Bool(bool),
    U32s(Vec<u32>),
}

impl Signature for Value<'_> {
    fn signature() -> rustbus::signature::Type {
        rustbus::signature::Type::Container(rustbus::signature::Container::Variant)
    }
    fn alignment() -> usize {
        1
    }
    fn sig_str(s_buf: &mut SignatureBuffer) {
        s_buf.push_static("v");
    }
    fn has_sig(sig: &str) -> bool {
        sig.starts_with('v')
    }
}

impl Marshal for Value<'_> {
    fn marshal(&self, ctx: &mut MarshalContext) -> std::result::Result<(), rustbus::wire::errors::MarshalError> {
        match self {
            Value::Str(s) => s.marshal_as_variant(ctx),
            Value::Bool(b) => b.marshal_as_variant(ctx),
            Value::U32s(v) => v.as_slice().marshal_as_variant(ctx),
        }
    }
}

fn start_on(conn: &mut RpcConn, unit: &str, pid: u32, description: &str, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    // systemd emits job signals only to clients that subscribed; listen before asking, so
    // a job done before the reply arrives is not missed.
    call(conn, method(MANAGER, "Subscribe"), deadline, timeout).map_err(|e| failed("Subscribe", e))?;
    let rule = format!("type='signal',interface='{MANAGER}',member='JobRemoved'");
    call(conn, standard_messages::add_match(&rule), deadline, timeout).map_err(|e| failed("listening for JobRemoved", e))?;

    let properties: Vec<(&str, Value<'_>)> = vec![
        ("Description", Value::Str(description)),
        ("PIDs", Value::U32s(vec![pid])),
        ("Delegate", Value::Bool(true)),
        // Gone from systemctl's list once it ends, even when it failed.
        ("CollectMode", Value::Str("inactive-or-failed")),
    ];
    let aux: Vec<(&str, Vec<(&str, Value<'_>)>)> = Vec::new();
    let mut start = method(MANAGER, "StartTransientUnit");
    start.body.push_param4(unit, "fail", properties.as_slice(), aux.as_slice()).map_err(|e| failed(&format!("StartTransientUnit {unit}"), e))?;
    let reply = call(conn, start, deadline, timeout).map_err(|e| failed(&format!("StartTransientUnit {unit}"), e))?;
    let job = reply.body.parser().get::<ObjectPath<String>>().map_err(|e| failed("StartTransientUnit's reply", format!("{e:?}")))?;

    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let signal = match conn.wait_signal(Timeout::Duration(left)) {
            Ok(signal) => signal,
            Err(rustbus::connection::Error::TimedOut) => {
                return Err(failed(&format!("the job starting {unit}"), format!("not done within {timeout:?}")))
            }
            Err(e) => return Err(failed(&format!("waiting for the job starting {unit}"), e)),
        };
        // JobRemoved(u id, o job, s unit, s result)
        let Ok((_, done, _, result)) = signal.body.parser().get4::<u32, ObjectPath<&str>, &str, &str>() else { continue };
        if done.as_ref() == job.as_ref() {
            return match result {
                "done" => Ok(()),
                other => Err(failed(&format!("the job starting {unit}"), format!("ended {other:?}"))),
            };
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

    /// rustbus files a reply under its reply serial with an unwrap: one without is dropped
    /// before it gets there. Only JobRemoved among signals is kept.
    #[test]
    fn only_well_formed_replies_and_job_removed_are_kept() {
        let mut reply = MessageBuilder::new().call("Ping").on(PATH).build();
        for typ in [MessageType::Reply, MessageType::Error] {
            reply.typ = typ;
            reply.dynheader.response_serial = None;
            assert!(!keep(&reply));
            reply.dynheader.response_serial = Some(3);
            assert!(keep(&reply));
        }
        assert!(keep(&MessageBuilder::new().signal(MANAGER, "JobRemoved", PATH).build()));
        assert!(!keep(&MessageBuilder::new().signal(MANAGER, "UnitNew", PATH).build()));
        assert!(!keep(&MessageBuilder::new().signal("org.freedesktop.DBus", "JobRemoved", PATH).build()));
        assert!(!keep(&method(MANAGER, "Subscribe")));
    }

    #[test]
    fn the_bus_override_is_a_unix_socket_only() {
        assert_eq!(unix_address("unix:path=/tmp/bus"), Ok(Socket::Path("/tmp/bus".into())));
        assert_eq!(unix_address("unix:path=/tmp/a%20b/bus,guid=0123"), Ok(Socket::Path("/tmp/a b/bus".into())));
        assert_eq!(unix_address("unix:guid=0123,abstract=x"), Ok(Socket::Abstract(b"x".to_vec())));
        assert!(unix_address("unix:path=/tmp/%2").is_err());
        for bad in ["unixexec:path=/bin/sh,argv1=-c,argv2=id", "tcp:host=10.0.0.1,port=1", "unix:path=/a;unixexec:path=/bin/sh", "launchd:env=X"] {
            assert!(unix_address(bad).is_err(), "{bad}");
        }
    }
}
