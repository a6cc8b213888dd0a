//! A process identity that survives PID reuse: the pid plus its start time in clock ticks
//! since boot (field 22 of `/proc/PID/stat`). A recycled pid has a different start time.

use std::io::Read;

/// Identity of a live process, comparable across time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProcessId {
    pub pid: u32,
    pub start_time: u64,
}

impl ProcessId {
    /// This process.
    pub fn current() -> Option<ProcessId> {
        use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
        // Read from /proc once per process, without a lock (the shim calls this in any
        // process, forked at any moment): the start time is stored before the pid that
        // vouches for it, and a child forked since has another pid and reads its own.
        static PID: AtomicU32 = AtomicU32::new(0);
        static START_TIME: AtomicU64 = AtomicU64::new(0);
        // SAFETY: getpid has no preconditions and cannot fail.
        let pid = unsafe { libc::getpid() } as u32;
        if PID.load(Ordering::Acquire) == pid {
            return Some(ProcessId { pid, start_time: START_TIME.load(Ordering::Relaxed) });
        }
        let start_time = start_time(pid)?;
        PID.store(0, Ordering::Relaxed);
        START_TIME.store(start_time, Ordering::Relaxed);
        PID.store(pid, Ordering::Release);
        Some(ProcessId { pid, start_time })
    }

    /// Whether this exact process (not a later one with the same pid) still runs.
    /// Zombies count as dead: they hold no GPU memory and will never run again.
    pub fn is_alive(&self) -> bool {
        match read_stat(self.pid) {
            Some(stat) => stat.start_time == self.start_time && stat.state != b'Z' && stat.state != b'X',
            None => false,
        }
    }
}

struct Stat {
    state: u8,
    start_time: u64,
}

/// Start time of `pid` in clock ticks since boot, or `None` if it does not exist.
pub fn start_time(pid: u32) -> Option<u64> {
    read_stat(pid).map(|s| s.start_time)
}

fn read_stat(pid: u32) -> Option<Stat> {
    // A stack buffer: this runs inside the shim, where allocation is avoided.
    let mut path = [0u8; 32];
    let path = fmt_proc_stat(pid, &mut path)?;
    let mut file = std::fs::File::open(path).ok()?;
    let mut buf = [0u8; 1024];
    let mut len = 0;
    loop {
        let n = file.read(&mut buf[len..]).ok()?;
        if n == 0 {
            break;
        }
        len += n;
        if len == buf.len() {
            break;
        }
    }
    parse_stat(&buf[..len])
}

fn fmt_proc_stat(pid: u32, buf: &mut [u8; 32]) -> Option<&str> {
    use std::io::Write;
    let mut cursor = std::io::Cursor::new(&mut buf[..]);
    write!(cursor, "/proc/{pid}/stat").ok()?;
    let n = cursor.position() as usize;
    std::str::from_utf8(&buf[..n]).ok()
}

/// The command name (field 2) may contain spaces and parentheses, so fields are counted
/// from the last `)`.
fn parse_stat(stat: &[u8]) -> Option<Stat> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(stat.get(close + 2..)?).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.bytes().next()?;
    // After the state (field 3) come fields 4..; start time is field 22 → 19th after state.
    let start_time = fields.nth(18)?.parse().ok()?;
    Some(Stat { state, start_time })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_with_spaces_and_parens() {
        let line = b"1234 (a (weird) name) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 987654 20 21";
        let stat = parse_stat(line).unwrap();
        assert_eq!(stat.state, b'S');
        assert_eq!(stat.start_time, 987654);
    }

    /// The identity is read once per process: a child forked after it was read reads its own.
    #[test]
    fn a_forked_child_reads_its_own_identity() {
        let parent = ProcessId::current().unwrap();
        assert_eq!(ProcessId::current(), Some(parent));
        // SAFETY: the child reads /proc (glibc's fork leaves malloc usable) and leaves with
        // _exit, running nothing of the parent's test harness.
        let child = unsafe { libc::fork() };
        assert!(child >= 0, "fork");
        if child == 0 {
            // SAFETY: getpid has no preconditions.
            let me = unsafe { libc::getpid() } as u32;
            let own = ProcessId::current().is_some_and(|id| id.pid == me && id != parent && id.is_alive());
            // SAFETY: _exit ends the child at once.
            unsafe { libc::_exit(if own { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waitpid on our own child, into a local.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "the child's identity was its parent's: {status:#x}");
        assert_eq!(ProcessId::current(), Some(parent));
    }

    #[test]
    fn current_process_is_alive_and_reuse_is_detected() {
        let me = ProcessId::current().unwrap();
        assert!(me.is_alive());
        let impostor = ProcessId { start_time: me.start_time + 1, ..me };
        assert!(!impostor.is_alive());
    }

    #[test]
    fn reaped_child_is_dead() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let id = ProcessId { pid: child.id(), start_time: start_time(child.id()).unwrap_or(0) };
        child.wait().unwrap();
        assert!(!id.is_alive());
    }
}
