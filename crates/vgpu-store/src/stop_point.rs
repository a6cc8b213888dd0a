//! A test hook: `VGPU_TEST_STOP_AT=<name>` makes vgpu SIGKILL itself at the step called
//! `<name>`, so that tests can crash a command at an exact point between two steps of a
//! change (see tests/crash_consistency.rs) instead of killing it at a random moment.
//!
//! The names are the `STOP_POINTS` below. A command that dies there leaves exactly what a
//! crash or a `kill -9` would; the next command's reconcile must finish or undo it. The
//! hook gives nobody more than that: whoever can set vgpu's environment can already kill it.

use nix::sys::signal::{raise, Signal};

/// The environment variable naming the step to die at.
pub const ENV: &str = "VGPU_TEST_STOP_AT";

/// The environment variable naming a step to pause at instead: vgpu stops itself there
/// (SIGSTOP) until it is continued, so that a test can act at that exact point (send a
/// signal, change a file) and then let it go on.
pub const PAUSE_ENV: &str = "VGPU_TEST_PAUSE_AT";

/// Every stop point, in the order a command meets them.
pub const STOP_POINTS: &[&str] = &[
    // vgpu run: its start intent is recorded, the cgroup exists, the record does not yet.
    "run:cgroup-created",
    // vgpu run: recorded (state starting), no process started yet.
    "run:recorded",
    // vgpu run: the workload's first process runs, the record does not name it yet.
    "run:spawned",
    // Tearing a workload down (its vgpu run after it exited, or a reconcile after its
    // supervisor died): its cgroup is gone, its vGPU directory and record are not.
    "exit:cgroup-removed",
    // Suspending a workload (vgpu suspend, preemption): a process is locked (its CUDA calls
    // blocked), not checkpointed yet.
    "suspend:locked",
    // Suspending: every CUDA process is checkpointed (memory on the host), the cgroup is not
    // frozen yet.
    "suspend:checkpointed",
    // vgpu suspend: the cgroup is frozen, the record still says running.
    "suspend:frozen",
    // Resuming: a process's memory is back on the GPU, it is still locked.
    "resume:restored",
    // vgpu resume: the cgroup is thawed, the record still says suspended.
    "resume:thawed",
    // Any pool change (preemption by `vgpu run --tflops`, or a resume): the victims are
    // frozen, the pool state is not saved yet.
    "preempt:frozen",
    // Any pool change: the pool state is saved, the workload records are not updated yet.
    "preempt:saved",
    // Rotating the carbon decision log: the older rotated files are shifted up, the log is
    // not renamed yet.
    "carbon-log:shifted",
    // Rotating the carbon decision log: renamed to carbon.jsonl.1, no new log yet.
    "carbon-log:rotated",
    // vgpu watch acting on a workload's offence: its record says why (killed or ended), its
    // cgroup is frozen, no process is killed yet.
    "watch:offence-frozen",
    // vgpu watch recording a round in history.db: its GPU rows are written, its workload
    // rows are not, nothing is committed.
    "history:mid-tick",
    // Migrating history.db to this vgpu's schema: the new tables, triggers and index are
    // created, the schema version is not set yet, nothing is committed.
    "history:mid-migration",
    // vgpu watch making hourly rollups: a batch of hours is written, not committed.
    "history:mid-rollup",
];

/// Die here, by SIGKILL, when `VGPU_TEST_STOP_AT` names this step; stop here until
/// continued when `VGPU_TEST_PAUSE_AT` does.
pub fn stop_point(name: &str) {
    debug_assert!(STOP_POINTS.contains(&name), "unlisted stop point {name}");
    if std::env::var_os(ENV).is_some_and(|v| v == name) {
        // SIGKILL cannot be caught: nothing after this line runs, as in a real crash.
        let _ = raise(Signal::SIGKILL);
    }
    if std::env::var_os(PAUSE_ENV).is_some_and(|v| v == name) {
        let _ = raise(Signal::SIGSTOP);
    }
}
