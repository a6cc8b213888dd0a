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

/// `cargo build --workspace --profile PROFILE` of this workspace, as the README's test
/// command builds it, from inside a test: the features the same (a `-p` build resolves
/// others and recompiles what the libraries under test depend on), and without the
/// variables cargo sets for the test process (`CARGO_MANIFEST_DIR`, `CARGO_PKG_*`, …),
/// which some build scripts (ring's) track: inherited, they made the nested build recompile
/// half the workspace, and the next plain build compile it back. After the README's build
/// it compiles nothing. Extra arguments (`--example NAME`) follow.
pub fn cargo_build_workspace(manifest: &std::path::Path, profile: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["build", "--quiet", "--workspace", "--profile", profile]).arg("--manifest-path").arg(manifest);
    let set_for_tests = ["CARGO_MANIFEST_", "CARGO_PKG_", "CARGO_CRATE_", "CARGO_BIN_", "CARGO_PRIMARY_PACKAGE", "CARGO_TARGET_TMPDIR", "CARGO_RUSTC_CURRENT_DIR"];
    for (key, _) in std::env::vars_os() {
        if key.to_str().is_some_and(|k| set_for_tests.iter().any(|p| k.starts_with(p))) {
            cmd.env_remove(key);
        }
    }
    cmd
}
