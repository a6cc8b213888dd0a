//! `vgpu run`'s security rules, end to end (real cgroups as root, the simulated driver):
//! `--env` cannot switch the shim off, and sudo rights to `vgpu run` are not rights to run as
//! someone else.

use crate::common::{files_below, Sim};

const GPU16: &[(&str, &str)] = &[("NVIDIA A16-sim", "16GiB")];

/// `vgpu --simulate ARGS…` as root itself: no sudo variables from the test's own environment.
fn as_root(sim: &Sim, args: &[&str]) -> assert_cmd::Command {
    let mut cmd = sim.vgpu(args);
    cmd.env_remove("SUDO_UID").env_remove("SUDO_GID").env_remove("SUDO_USER").env_remove("SUDO_COMMAND");
    cmd
}

/// `vgpu --simulate ARGS…` as if `sudo vgpu …` had been run by `nobody`.
fn as_sudo_nobody(sim: &Sim, args: &[&str]) -> assert_cmd::Command {
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    let mut cmd = sim.vgpu(args);
    cmd.env("SUDO_UID", nobody.uid.to_string()).env("SUDO_GID", nobody.gid.to_string()).env("SUDO_USER", "nobody");
    cmd
}

/// Asserts the refusal: exit 2, one line naming `needle`, the workload never ran, and no file
/// (workload record, vGPU, pool entry; cgroups are named after recorded ids) was left behind.
fn assert_refused(sim: &Sim, mut cmd: assert_cmd::Command, marker: &std::path::Path, needle: &str) {
    let before = files_below(sim.dir.path());
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "not one line: {stderr}");
    assert!(stderr.contains(needle), "{needle:?} not named: {stderr}");
    assert!(!marker.exists(), "the workload ran");
    assert_eq!(files_below(sim.dir.path()), before, "a refused run left files behind");
}

fn touch(marker: &std::path::Path) -> String {
    format!("touch {}", marker.display())
}

#[test]
fn env_cannot_replace_or_unset_the_shims_variables() {
    let sim = Sim::new(GPU16);
    let marker = sim.path("ran");
    let script = touch(&marker);
    for (kv, needle) in [
        ("VGPU_DIR=/tmp/x", "VGPU_DIR"),
        ("VGPU_DIR=", "VGPU_DIR"),
        ("LD_PRELOAD=", "LD_PRELOAD"),
        ("LD_PRELOAD=:", "LD_PRELOAD"),
        ("LD_LIBRARY_PATH=", "LD_LIBRARY_PATH"),
        ("VGPU_SHIM_TEST_PANIC=cuMemAlloc_v2:before_driver", "VGPU_SHIM_TEST_PANIC"),
        ("VGPU_SHIM_TEST_STOP=register:opened", "VGPU_SHIM_TEST_STOP"),
    ] {
        let cmd = as_root(&sim, &["run", "--mem", "1G", "--env", kv, "--", "sh", "-c", &script]);
        assert_refused(&sim, cmd, &marker, needle);
    }
}

#[test]
fn env_ld_preload_is_added_after_the_shim() {
    let sim = Sim::new(GPU16);
    let out = as_root(&sim, &["run", "--mem", "1G", "--env", "LD_PRELOAD=/some/extra.so", "--env", "LD_LIBRARY_PATH=/some/libs", "--env", "FOO=bar",
        "--", "sh", "-c", "echo \"PRELOAD=$LD_PRELOAD\"; echo \"LIBS=$LD_LIBRARY_PATH\"; echo \"DIR=$VGPU_DIR\"; echo \"FOO=$FOO\""])
    .env("VGPU_SHIM_TEST_PANIC", "cuMemAlloc_v2:before_driver")
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let value = |key: &str| stdout.lines().find_map(|l| l.strip_prefix(&format!("{key}="))).unwrap_or_else(|| panic!("no {key}: {stdout}")).to_string();
    let preload = value("PRELOAD");
    let entries: Vec<&str> = preload.split(':').collect();
    assert_eq!(entries.len(), 2, "{preload}");
    assert!(entries[0].ends_with("/libvgpu.so"), "the shim is not first: {preload}");
    assert_eq!(entries[1], "/some/extra.so");
    // The simulated driver's directory stays first too.
    let libs = value("LIBS");
    assert!(libs.ends_with(":/some/libs") && libs.len() > ":/some/libs".len(), "{libs}");
    assert!(value("DIR").contains("/vgpus/"), "{stdout}");
    assert_eq!(value("FOO"), "bar");
    // Inherited from vgpu's own environment, the shim's test hooks never reach the workload.
    let out = as_root(&sim, &["run", "--mem", "1G", "--", "sh", "-c", "echo \"PANIC=${VGPU_SHIM_TEST_PANIC-unset}\"; echo \"STOP=${VGPU_SHIM_TEST_STOP-unset}\""])
        .env("VGPU_SHIM_TEST_PANIC", "cuMemAlloc_v2:before_driver")
        .env("VGPU_SHIM_TEST_STOP", "register:opened")
        .env("VGPU_DIR", "/tmp/inherited")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("PANIC=unset") && stdout.contains("STOP=unset"), "{stdout}");
}

#[test]
fn a_sudo_user_cannot_run_as_someone_else() {
    let sim = Sim::new(GPU16);
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    std::fs::set_permissions(sim.dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let marker = sim.path("ran");
    let script = touch(&marker);
    let cmd = as_sudo_nobody(&sim, &["run", "--mem", "1G", "--user", "root", "--", "sh", "-c", &script]);
    assert_refused(&sim, cmd, &marker, "nobody");
    let cmd = as_sudo_nobody(&sim, &["run", "--mem", "1G", "--user", "0", "--", "sh", "-c", &script]);
    assert_refused(&sim, cmd, &marker, "--user");
    let cmd = as_sudo_nobody(&sim, &["run", "--mem", "1G", "--user", "nobody:root", "--", "sh", "-c", &script]);
    assert_refused(&sim, cmd, &marker, "group root");

    // Without --user (or naming themselves) the workload runs as the caller.
    for args in [&["run", "--mem", "1G", "--", "id", "-u"][..], &["run", "--mem", "1G", "--user", "nobody", "--", "id", "-u"][..]] {
        let out = as_sudo_nobody(&sim, args).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), nobody.uid.to_string());
    }
    // Root itself may name anyone.
    let out = as_root(&sim, &["run", "--mem", "1G", "--user", "nobody", "--", "id", "-u"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), nobody.uid.to_string());
}

#[test]
fn policy_run_as_others_lets_a_sudo_user_name_another_user() {
    let sim = Sim::new(GPU16);
    sim.write_vgpu_config("[policy]\nrun_as_others = [\"nobody\"]\n");
    let out = as_sudo_nobody(&sim, &["run", "--mem", "1G", "--user", "root", "--", "id", "-u"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0");
}

#[test]
fn a_sudo_user_gets_no_priority_or_oversubscription_beyond_the_policy() {
    let sim = Sim::new(GPU16);
    std::fs::set_permissions(sim.dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let marker = sim.path("ran");
    let script = touch(&marker);
    // The default policy: priority 50 at most, no oversubscription.
    let cmd = as_sudo_nobody(&sim, &["run", "--mem", "1G", "--priority", "51", "--", "sh", "-c", &script]);
    assert_refused(&sim, cmd, &marker, "--priority 51 is above 50");
    let cmd = as_sudo_nobody(&sim, &["run", "--mem", "1G", "--oversubscribe", "--", "sh", "-c", &script]);
    assert_refused(&sim, cmd, &marker, "--oversubscribe is not granted to nobody");
    let cmd = as_sudo_nobody(&sim, &["run", "--tflops", "1", "--priority", "100", "--", "sh", "-c", &script]);
    assert_refused(&sim, cmd, &marker, "--priority 100");
    let cmd = as_sudo_nobody(&sim, &["partition", "create", "p", "--gpu", "0", "--mem", "1G", "--oversubscribe"]);
    assert_refused(&sim, cmd, &marker, "--oversubscribe");
    // Within it, and root, run.
    for args in [&["run", "--mem", "1G", "--priority", "50", "--", "true"][..], &["run", "--mem", "1G", "--priority", "0", "--", "true"][..]] {
        let out = as_sudo_nobody(&sim, args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    as_root(&sim, &["run", "--mem", "16G", "--priority", "100", "--oversubscribe", "--", "true"]).assert().success();
}

#[test]
fn policy_grants_priority_and_oversubscription_to_users_and_groups() {
    let sim = Sim::new(GPU16);
    std::fs::set_permissions(sim.dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let marker = sim.path("ran");
    let script = touch(&marker);
    sim.write_vgpu_config("[policy]\nmax_priority = 40\n\n[policy.users.nobody]\nmax_priority = 80\noversubscribe = true\n");
    let out = as_sudo_nobody(&sim, &["run", "--mem", "1G", "--priority", "80", "--oversubscribe", "--", "true"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let cmd = as_sudo_nobody(&sim, &["run", "--mem", "1G", "--priority", "81", "--", "sh", "-c", &script]);
    assert_refused(&sim, cmd, &marker, "--priority 81 is above 80");

    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    let group = nix::unistd::Group::from_gid(nobody.gid).unwrap().unwrap().name;
    sim.write_vgpu_config(&format!("[policy]\noversubscribe = [\"%{group}\"]\n\n[policy.groups.{group}]\nmax_priority = 90\n"));
    let out = as_sudo_nobody(&sim, &["run", "--mem", "1G", "--priority", "90", "--oversubscribe", "--", "true"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let cmd = as_sudo_nobody(&sim, &["run", "--mem", "1G", "--priority", "91", "--", "sh", "-c", &script]);
    assert_refused(&sim, cmd, &marker, "--priority 91 is above 90");

    // A bad grant is refused at load, for every command.
    sim.write_vgpu_config("[policy.users.nobody]\nmax_priority = 101\n");
    let cmd = as_root(&sim, &["run", "--mem", "1G", "--", "sh", "-c", &script]);
    assert_refused(&sim, cmd, &marker, "[policy.users.nobody] max_priority");
}

/// `path` with `text`, owned by `uid`, mode `mode`.
fn write_owned(path: &std::path::Path, text: &str, uid: u32, mode: u32) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap();
    std::os::unix::fs::chown(path, Some(uid), None).unwrap();
}

/// A workload file goes through the same `[policy]` checks as the command line. (It would
/// pass on code that applied them to the command line alone only if that code also ignored
/// the file's `user`, `priority` and `oversubscribe`: the last case shows the file is read.)
#[test]
fn a_workload_file_grants_a_sudo_user_nothing_the_command_line_would_not() {
    let sim = Sim::new(GPU16);
    std::fs::set_permissions(sim.dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    let marker = sim.path("ran");
    let script = touch(&marker);
    let file = sim.dir.path().join("mine.toml");
    for (key, needle) in [("user = \"root\"", "--user"), ("priority = 100", "--priority 100 is above 50"), ("oversubscribe = true", "--oversubscribe is not granted")] {
        write_owned(&file, &format!("{key}\nmem = \"1G\"\ncommand = [\"sh\", \"-c\", {script:?}]\n"), nobody.uid.as_raw(), 0o644);
        let cmd = as_sudo_nobody(&sim, &["run", "--workload", file.to_str().unwrap()]);
        assert_refused(&sim, cmd, &marker, needle);
    }
    // The same file of theirs, within the policy, runs as them.
    write_owned(&file, "mem = \"1G\"\ncommand = [\"id\", \"-u\"]\n", nobody.uid.as_raw(), 0o644);
    let out = as_sudo_nobody(&sim, &["run", "--workload", file.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), nobody.uid.to_string());
}

#[test]
fn a_sudo_user_cannot_make_root_read_a_file_for_them() {
    let sim = Sim::new(GPU16);
    std::fs::set_permissions(sim.dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let marker = sim.path("ran");
    // Root's, readable by root alone, outside the workloads directory: its values would
    // show in the errors (the old code said `--user: unknown user "s3cr3t"`).
    let secret = sim.dir.path().join("secret.toml");
    write_owned(&secret, &format!("user = \"s3cr3t\"\ncommand = [\"touch\", {:?}]\n", marker.display().to_string()), 0, 0o600);
    // Opened as the caller, they get what they would get themselves.
    for path in [secret.to_str().unwrap(), "/etc/shadow"] {
        let cmd = as_sudo_nobody(&sim, &["run", "--workload", path]);
        assert_refused(&sim, cmd, &marker, "Permission denied");
    }
    // Readable by them but root's, outside the workloads directory: refused by the rule.
    let readable = sim.dir.path().join("readable.toml");
    write_owned(&readable, &format!("user = \"s3cr3t\"\ncommand = [\"touch\", {:?}]\n", marker.display().to_string()), 0, 0o644);
    let cmd = as_sudo_nobody(&sim, &["run", "--workload", readable.to_str().unwrap()]);
    assert_refused(&sim, cmd, &marker, "through sudo, a workload file must be yours");
    let out = as_sudo_nobody(&sim, &["run", "--workload", secret.to_str().unwrap()]).output().unwrap();
    assert!(!String::from_utf8_lossy(&out.stderr).contains("s3cr3t"), "{}", String::from_utf8_lossy(&out.stderr));
    // Nor pick the workloads directory, or the cgroup and D-Bus peer root takes as its own.
    for (var, value) in [("VGPU_WORKLOADS_DIR", "/etc"), ("VGPU_SYSTEMD_BUS", "unixexec:path=/bin/sh"), ("VGPU_CGROUP_SELF", "/")] {
        let mut cmd = as_sudo_nobody(&sim, &["run", "--mem", "1G", "--", "touch", marker.to_str().unwrap()]);
        cmd.env(var, value);
        assert_refused(&sim, cmd, &marker, var);
    }
}

#[test]
fn a_workload_file_is_a_regular_file_of_roots() {
    let sim = Sim::new(GPU16);
    let marker = sim.path("ran");
    let good = sim.dir.path().join("good.toml");
    write_owned(&good, &format!("mem = \"1G\"\ncommand = [\"touch\", {:?}]\n", marker.display().to_string()), 0, 0o644);
    let link = sim.dir.path().join("link.toml");
    std::os::unix::fs::symlink(&good, &link).unwrap();
    let fifo = sim.dir.path().join("fifo.toml");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let theirs = sim.dir.path().join("theirs.toml");
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    write_owned(&theirs, &format!("command = [\"touch\", {:?}]\n", marker.display().to_string()), nobody.uid.as_raw(), 0o644);
    for (path, needle) in [(&link, "symbolic link"), (&fifo, "not a regular file"), (&theirs, "must be root's"), (&sim.dir.path().to_path_buf(), "not a regular file")] {
        let mut cmd = as_root(&sim, &["run", "--workload", path.to_str().unwrap()]);
        // A bound on a FIFO's read, should one wait for a writer (the old code did).
        cmd.timeout(std::time::Duration::from_secs(120));
        assert_refused(&sim, cmd, &marker, needle);
    }
}
