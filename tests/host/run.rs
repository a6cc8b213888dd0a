//! `vgpu run`, `ps`, `suspend|resume|kill` and partitions, end to end: real cgroups (this
//! machine's hierarchy, as root), the simulated driver, the real binary.

use std::process::Stdio;
use std::time::Duration;

use crate::common::{files_below, wait_for, Sim};
use predicates::prelude::*;

const GPU16: &[(&str, &str)] = &[("NVIDIA A16-sim", "16GiB")];

fn ps(sim: &Sim) -> Vec<serde_json::Value> {
    sim.json(&["ps", "--json"])["workloads"].as_array().cloned().unwrap_or_default()
}

#[test]
fn exit_code_is_the_workloads() {
    let sim = Sim::new(GPU16);
    sim.vgpu(&["run", "--mem", "1G", "--", "sh", "-c", "exit 7"]).assert().code(7);
    sim.vgpu(&["run", "--mem", "1G", "--", "true"]).assert().code(0);
    assert!(ps(&sim).is_empty(), "state left behind");
}

/// vgpu starts from C's `main` (`vgpu::start`): a standard descriptor closed when it starts is
/// opened on /dev/null, so that no file vgpu opens takes its number. Without that, the
/// workload started with descriptor 0 on a pipe of vgpu's and 1 and 2 closed.
#[test]
fn standard_descriptors_closed_at_the_start_are_dev_null_for_vgpu_and_its_workload() {
    let sim = Sim::new(GPU16);
    let out = sim.path("fds");
    // The shell's own descriptors ($$), as vgpu started it, read before any redirection.
    let script = format!("fds=$(readlink /proc/$$/fd/0 /proc/$$/fd/1 /proc/$$/fd/2); echo \"$fds\" > {}", out.display());
    // vgpu started with 0, 1 and 2 closed.
    assert_cmd::Command::new("sh")
        .args(["-c", "exec \"$0\" --simulate \"$@\" <&- >&- 2>&-", env!("CARGO_BIN_EXE_vgpu")])
        .args(["run", "--mem", "1G", "--", "sh", "-c", &script])
        .envs(sim.env())
        .env("VGPU_LOG", "vgpu=warn")
        .assert()
        .success();
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "/dev/null\n/dev/null\n/dev/null\n");
}

/// Root's own run (no sudo) is recorded as user `root` without asking the user database, as
/// systemd does for uid 0: here /etc/passwd, in a mount namespace of the test's, names uid 0
/// `toor`, which the old lookup recorded.
#[test]
fn roots_own_run_is_recorded_as_root_without_the_user_database() {
    let sim = Sim::new(GPU16);
    let passwd = sim.path("passwd");
    std::fs::write(&passwd, "toor:x:0:0:root:/var/toor:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n").unwrap();
    let out = sim.path("record");
    // The workload copies its own record (the state directory's workloads/ID.json).
    let script = format!("cat \"$VGPU_STATE_DIR/workloads/$VGPU_WORKLOAD_ID.json\" > {}", out.display());
    let mut cmd = assert_cmd::Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-euc", "mount --bind \"$1\" /etc/passwd; shift; exec \"$@\"", "sh"])
        .arg(&passwd)
        .args([env!("CARGO_BIN_EXE_vgpu"), "--simulate", "run", "--mem", "1G", "--", "sh", "-c", &script])
        .envs(sim.env())
        .env("VGPU_LOG", "vgpu=warn")
        .env_remove("SUDO_UID")
        .env_remove("SUDO_USER");
    cmd.assert().success();
    let record: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!((record["user"]["name"].as_str(), record["user"]["uid"].as_u64()), (Some("root"), Some(0)), "{record:#}");
}

#[test]
fn workload_runs_in_its_cgroup_with_limits_and_env() {
    let sim = Sim::new(GPU16);
    let out = sim
        .vgpu(&["run", "--mem", "2G", "--cpus", "1.5", "--memory", "256M", "--pids", "64", "--name", "envcheck", "--env", "FOO=bar", "--",
            "sh", "-c", "cat /proc/self/cgroup; echo FOO=$FOO; echo CVD=$CUDA_VISIBLE_DEVICES; echo PRELOAD=$LD_PRELOAD; echo DIR=$VGPU_DIR; \
             for c in cpu memory pids; do p=$(grep -E \":$c(,|:)\" /proc/self/cgroup | head -1 | cut -d: -f3); echo \"$c $p\"; done; \
             cat /sys/fs/cgroup/cpu$(grep -E ':cpu(,|:)' /proc/self/cgroup | head -1 | cut -d: -f3)/cpu.cfs_quota_us; \
             cat /sys/fs/cgroup/memory$(grep ':memory:' /proc/self/cgroup | cut -d: -f3)/memory.limit_in_bytes; \
             cat /sys/fs/cgroup/pids$(grep ':pids:' /proc/self/cgroup | cut -d: -f3)/pids.max"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("FOO=bar"), "{stdout}");
    assert!(stdout.contains("CVD=GPU-"), "{stdout}");
    assert!(stdout.contains("PRELOAD=") && stdout.contains("libvgpu.so"), "{stdout}");
    assert!(stdout.contains("/vgpus/"), "{stdout}");
    for c in ["cpu", "memory", "pids"] {
        assert!(stdout.lines().any(|l| l.starts_with(&format!("{c} /vgpu/"))), "{c} cgroup not under /vgpu: {stdout}");
    }
    assert!(stdout.contains("150000"), "cpu quota: {stdout}");
    assert!(stdout.contains(&(256u64 << 20).to_string()), "memory limit: {stdout}");
    assert!(stdout.lines().any(|l| l.trim() == "64"), "pids.max: {stdout}");
}

#[test]
fn sigterm_to_vgpu_run_reaches_the_workload() {
    let sim = Sim::new(GPU16);
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_vgpu"));
    cmd.args(["--simulate", "run", "--mem", "1G", "--name", "sleeper", "--", "sleep", "60"]);
    for (k, v) in sim.env() {
        cmd.env(k, v);
    }
    cmd.env("VGPU_LOG", "vgpu=debug");
    let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    wait_for("the workload to run", || ps(&sim).iter().any(|w| w["state"] == "running" && !w["pids"].as_array().unwrap().is_empty()));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(143));
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(stderr.contains("relaying signal 15"), "{stderr}");
    assert!(ps(&sim).is_empty());
}

#[test]
fn killed_supervisor_is_reconciled_by_the_next_command() {
    let sim = Sim::new(GPU16);
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_vgpu"));
    cmd.args(["--simulate", "run", "--mem", "4G", "--name", "orphan", "--", "sleep", "60"]);
    for (k, v) in sim.env() {
        cmd.env(k, v);
    }
    let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let mut workload_pid = 0;
    wait_for("the workload to run", || {
        let rows = ps(&sim);
        if let Some(pid) = rows.first().and_then(|w| w["pids"].as_array()).and_then(|p| p.first()).and_then(|p| p.as_u64()) {
            workload_pid = pid;
            true
        } else {
            false
        }
    });
    child.kill().unwrap();
    child.wait().unwrap();
    sim.vgpu(&["ps"]).assert().success().stderr(predicate::str::contains("cleaned up workload orphan"));
    assert!(ps(&sim).is_empty());
    wait_for("the workload's process to be killed", || !std::path::Path::new(&format!("/proc/{workload_pid}")).exists() || std::fs::read_to_string(format!("/proc/{workload_pid}/stat")).map(|s| s.contains(") Z")).unwrap_or(true));
    // The quota came back: the whole 16 GiB fits again.
    sim.vgpu(&["run", "--mem", "16G", "--", "true"]).assert().success();
}

/// The next `vgpu run` itself reconciles before it admits, and admits against the records
/// as reconcile left them (it reads them once, issue 28): a workload whose supervisor was
/// killed gives its memory back to that very admission.
#[test]
fn a_run_admits_into_the_memory_a_killed_supervisors_workload_held() {
    let sim = Sim::new(GPU16);
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_vgpu"));
    cmd.args(["--simulate", "run", "--mem", "12G", "--name", "orphan", "--", "sleep", "60"]);
    for (k, v) in sim.env() {
        cmd.env(k, v);
    }
    let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    wait_for("the workload to run", || ps(&sim).iter().any(|w| w["state"] == "running" && !w["pids"].as_array().unwrap().is_empty()));
    sim.vgpu(&["run", "--mem", "12G", "--", "true"]).assert().failure().stderr(predicate::str::contains("orphan"));
    child.kill().unwrap();
    child.wait().unwrap();
    // No other command in between: the run's own reconcile frees the 12 GiB it asks for.
    sim.vgpu(&["run", "--mem", "12G", "--", "true"]).assert().success().stderr(predicate::str::contains("cleaned up workload orphan"));
    assert!(ps(&sim).is_empty());
}

/// `vgpu ps` (root, the lock free) gives back the device memory of a process that died
/// holding it — here SIGKILLed inside a workload that runs on — before it lists: its
/// reconcile still looks at every vGPU's processes (a `vgpu run`'s admission does not, it
/// reads no usage).
#[test]
fn ps_gives_back_the_memory_of_a_killed_process_before_it_lists() {
    let sim = Sim::new(GPU16);
    let ready = sim.path("ready");
    let script = format!(
        "{} idle 300 --alloc-mib 1024 --ready {} & echo $! > {}; sleep 300",
        crate::common::workload::workload_bin().display(),
        ready.display(),
        sim.path("cuda.pid").display()
    );
    let mut holder = sim.spawn(&["run", "--mem", "4G", "--name", "holder", "--", "sh", "-c", &script]);
    wait_for("the process to allocate 1 GiB", || ready.exists());
    let used = |sim: &Sim| sim.row("holder")["gpus"][0]["memory_used_bytes"].as_u64();
    let cuda: i32 = std::fs::read_to_string(sim.path("cuda.pid")).unwrap().trim().parse().unwrap();
    assert_eq!(used(&sim), Some(1 << 30));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(cuda), nix::sys::signal::Signal::SIGKILL).unwrap();
    wait_for("the process to die", || std::fs::read_to_string(format!("/proc/{cuda}/stat")).map(|s| s.contains(") Z")).unwrap_or(true));
    // The workload runs on (its shell sleeps); its usage file still counts the dead one's
    // GiB until a reconcile gives it back: this listing's.
    assert_eq!(sim.row("holder")["state"], "running");
    assert_eq!(used(&sim), Some(0));
    sim.vgpu(&["kill", "holder"]).assert().success();
    holder.wait().unwrap();
}

#[test]
fn admission_never_over_commits_under_concurrency() {
    let sim = Sim::new(GPU16);
    let marker = sim.path("running");
    std::fs::create_dir_all(&marker).unwrap();
    let script = format!(
        "n=$(ls {m} | wc -l); touch {m}/$$; n=$(ls {m} | wc -l); echo $n >> {m}.max; sleep 0.4; rm {m}/$$",
        m = marker.display()
    );
    let mut children = Vec::new();
    for _ in 0..20 {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_vgpu"));
        cmd.args(["--simulate", "run", "--mem", "4G", "--", "sh", "-c", &script]);
        for (k, v) in sim.env() {
            cmd.env(k, v);
        }
        children.push(cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap());
    }
    let mut admitted = 0;
    let mut refused = 0;
    for child in children {
        let out = child.wait_with_output().unwrap();
        match out.status.code() {
            Some(0) => admitted += 1,
            Some(1) => {
                assert!(String::from_utf8_lossy(&out.stderr).contains("does not fit"), "{}", String::from_utf8_lossy(&out.stderr));
                refused += 1
            }
            other => panic!("unexpected exit {other:?}: {}", String::from_utf8_lossy(&out.stderr)),
        }
    }
    let max_seen: u32 = std::fs::read_to_string(format!("{}.max", marker.display()))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .max()
        .unwrap_or(0);
    assert!(max_seen <= 4, "{max_seen} workloads of 4 GiB ran at once on a 16 GiB GPU");
    assert!(admitted >= 4, "admitted {admitted}, refused {refused}");
    assert_eq!(admitted + refused, 20);
}

#[test]
fn suspend_stops_progress_and_resume_restarts_it() {
    let sim = Sim::new(GPU16);
    let counter = sim.path("counter");
    let script = format!("i=0; while :; do i=$((i+1)); echo $i > {}; done", counter.display());
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_vgpu"));
    cmd.args(["--simulate", "run", "--mem", "1G", "--name", "spinner", "--", "sh", "-c", &script]);
    for (k, v) in sim.env() {
        cmd.env(k, v);
    }
    let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let read = || std::fs::read_to_string(&counter).ok().and_then(|s| s.trim().parse::<u64>().ok()).unwrap_or(0);
    wait_for("progress", || read() > 100);
    sim.vgpu(&["suspend", "spinner"]).assert().success().stdout(predicate::str::contains("suspended"));
    std::thread::sleep(Duration::from_millis(100));
    let frozen_at = read();
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(read(), frozen_at, "a suspended workload made progress");
    assert!(ps(&sim)[0]["state"] == "suspended");
    sim.vgpu(&["resume", "spinner"]).assert().success();
    wait_for("progress after resume", || read() > frozen_at + 100);
    sim.vgpu(&["kill", "--signal", "KILL", "spinner"]).assert().success();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(137));
}

#[test]
fn privileges_drop_to_the_sudo_user() {
    let sim = Sim::new(GPU16);
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    let out_file = sim.path("owned");
    // Sticky, like /tmp: nobody may write there, and the store below it is still safe.
    std::fs::set_permissions(sim.dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
    sim.vgpu(&["run", "--mem", "1G", "--", "sh", "-c", &format!("id -u > {}; echo $HOME >> {}", out_file.display(), out_file.display())])
        .env("SUDO_UID", nobody.uid.to_string())
        .env("SUDO_USER", "nobody")
        .assert()
        .success();
    let text = std::fs::read_to_string(&out_file).unwrap();
    assert_eq!(text.lines().next().unwrap(), nobody.uid.to_string());
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(&out_file).unwrap().uid(), nobody.uid.as_raw());
    // Through sudo, --user may name only the caller (tests/host/run_policy.rs has the rest).
    sim.vgpu(&["run", "--user", "root", "--mem", "1G", "--", "sh", "-c", "test $(id -u) = 0"])
        .env("SUDO_UID", nobody.uid.to_string())
        .assert()
        .code(2);
}

#[test]
fn bad_input_leaves_nothing_behind() {
    let sim = Sim::new(GPU16);
    sim.vgpu(&["partition", "create", "half", "--gpu", "0", "--mem", "8G"]).assert().success();
    let before = files_below(sim.dir.path());
    let cases: &[(&[&str], i32, &str)] = &[
        (&["run", "--gpu", "7", "--", "true"], 2, "no GPU with index 7"),
        (&["run", "--mem", "4X", "--", "true"], 2, "--mem"),
        (&["run", "--mem", "150%", "--", "true"], 2, "--mem"),
        (&["run", "--compute", "0", "--", "true"], 2, "compute"),
        (&["run", "--partition", "nope", "--", "true"], 2, "no partition"),
        (&["run", "--mem", "9G", "--", "true"], 1, "partition half 8 GiB"),
        (&["run", "--mem", "1G", "--", "no-such-command-xyz"], 127, "command not found"),
        (&["run", "--user", "no-such-user-xyz", "--", "true"], 2, "unknown user"),
        (&["run", "--cpus", "-1", "--", "true"], 2, "cpus"),
        (&["run", "--env", "NOEQUALS", "--", "true"], 2, "--env"),
    ];
    for (args, code, needle) in cases {
        sim.vgpu(args).assert().code(*code).stderr(predicate::str::contains(*needle));
    }
    // No state, no vGPU, no pool entry (and so no cgroup: each is named after a recorded id).
    assert_eq!(files_below(sim.dir.path()), before, "a refused run left files behind");
}

#[test]
fn non_root_is_refused_clearly() {
    let sim = Sim::new(GPU16);
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_vgpu"));
    cmd.args(["--simulate", "run", "--mem", "1G", "--", "true"]);
    for (k, v) in sim.env() {
        cmd.env(k, v);
    }
    use std::os::unix::process::CommandExt;
    cmd.uid(nobody.uid.as_raw()).gid(nobody.gid.as_raw());
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("must run as root"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn partitions_lifecycle() {
    let sim = Sim::new(GPU16);
    sim.vgpu(&["partition", "create", "serve", "--gpu", "0", "--mem", "6G", "--compute", "50"]).assert().success();
    sim.vgpu(&["partition", "create", "serve", "--gpu", "0", "--mem", "1G"]).assert().code(2);
    sim.vgpu(&["partition", "create", "big", "--gpu", "0", "--mem", "11G"]).assert().code(1).stderr(predicate::str::contains("partition serve"));
    let list = sim.json(&["partition", "list", "--json"])["partitions"].clone();
    assert_eq!(list[0]["name"], "serve");
    assert_eq!(list[0]["memory_quota_bytes"], 6u64 << 30);
    assert_eq!(list[0]["compute_pct"], 50);
    // In use → refused.
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_vgpu"));
    cmd.args(["--simulate", "run", "--partition", "serve", "--", "sleep", "30"]);
    for (k, v) in sim.env() {
        cmd.env(k, v);
    }
    let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    wait_for("the partition's workload", || !ps(&sim).is_empty());
    assert_eq!(ps(&sim)[0]["partition"], "serve");
    sim.vgpu(&["partition", "remove", "serve"]).assert().code(1).stderr(predicate::str::contains("in use"));
    sim.vgpu(&["kill", "--signal", "KILL", ps(&sim)[0]["id"].as_str().unwrap()]).assert().success();
    child.wait().unwrap();
    sim.vgpu(&["partition", "remove", "serve"]).assert().success();
    assert_eq!(sim.json(&["partition", "list", "--json"])["partitions"].clone(), serde_json::json!([]));
}

fn hold_script() -> String {
    format!("{}/tests/fixtures/cuda_hold.py", concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

#[test]
fn shim_end_to_end_a_4g_vgpu_is_4g_and_ooms_past_it() {
    let sim = Sim::new(GPU16);
    let out = sim.vgpu(&["run", "--mem", "4G", "--", "python3", &hold_script(), "5"]).write_stdin("").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(&format!("total={}", 4u64 << 30)), "{stdout}");
    assert_eq!(stdout.lines().filter(|l| *l == "ok").count(), 4, "{stdout}");
    assert_eq!(stdout.lines().filter(|l| *l == "oom").count(), 1, "{stdout}");
}

#[test]
fn two_workloads_of_one_partition_share_its_quota() {
    let sim = Sim::new(GPU16);
    sim.vgpu(&["partition", "create", "shared", "--gpu", "0", "--mem", "4G"]).assert().success();
    let ready = sim.path("ready");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_vgpu"));
    cmd.args(["--simulate", "run", "--partition", "shared", "--name", "holder", "--", "python3", &hold_script(), "3", ready.to_str().unwrap()]);
    for (k, v) in sim.env() {
        cmd.env(k, v);
    }
    let mut holder = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    wait_for("the holder to allocate 3 GiB", || ready.exists());
    // The second workload of the partition finds 1 GiB left of its 4.
    let out = sim.vgpu(&["run", "--partition", "shared", "--", "python3", &hold_script(), "2"]).write_stdin("").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert_eq!(stdout.lines().filter(|l| *l == "ok").count(), 1, "{stdout}");
    assert_eq!(stdout.lines().filter(|l| *l == "oom").count(), 1, "{stdout}");
    // ps shows the partition's usage, and -a the holder's process.
    let rows = sim.json(&["ps", "-a", "--json"])["workloads"].clone();
    let row = rows.as_array().unwrap().iter().find(|w| w["name"] == "holder").unwrap().clone();
    assert_eq!(row["gpus"][0]["memory_used_bytes"], 3u64 << 30);
    assert_eq!(row["gpus"][0]["memory_quota_bytes"], 4u64 << 30);
    assert_eq!(row["processes"][0]["memory_used_bytes"][0], 3u64 << 30);
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
}

#[test]
fn a_damaged_state_file_is_named_and_blocks_only_admission() {
    let sim = Sim::new(GPU16);
    sim.vgpu(&["ps"]).assert().success(); // the store, made by vgpu (the directories' modes are checked)
    std::fs::write(sim.path("run/workloads/deadbeef.json"), b"{ this is not json").unwrap();
    sim.vgpu(&["ps"]).assert().success().stderr(predicate::str::contains("deadbeef.json").and(predicate::str::contains("damaged")));
    // Its reservation is unknown: memory admission is refused until `vgpu doctor --repair`
    // removes it (tests/host/damaged_state.rs); everything else works.
    sim.vgpu(&["run", "--mem", "1G", "--", "true"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("deadbeef.json").and(predicate::str::contains("vgpu doctor --repair")));
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_vgpu"));
    cmd.args(["--simulate", "run", "--mem", "1G", "--oversubscribe", "--name", "alive", "--", "sleep", "30"]);
    for (k, v) in sim.env() {
        cmd.env(k, v);
    }
    let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    wait_for("the workload to be listed despite the damaged file", || ps(&sim).iter().any(|w| w["name"] == "alive"));
    sim.vgpu(&["kill", "--signal", "KILL", "alive"]).assert().success();
    child.wait().unwrap();
}

#[test]
fn ctrl_c_on_a_terminal_reaches_the_workload_once() {
    let sim = Sim::new(GPU16);
    let count = sim.path("sigints");
    // The workload counts the SIGINTs it gets, then exits 130 like an interrupted program.
    let script = format!(
        "trap 'echo int >> {c}; sleep 0.3; exit 130' INT; echo READY; while :; do sleep 0.05; done",
        c = count.display()
    );
    let vgpu = env!("CARGO_BIN_EXE_vgpu");
    let helper = format!("{}/tests/fixtures/ctrl_c.py", concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    let mut cmd = std::process::Command::new("python3");
    cmd.args([helper.as_str(), vgpu, "--simulate", "run", "--mem", "1G", "--", "sh", "-c", &script]);
    for (k, v) in sim.env() {
        cmd.env(k, v);
    }
    cmd.env("VGPU_LOG", "vgpu=debug");
    let out = cmd.output().unwrap();
    let terminal = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(130), "{terminal}");
    assert_eq!(std::fs::read_to_string(&count).unwrap_or_default().lines().count(), 1, "the workload did not get exactly one SIGINT");
    // The terminal delivered it to the whole foreground group; vgpu must not send another.
    assert!(!terminal.contains("relaying signal 2"), "vgpu relayed the terminal's SIGINT a second time: {terminal}");
    assert!(ps(&sim).is_empty());
}
