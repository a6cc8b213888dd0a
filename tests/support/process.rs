//! Running child processes in tests, shared by the test harnesses of the workspace's
//! crates (included with `#[path]`: the crates have no test-support crate in common).

use std::process::{Command, Output};

/// Run `cmd` to completion and insist that it succeeded; returns stdout.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert_success(cmd, &out);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Fail with the command, its status and both outputs unless it succeeded.
pub fn assert_success(cmd: &Command, out: &Output) {
    assert!(
        out.status.success(),
        "{cmd:?} failed with {}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
