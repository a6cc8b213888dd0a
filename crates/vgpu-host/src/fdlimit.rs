//! The descriptor limit of `vgpu watch` (`RLIMIT_NOFILE`).
//!
//! systemd gives a service a soft limit of 1024 (and a hard one of 524288), so that old
//! programs using `select(2)` keep working. The watch is not one of them: at its start it
//! raises its soft limit toward the hard one ([`raise`], at most [`TARGET`]), and gives the
//! limit it inherited back to the programs it starts ([`restore_in_child`]: service
//! replicas, which run workloads that may use `select`). The metrics endpoint may use only
//! what is left after [`RESERVE`] descriptors ([`connection_cap`]), so that no number of
//! scrapers can take the descriptors enforcement needs (pidfds, cgroup and store files,
//! NVML, the history).

use std::sync::OnceLock;

/// The soft limit the watch asks for when the hard limit allows it.
pub const TARGET: u64 = 65_536;

/// Descriptors the metrics endpoint may never use: what enforcement needs whatever the
/// scrapers do.
pub const RESERVE: u64 = 256;

/// The limits found at start: the soft limit inherited and the one in force now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nofile {
    pub inherited: u64,
    pub soft: u64,
    pub hard: u64,
}

static INHERITED: OnceLock<libc::rlimit> = OnceLock::new();

/// Raise the soft limit to the hard one, at most [`TARGET`] (never lower it). Returns the
/// limits; an error leaves the limit as it was.
pub fn raise() -> std::io::Result<Nofile> {
    let mut now = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit(2) writes the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut now) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let _ = INHERITED.set(now);
    let inherited = now.rlim_cur;
    let wanted = now.rlim_max.min(TARGET).max(inherited);
    if wanted > inherited {
        let new = libc::rlimit { rlim_cur: wanted, rlim_max: now.rlim_max };
        // SAFETY: setrlimit(2) reads the struct we own.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(Nofile { inherited, soft: wanted, hard: now.rlim_max })
}

/// The soft limit in force now.
pub fn current() -> u64 {
    let mut now = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit(2) writes the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut now) } != 0 {
        return 1024;
    }
    now.rlim_cur
}

/// Descriptors the metrics endpoint takes besides its connections: its listening socket,
/// its runtime's (epoll, eventfd), refused connections kept open a moment
/// (`metrics::server::REFUSALS_AT_ONCE`) and the one being accepted.
pub const ENDPOINT_OVERHEAD: u64 = 24;

/// How many connections the metrics endpoint may hold: the configured cap, less when the
/// descriptor limit leaves less after the reserve and the endpoint's own overhead (at least
/// 1: each connection is one descriptor).
pub fn connection_cap(configured: usize, soft_limit: u64) -> usize {
    let room = soft_limit.saturating_sub(RESERVE).saturating_sub(ENDPOINT_OVERHEAD);
    configured.min(usize::try_from(room).unwrap_or(usize::MAX)).max(1)
}

/// Give a program this process starts the limit it inherited (after [`raise`]; nothing
/// when it was not called).
pub fn restore_in_child(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt as _;
    let Some(inherited) = INHERITED.get().copied() else { return };
    // SAFETY: between fork and exec the child calls only setrlimit(2), which is
    // async-signal-safe, with a struct copied before the fork; nothing is allocated.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setrlimit(libc::RLIMIT_NOFILE, &inherited) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_leaves_the_reserve() {
        assert_eq!(connection_cap(128, 1024), 128);
        assert_eq!(connection_cap(2000, 1024), (1024 - RESERVE - ENDPOINT_OVERHEAD) as usize);
        assert_eq!(connection_cap(128, 200), 1);
        assert_eq!(connection_cap(128, 65_536), 128);
    }
}
