//! A refusal never happens because of a dead process: what a process killed at any moment
//! held is given back before anyone is refused for want of it — although a refusal
//! reclaims only when its process's listing of the vGPU (`vgpu_abi::usage::Peers`) cannot
//! show that nothing could be given back — and a process killed at any step of its
//! registration leaves nothing that keeps the quota from others.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Stdio};

use crate::common::*;

const QUOTA: u64 = 64 * MIB;
const OUT_OF_MEMORY: i32 = 2;

/// A shimmed `probe stdin`: allocations on request, each answered at once.
struct Probe {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Probe {
    fn start(bench: &Bench, probe: &std::path::Path, env: &[(&str, &str)]) -> Probe {
        let mut cmd = bench.shimmed(probe);
        cmd.arg("stdin").stdin(Stdio::piped()).stdout(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn probe");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Probe { child, stdin, stdout }
    }

    /// Ask for `bytes` without waiting for the answer.
    fn send_alloc(&mut self, bytes: u64) {
        writeln!(self.stdin, "alloc {bytes}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// The driver's (or the shim's) answer to an allocation of `bytes`.
    fn alloc(&mut self, bytes: u64) -> i32 {
        self.send_alloc(bytes);
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        field(&line, "alloc").parse().unwrap_or_else(|_| panic!("probe said {line:?}"))
    }

    fn pid(&self) -> libc::pid_t {
        self.child.id() as libc::pid_t
    }

    /// SIGKILL it and wait until it is dead, without reaping it: it stays a zombie until
    /// the `Probe` is dropped.
    fn kill_leaving_a_zombie(&mut self) {
        // SAFETY: signalling our own child by its pid.
        assert_eq!(unsafe { libc::kill(self.pid(), libc::SIGKILL) }, 0);
        // SAFETY: a zeroed siginfo_t is valid; waitid on our own child with WNOWAIT leaves it
        // unreaped.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let rc = unsafe { libc::waitid(libc::P_PID, self.pid() as libc::id_t, &mut info, libc::WEXITED | libc::WNOWAIT) };
        assert_eq!(rc, 0, "waitid: {}", std::io::Error::last_os_error());
    }

    /// SIGKILL it and reap it.
    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Wait until it stopped itself (a test stop point), then SIGKILL and reap it.
    fn kill_when_stopped(mut self) {
        let mut status = 0;
        // SAFETY: waitpid on our own child with a valid status pointer; WUNTRACED reports the
        // stop.
        let pid = unsafe { libc::waitpid(self.pid(), &mut status, libc::WUNTRACED) };
        assert!(pid == self.pid() && libc::WIFSTOPPED(status), "the probe did not stop (status {status:#x})");
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn records(bench: &Bench) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(bench.vgpu_dir.join("procs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn refused_twice(probe: &mut Probe, bytes: u64) {
    // The first refusal reclaims and lists the vGPU's processes; the second is answered
    // from that listing.
    assert_eq!(probe.alloc(bytes), OUT_OF_MEMORY);
    assert_eq!(probe.alloc(bytes), OUT_OF_MEMORY);
}

/// `survivor` listed `victim` alive at a refusal; then `victim` dies: the next refusal must
/// not be answered from the listing.
fn a_death_after_the_listing_is_reclaimed_before_a_refusal(zombie: bool) {
    let bench = Bench::new(GIB, &[QUOTA]);
    let probe = bench.compile("probe", &[]);
    let mut victim = Probe::start(&bench, &probe, &[]);
    let mut survivor = Probe::start(&bench, &probe, &[]);
    assert_eq!(victim.alloc(QUOTA / 2), 0);
    assert_eq!(survivor.alloc(QUOTA / 2), 0);
    refused_twice(&mut survivor, MIB);
    if zombie {
        victim.kill_leaving_a_zombie();
    } else {
        victim.kill();
    }
    assert_eq!(
        survivor.alloc(QUOTA / 4),
        0,
        "what the dead process held was given back before refusing"
    );
    let usage = bench.usage();
    assert_eq!(usage.devices()[0].used_bytes, QUOTA / 2 + QUOTA / 4, "exactly what the survivor holds");
    assert_eq!(usage.processes().len(), 1);
}

#[test]
fn a_process_killed_after_a_refusal_listed_it_is_reclaimed_before_the_next_refusal() {
    a_death_after_the_listing_is_reclaimed_before_a_refusal(false);
}

#[test]
fn a_zombie_is_reclaimed_before_a_refusal() {
    a_death_after_the_listing_is_reclaimed_before_a_refusal(true);
}

#[test]
fn a_process_that_registered_after_the_listing_is_reclaimed_when_it_dies() {
    let bench = Bench::new(GIB, &[QUOTA]);
    let probe = bench.compile("probe", &[]);
    let mut survivor = Probe::start(&bench, &probe, &[]);
    assert_eq!(survivor.alloc(QUOTA * 3 / 4), 0);
    // Listed alone.
    refused_twice(&mut survivor, QUOTA / 2);
    let mut late = Probe::start(&bench, &probe, &[]);
    assert_eq!(late.alloc(QUOTA / 4), 0);
    assert_eq!(survivor.alloc(MIB), OUT_OF_MEMORY, "the late process is alive: a real refusal");
    late.kill();
    assert_eq!(survivor.alloc(QUOTA / 4), 0, "the late process's quarter was given back");
    assert_eq!(bench.usage().devices()[0].used_bytes, QUOTA);
}

/// A process killed at `step` of its registration (it stops itself there:
/// `VGPU_SHIM_TEST_STOP`) leaves nothing that keeps the quota from the others, and a
/// reclaim leaves the vGPU exact.
fn killed_while_registering(step: &str) {
    let bench = Bench::new(GIB, &[QUOTA]);
    let probe = bench.compile("probe", &[]);
    let mut other = Probe::start(&bench, &probe, &[]);
    assert_eq!(other.alloc(MIB), 0);
    let mut victim = Probe::start(&bench, &probe, &[("VGPU_SHIM_TEST_STOP", &format!("register:{step}"))]);
    victim.send_alloc(QUOTA / 2);
    let victim_pid = victim.pid();
    victim.kill_when_stopped();
    let left: Vec<String> = records(&bench)
        .into_iter()
        .filter(|name| name.contains(&victim_pid.to_string()))
        .collect();
    assert_eq!(left.len(), 1, "the registration got as far as its file: {left:?}");
    assert_eq!(other.alloc(QUOTA - MIB), 0, "the whole rest of the quota is the other process's");
    assert_eq!(other.alloc(MIB), OUT_OF_MEMORY, "full: refused (after a reclaim that finds the dead file)");
    let usage = bench.usage();
    assert_eq!(usage.devices()[0].used_bytes, QUOTA);
    let path = bench.vgpu_dir.join("procs").join(&left[0]);
    if step == "opened" {
        // A file killed before it was written is handled as a damaged one: removed once old
        // enough that nobody can still be writing it. Age it.
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
        std::fs::File::options().write(true).open(&path).unwrap().set_modified(old).unwrap();
    } else {
        assert!(!path.exists(), "a whole record of a dead process: removed by the refusal's reclaim");
    }
    let report = usage.reclaim_dead();
    assert!(!report.reconcile_pending, "{report:?}");
    assert_eq!(records(&bench).len(), 1, "only the other process's record is left: {:?}", records(&bench));
    assert_eq!(usage.devices()[0].used_bytes, QUOTA, "exactly what the other process holds");
}

#[test]
fn a_process_killed_with_its_file_created_empty_leaves_the_quota_whole() {
    killed_while_registering("opened");
}

#[test]
fn a_process_killed_with_its_file_written_but_not_counted_leaves_the_quota_whole() {
    killed_while_registering("written");
}

#[test]
fn a_process_killed_counted_before_its_first_reservation_leaves_the_quota_whole() {
    killed_while_registering("counted");
}
