//! What one process knows of the other processes of its vGPU, so that it can tell — with a
//! few atomic loads and one `poll`, no lock, no directory scan, no `/proc` read — that a
//! reclaim now could give nothing back, and refuse an allocation at once.
//!
//! A [`Peers`] is made by a reclaim, under the vGPU lock: it reads the usage file's
//! `registrations`, lists `procs/`, and keeps a pidfd of every listed process that is alive
//! (pid *and* start time, checked after the pidfd is opened, so the pidfd is that very
//! process). It is only usable if that listing found nothing a later reclaim could act on
//! (no dead process's record, damaged or not, left behind).
//!
//! [`UsageFile::nothing_to_reclaim`] then holds while
//! - `registrations` still reads what it read when it listed: every process that published
//!   its file since has not yet counted itself, and a process counts itself before its
//!   first reservation, so such a process holds nothing and is in no update; every other
//!   record was listed;
//! - no listed process has exited (its pidfd is not readable; a zombie's is);
//! - no reconcile is pending (`needs_reconcile`) and no reclaim is under way or was
//!   interrupted by a death (`reclaimer`).
//!
//! Then a reclaim would find every record holding bytes alive and have no reconcile to run:
//! it could give nothing back, so a refusal is not caused by a dead process. When anything
//! of this fails, the caller reclaims for real (and gets a fresh `Peers`). A usage file
//! whose `registrations` is 0 (made by an older vgpu, whose shims do not count themselves)
//! never gets a usable `Peers`: every refusal reclaims first, as before.
//!
//! The pidfds are descriptors of the caller's process (close-on-exec; a fork child closes
//! its copies). A program that closes descriptors it did not open and reuses their numbers
//! could make `poll` answer for another file; to bound what such a mix-up (or anything this
//! reasoning missed) could hide, a listing is trusted for at most [`MAX_LISTING_AGE`]: after
//! that a refusal reclaims and lists afresh, at most about once a second.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::UsageFile;
use crate::layout::now_mono_ns;
use crate::process::ProcessId;

/// Most other processes watched; a vGPU with more is reclaimed before every refusal.
pub const MAX_PEERS: usize = 64;

/// How long a listing is trusted.
pub const MAX_LISTING_AGE: Duration = Duration::from_secs(1);

/// The other live processes of a vGPU as a reclaim listed them (see the module's text).
#[derive(Debug, Default)]
pub struct Peers {
    /// The vGPU's `registrations` when `procs/` was listed; 0: no usable listing.
    listed_at: u64,
    /// When (`CLOCK_MONOTONIC`, ns) the listing began.
    pub(super) listed_mono_ns: u64,
    /// A pidfd of every other live process listed.
    fds: Vec<OwnedFd>,
}

impl Peers {
    /// Nothing known yet: the first refusal reclaims.
    pub const fn new() -> Peers {
        Peers {
            listed_at: 0,
            listed_mono_ns: 0,
            fds: Vec::new(),
        }
    }

    /// Whether a listing is usable.
    pub fn is_usable(&self) -> bool {
        self.listed_at != 0
    }

    /// How many processes are watched.
    pub fn watched(&self) -> usize {
        self.fds.len()
    }

    /// Forget everything (closing the descriptors) without freeing memory: a fork child's
    /// copies are the child's to close, and it must not trust its parent's listing.
    pub fn forget(&mut self) {
        self.listed_at = 0;
        self.fds.clear();
    }
}

/// A listing being made by a reclaim (under the vGPU lock).
pub(super) struct Listing {
    peers: Peers,
    me: u32,
    usable: bool,
}

impl Listing {
    /// Start a listing: `registrations` as it is before `procs/` is read.
    pub(super) fn start(usage: &UsageFile) -> Listing {
        let at = usage.header().registrations.load(Ordering::SeqCst);
        Listing {
            peers: Peers {
                listed_at: at,
                listed_mono_ns: now_mono_ns(),
                fds: Vec::new(),
            },
            // SAFETY: getpid has no preconditions and cannot fail.
            me: unsafe { libc::getpid() } as u32,
            usable: at != 0,
        }
    }

    /// Whether process `id`, whose record was listed, is alive: its pidfd is opened first
    /// and kept only if the process is then found alive with its start time, so the pidfd
    /// is of that very process (a pid cannot come back to a process that died). This
    /// process is not watched.
    pub(super) fn is_alive(&mut self, id: ProcessId) -> bool {
        if id.pid == self.me || !self.usable {
            return id.is_alive();
        }
        let pidfd = pidfd_open(id.pid);
        let alive = id.is_alive();
        match pidfd {
            Ok(fd) if alive && self.peers.fds.len() < MAX_PEERS => self.peers.fds.push(fd),
            // Gone before its pidfd could be opened: dead (and reclaimed as such).
            Err(e) if !alive && e.raw_os_error() == Some(libc::ESRCH) => {}
            Ok(_) if !alive => {}
            // Too many, or no pidfds here (an old kernel, a seccomp filter, no descriptors
            // left): no fast answers for this vGPU.
            _ => self.usable = false,
        }
        alive
    }

    /// A record of a dead process stays (damaged and still in its grace, or not
    /// removable): a later reclaim may act on it, so refusals must keep reclaiming.
    pub(super) fn dead_left_behind(&mut self) {
        self.usable = false;
    }

    /// The listing, usable or not.
    pub(super) fn finish(self) -> Peers {
        if self.usable {
            self.peers
        } else {
            Peers::new()
        }
    }
}

impl UsageFile {
    /// Whether a reclaim now could give nothing back (see `Peers`): `true` only when that
    /// is certain; `false` whenever it cannot be told without reclaiming. No lock, no
    /// allocation; a clock read and one `poll` of the watched pidfds.
    pub fn nothing_to_reclaim(&self, peers: &Peers) -> bool {
        let header = self.header();
        if peers.listed_at == 0
            || now_mono_ns().saturating_sub(peers.listed_mono_ns) >= MAX_LISTING_AGE.as_nanos() as u64
            || header.registrations.load(Ordering::SeqCst) != peers.listed_at
            || header.needs_reconcile.load(Ordering::SeqCst) != 0
            || header.reclaimer.load(Ordering::SeqCst) != 0
        {
            return false;
        }
        if peers.fds.is_empty() {
            return true;
        }
        let mut polled = [libc::pollfd {
            fd: -1,
            events: 0,
            revents: 0,
        }; MAX_PEERS];
        for (slot, fd) in polled.iter_mut().zip(&peers.fds) {
            slot.fd = fd.as_raw_fd();
            slot.events = libc::POLLIN;
        }
        let n = peers.fds.len();
        // SAFETY: `polled[..n]` is a valid, writable array of `n` pollfds; timeout 0 never
        // blocks.
        let ready = unsafe { libc::poll(polled.as_mut_ptr(), n as libc::nfds_t, 0) };
        // Any event (an exit, or an error on a descriptor) or a failed poll: reclaim.
        ready == 0
    }

    /// [`UsageFile::reclaim_dead_quick`], and a fresh [`Peers`] listed under the same hold
    /// of the vGPU lock (unusable if the reclaim could not take the lock or left something
    /// behind).
    pub fn reclaim_dead_quick_listing(&self) -> (super::ReclaimReport, Peers) {
        self.reclaim_listing(super::QUICK_LOCK_TIMEOUT, super::QUICK_RECONCILE_ATTEMPTS)
    }
}

fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: a system call with integer arguments; it touches no memory of ours.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0 as libc::c_uint) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new descriptor (close-on-exec), owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}
