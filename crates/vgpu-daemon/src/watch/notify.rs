//! sd_notify(3) for `Type=notify`: state changes sent as one datagram to `$NOTIFY_SOCKET` (a
//! path, or `@name` in the abstract namespace). Unlike a plain blocking send, a manager that
//! stops reading (its queue full) stalls the watch for at most [`SEND_TIMEOUT`]: the loop
//! must go on answering signals. Outside systemd (no `NOTIFY_SOCKET`) nothing is sent.

use std::io;
use std::os::linux::net::SocketAddrExt as _;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

use sd_notify::NotifyState;

/// The longest one notification may wait for room in the manager's queue.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(2);

/// Send `states` (one `KEY=VALUE` line each) to the service manager.
pub fn send(states: &[NotifyState]) -> io::Result<()> {
    let Some(socket) = std::env::var_os("NOTIFY_SOCKET") else { return Ok(()) };
    let message: String = states.iter().map(|s| format!("{s}\n")).collect();
    let address = address(socket.as_bytes())?;
    let sock = UnixDatagram::unbound()?;
    sock.set_write_timeout(Some(SEND_TIMEOUT))?;
    let sent = sock.send_to_addr(message.as_bytes(), &address)?;
    if sent != message.len() {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "notification cut short"));
    }
    Ok(())
}

/// `NOTIFY_SOCKET`'s address: an absolute path, or `@` and an abstract name.
fn address(socket: &[u8]) -> io::Result<SocketAddr> {
    match socket {
        [b'@', name @ ..] if !name.is_empty() => SocketAddr::from_abstract_name(name),
        [b'/', ..] => SocketAddr::from_pathname(std::ffi::OsStr::from_bytes(socket)),
        _ => Err(io::Error::new(io::ErrorKind::InvalidInput, "NOTIFY_SOCKET is neither an absolute path nor @name")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixDatagram;

    #[test]
    fn addresses() {
        assert_eq!(address(b"/run/systemd/notify").unwrap().as_pathname(), Some(std::path::Path::new("/run/systemd/notify")));
        assert_eq!(address(b"@vgpu-test").unwrap().as_abstract_name(), Some(&b"vgpu-test"[..]));
        for bad in [&b""[..], b"@", b"relative/path", b"vsock:2:1"] {
            assert!(address(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn a_full_queue_stalls_a_send_for_the_timeout_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let _manager = UnixDatagram::bind(&path).unwrap(); // never reads
        let address = address(path.as_os_str().as_bytes()).unwrap();
        let sock = UnixDatagram::unbound().unwrap();
        sock.set_write_timeout(Some(Duration::from_millis(200))).unwrap();
        let started = std::time::Instant::now();
        let full = (0..100_000).find_map(|_| sock.send_to_addr(b"WATCHDOG=1\n", &address).err()).expect("the queue fills");
        assert!(matches!(full.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut), "{full}");
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    }
}
