//! What a user with sudo rights to `vgpu` can do with them, as attacks (issue 24, part A),
//! end to end on real cgroups with the simulated driver; needs root. Nothing they name is
//! resolved as root (`--cwd`, a workload file and its `cwd`), their strings are stored
//! bounded, `[policy] max_mem` caps their GPU memory, and they act only on their own
//! workloads. A sudo caller is `SUDO_UID`/`SUDO_GID`/`SUDO_USER` of `nobody`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::{files_below, wait_for, Sim};

const GPU16: &[(&str, &str)] = &[("NVIDIA A16-sim", "16GiB")];
const SECRET: &str = "TOP-SECRET-b7e1";

/// `vgpu --simulate ARGS…` as root itself: no sudo variables from the test's own environment.
fn as_root(sim: &Sim, args: &[&str]) -> assert_cmd::Command {
    let mut cmd = sim.vgpu(args);
    cmd.env_remove("SUDO_UID").env_remove("SUDO_GID").env_remove("SUDO_USER").env_remove("SUDO_COMMAND");
    cmd.timeout(Duration::from_secs(60));
    cmd
}

fn nobody() -> nix::unistd::User {
    nix::unistd::User::from_name("nobody").unwrap().expect("user nobody")
}

/// `vgpu --simulate ARGS…` as if `sudo vgpu …` had been run by `nobody`.
fn as_sudo_nobody(sim: &Sim, args: &[&str]) -> assert_cmd::Command {
    let nobody = nobody();
    let mut cmd = sim.vgpu(args);
    cmd.env("SUDO_UID", nobody.uid.to_string()).env("SUDO_GID", nobody.gid.to_string()).env("SUDO_USER", "nobody");
    cmd.timeout(Duration::from_secs(60));
    cmd
}

/// A simulation whose directory the workload's user may cross (as in CI's /tmp).
fn sim() -> Sim {
    let sim = Sim::new(GPU16);
    std::fs::set_permissions(sim.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    sim
}

/// `private/` (root's, 0700) holding `sub/` (0755) and `sub/secret` (0644): what is in
/// `sub` anyone could read who got into it, and only root can get there.
fn private_dir(sim: &Sim) -> PathBuf {
    let sub = sim.path("private/sub");
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::write(sub.join("secret"), SECRET).unwrap();
    std::fs::set_permissions(sub.join("secret"), std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(sim.path("private"), std::fs::Permissions::from_mode(0o700)).unwrap();
    sub
}

/// Runs `cmd`, expecting a refusal: exit `code`, one line on stderr, nothing of the secret
/// anywhere, no file left behind. Returns the line.
fn refused(sim: &Sim, mut cmd: assert_cmd::Command, code: i32) -> String {
    let before = files_below(&sim.path("run"));
    let out = cmd.output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!stdout.contains(SECRET) && !stderr.contains(SECRET), "the secret leaked:\n{stdout}\n{stderr}");
    assert_eq!(out.status.code(), Some(code), "stdout: {stdout}\nstderr: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "not one line: {stderr}");
    assert_eq!(files_below(&sim.path("run")), before, "a refused run left files behind");
    stderr.trim_end().to_string()
}

/// A process ended (and reaped) when the test ends, pass or fail: SIGTERM first (a `vgpu
/// run` relays it to its workload and cleans up), SIGKILL if it is still there after 10 s.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child, not reaped yet.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if !matches!(self.0.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `vgpu run ARGS…` in the background, once `vgpu ps` shows workload `name` running with
/// its process.
fn start(sim: &Sim, sudo: bool, args: &[&str], name: &str) -> Killed {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_vgpu"));
    cmd.arg("--simulate").args(args).envs(sim.env()).env_remove("SUDO_UID").env_remove("SUDO_GID").env_remove("SUDO_USER");
    if sudo {
        let nobody = nobody();
        cmd.env("SUDO_UID", nobody.uid.to_string()).env("SUDO_GID", nobody.gid.to_string()).env("SUDO_USER", "nobody");
    }
    let child = Killed(cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().expect("vgpu run"));
    wait_for(&format!("{name} to run"), || {
        sim.ps().iter().any(|w| w["name"] == name && w["state"] == "running" && w["pids"].as_array().is_some_and(|p| !p.is_empty()))
    });
    child
}

/// Ends workload `name` (root's `vgpu kill`) and waits for its `vgpu run`.
fn stop(sim: &Sim, mut run: Killed, name: &str) {
    as_root(sim, &["kill", name]).assert().success();
    assert_eq!(run.0.wait().unwrap().code(), Some(143), "{name}");
}

#[test]
fn cwd_into_a_directory_closed_to_the_caller_is_refused_and_reads_nothing() {
    let sim = sim();
    let sub = private_dir(&sim);
    let sub_arg = sub.to_str().unwrap();
    let line = refused(&sim, as_sudo_nobody(&sim, &["run", "--mem", "1G", "--cwd", sub_arg, "--", "cat", "secret"]), 2);
    assert!(line.contains("--cwd") && line.contains("nobody cannot enter it"), "{line}");
    // A relative program there is no way in either.
    refused(&sim, as_sudo_nobody(&sim, &["run", "--mem", "1G", "--cwd", sub_arg, "--", "/bin/cat", "./secret"]), 2);

    // What the caller learns of a hidden directory is what `cd` would tell them: the same
    // for one that exists and one that does not.
    let missing = sim.path("private/missing");
    let other = refused(&sim, as_sudo_nobody(&sim, &["run", "--mem", "1G", "--cwd", missing.to_str().unwrap(), "--", "true"]), 2);
    assert_eq!(line.replace(sub_arg, "DIR"), other.replace(missing.to_str().unwrap(), "DIR"));
    // Where they can look, a missing directory is named missing.
    let open_missing = sim.path("open-missing");
    let line = refused(&sim, as_sudo_nobody(&sim, &["run", "--mem", "1G", "--cwd", open_missing.to_str().unwrap(), "--", "true"]), 2);
    assert!(line.ends_with("no such directory"), "{line}");

    // Root naming another user checks as that user too; root itself goes where it likes.
    refused(&sim, as_root(&sim, &["run", "--mem", "1G", "--user", "nobody", "--cwd", sub_arg, "--", "cat", "secret"]), 2);
    let out = as_root(&sim, &["run", "--mem", "1G", "--cwd", sub_arg, "--", "cat", "secret"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), SECRET);
}

#[test]
fn cwd_through_a_root_process_s_proc_cwd_is_refused() {
    let sim = sim();
    let sub = private_dir(&sim);
    // A root process whose working directory is the hidden one.
    let holder = Killed(std::process::Command::new("sleep").arg("600").current_dir(&sub).spawn().expect("sleep"));
    let through = format!("/proc/{}/cwd", holder.0.id());
    wait_for("the root process's cwd", || std::fs::read_link(&through).is_ok_and(|p| p == sub));
    let line = refused(&sim, as_sudo_nobody(&sim, &["run", "--mem", "1G", "--cwd", &through, "--", "cat", "secret"]), 2);
    assert!(line.contains(&through), "{line}");
}

#[test]
fn a_workload_file_s_cwd_is_entered_as_the_caller() {
    let sim = sim();
    let sub = private_dir(&sim);
    let file = sim.path("mine.toml");
    std::fs::write(&file, format!("mem = \"1G\"\ncwd = {:?}\ncommand = [\"cat\", \"secret\"]\n", sub.to_str().unwrap())).unwrap();
    std::os::unix::fs::chown(&file, Some(nobody().uid.as_raw()), None).unwrap();
    let line = refused(&sim, as_sudo_nobody(&sim, &["run", "--workload", file.to_str().unwrap()]), 2);
    assert!(line.contains("nobody cannot enter it"), "{line}");
}

/// A service's `cwd` is checked as the user its replicas run as, when it is defined.
#[test]
fn a_service_s_cwd_is_checked_as_the_caller_when_it_is_defined() {
    let sim = sim();
    let sub = private_dir(&sim);
    let args = ["service", "create", "peek", "--replicas", "1", "--mem", "1G", "--cwd", sub.to_str().unwrap(), "--", "cat", "secret"];
    let line = refused(&sim, as_sudo_nobody(&sim, &args), 2);
    assert!(line.contains("nobody cannot enter it"), "{line}");
    assert!(!sim.path("lib/services/peek.toml").exists(), "the service was defined");
}

#[test]
fn a_cwd_the_caller_may_enter_works_and_the_program_runs_there() {
    let sim = sim();
    let nobody = nobody();
    let open = sim.path("mine");
    std::fs::create_dir(&open).unwrap();
    let script = open.join("job.sh");
    std::fs::write(&script, "#!/bin/sh\npwd\nid -u\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(&open, Some(nobody.uid.as_raw()), Some(nobody.gid.as_raw())).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o700)).unwrap();
    let out = as_sudo_nobody(&sim, &["run", "--mem", "1G", "--cwd", open.to_str().unwrap(), "--", "./job.sh"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{}\n{}\n", open.display(), nobody.uid));
}

/// A thread blocked opening `fifo` for writing: its open returns only once something opens
/// the FIFO for reading. Dropped, it opens the reading end itself and joins the thread.
struct BlockedWriter {
    fifo: PathBuf,
    tid: i32,
    done: std::sync::mpsc::Receiver<()>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl BlockedWriter {
    fn start(fifo: &Path) -> BlockedWriter {
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (done_tx, done) = std::sync::mpsc::channel();
        let path = fifo.to_path_buf();
        let thread = std::thread::spawn(move || {
            let _ = tid_tx.send(nix::unistd::gettid().as_raw());
            let opened = std::fs::OpenOptions::new().write(true).open(&path);
            let _ = done_tx.send(());
            drop(opened);
        });
        let tid = tid_rx.recv().expect("the writer's tid");
        let writer = BlockedWriter { fifo: fifo.to_path_buf(), tid, done, thread: Some(thread) };
        wait_for("the writer to wait for a reader", || writer.waiting());
        writer
    }

    /// Still in its open, waiting for a reader (the kernel says so: nothing woke it).
    fn waiting(&self) -> bool {
        std::fs::read_to_string(format!("/proc/self/task/{}/wchan", self.tid)).is_ok_and(|w| w.trim() == "wait_for_partner")
            && self.done.try_recv().is_err()
    }
}

impl Drop for BlockedWriter {
    fn drop(&mut self) {
        use std::os::unix::fs::OpenOptionsExt;
        let _reader = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&self.fifo);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `--workload` naming a FIFO (or a device) is refused without being opened: a FIFO whose
/// writer waits for a reader still waits afterwards (an open for reading, even
/// non-blocking, would have released it), and nothing blocks.
#[test]
fn a_workload_file_that_is_a_fifo_or_a_device_is_refused_without_being_opened() {
    let sim = sim();
    let fifo = sim.path("w.toml");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
    std::os::unix::fs::chown(&fifo, Some(nobody().uid.as_raw()), None).unwrap();
    let writer = BlockedWriter::start(&fifo);
    for cmd in [as_sudo_nobody(&sim, &["run", "--workload", fifo.to_str().unwrap()]), as_root(&sim, &["run", "--workload", fifo.to_str().unwrap()])] {
        let line = refused(&sim, cmd, 2);
        assert!(line.contains("not a regular file"), "{line}");
        // vgpu has exited: had it opened the FIFO, the writer would be running by now.
        assert!(writer.waiting(), "vgpu opened the FIFO");
    }
    drop(writer);
    for device in ["/dev/null", "/dev/zero"] {
        let line = refused(&sim, as_sudo_nobody(&sim, &["run", "--workload", device]), 2);
        assert!(line.contains("not a regular file"), "{line}");
    }
}

/// A workload file behind a directory closed to the caller: the same error whether it
/// exists or not (opened as root, an existing one was read and run).
#[test]
fn a_workload_file_behind_a_closed_directory_reads_as_missing_for_the_caller() {
    let sim = sim();
    let sub = private_dir(&sim);
    let marker = sim.path("ran");
    let hidden = sub.join("mine.toml");
    std::fs::write(&hidden, format!("mem = \"1G\"\ncommand = [\"touch\", {:?}]\n", marker.to_str().unwrap())).unwrap();
    std::os::unix::fs::chown(&hidden, Some(nobody().uid.as_raw()), None).unwrap();
    let missing = sub.join("none.toml");
    let a = refused(&sim, as_sudo_nobody(&sim, &["run", "--workload", hidden.to_str().unwrap()]), 2);
    let b = refused(&sim, as_sudo_nobody(&sim, &["run", "--workload", missing.to_str().unwrap()]), 2);
    assert_eq!(a.replace(hidden.to_str().unwrap(), "PATH"), b.replace(missing.to_str().unwrap(), "PATH"));
    assert!(a.contains("ermission denied"), "{a}");
    assert!(!marker.exists(), "the workload ran");
}

/// 1.2 MB of arguments: the workload gets them all; the record, `vgpu ps --json` and the
/// history keep at most 4 KiB, with a marker.
#[test]
fn a_long_command_line_is_stored_bounded() {
    const CAP: usize = 4096;
    let sim = sim();
    let count = sim.path("count");
    let script = format!("echo $# > {}; exec sleep 600", count.display());
    let args: Vec<String> = (0..12).map(|i| format!("{i}{}", "a".repeat(100_000))).collect();
    let mut argv: Vec<&str> = vec!["--simulate", "run", "--name", "long", "--mem", "1G", "--", "sh", "-c", &script, "sh"];
    argv.extend(args.iter().map(String::as_str));
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_vgpu"));
    cmd.args(&argv).envs(sim.env()).env_remove("SUDO_UID").stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
    let run = Killed(cmd.spawn().expect("vgpu run"));
    wait_for("the workload to start", || std::fs::read_to_string(&count).is_ok_and(|c| c.ends_with('\n')));
    assert_eq!(std::fs::read_to_string(&count).unwrap().trim(), "12", "the workload did not get every argument");

    let row = sim.row("long");
    let id = row["id"].as_str().unwrap().to_string();
    let record = std::fs::read_to_string(sim.path(&format!("run/workloads/{id}.json"))).unwrap();
    assert!(record.len() < 2 * CAP, "the record is {} bytes", record.len());
    let stored: Vec<String> = serde_json::from_value(serde_json::from_str::<serde_json::Value>(&record).unwrap()["command"].clone()).unwrap();
    let listed: Vec<String> = serde_json::from_value(row["command"].clone()).unwrap();
    for command in [&stored, &listed] {
        let line = command.join(" ");
        assert!(line.len() <= CAP, "{} bytes stored", line.len());
        assert!(line.starts_with(&format!("sh -c {script} sh 0aaa")), "{}", &line[..80]);
        assert!(line.ends_with("… [cut 1.14 MiB]"), "{}", &line[line.len() - 40..]);
    }

    stop(&sim, run, "long");
    let db = rusqlite::Connection::open(sim.path("lib/history.db")).unwrap();
    let command: String = db.query_row("SELECT command FROM workloads WHERE id = ?1", [&id], |r| r.get(0)).unwrap();
    assert!(command.len() <= CAP && command.ends_with("… [cut 1.14 MiB]"), "{} bytes in the history", command.len());
}

/// `[policy] max_mem` caps a sudo caller's GPU memory on every GPU, however placed: without
/// `--mem` (the whole GPU) lowered to it, above it refused; root is not capped.
#[test]
fn policy_max_mem_caps_a_sudo_caller_on_every_gpu() {
    let sim = Sim::new(&[("NVIDIA A16-sim", "16GiB"), ("NVIDIA A16-sim", "16GiB")]);
    std::fs::set_permissions(sim.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    sim.write_vgpu_config("[policy]\nmax_mem = \"4G\"\n");
    const GIB: u64 = 1 << 30;
    let quotas = |name: &str| -> Vec<u64> { sim.row(name)["gpus"].as_array().unwrap().iter().map(|g| g["memory_quota_bytes"].as_u64().unwrap()).collect() };
    // --gpus all without --mem: every GPU, 4 GiB of each.
    let all = start(&sim, true, &["run", "--name", "all", "--gpus", "all", "--", "sleep", "600"], "all");
    assert_eq!(quotas("all"), [4 * GIB, 4 * GIB]);
    // Above the cap, however said, on run and update: refused.
    for args in [
        &["run", "--gpus", "all", "--mem", "8G", "--", "true"][..],
        &["run", "--mem", "50%", "--", "true"][..],
        &["run", "--gpu", "1", "--mem", "5G", "--", "true"][..],
        &["update", "all", "--mem", "6G"][..],
    ] {
        let line = refused(&sim, as_sudo_nobody(&sim, args), 2);
        assert!(line.contains("max_mem") && line.contains("above 4 GiB"), "{args:?}: {line}");
    }
    assert_eq!(quotas("all"), [4 * GIB, 4 * GIB], "a refused update changed the quota");
    stop(&sim, all, "all");
    // Within it: runs; --gpus N as well.
    let two = start(&sim, true, &["run", "--name", "two", "--gpus", "2", "--mem", "25%", "--", "sleep", "600"], "two");
    assert_eq!(quotas("two"), [4 * GIB, 4 * GIB]);
    stop(&sim, two, "two");
    // Root is not capped.
    let root = start(&sim, false, &["run", "--name", "root", "--gpus", "all", "--", "sleep", "600"], "root");
    assert_eq!(quotas("root"), [16 * GIB, 16 * GIB]);
    stop(&sim, root, "root");
}

/// Through sudo, `update`, `suspend`, `resume` and `kill` act on the caller's own workloads
/// only: root's (and anyone else's) are refused, one line, exit 2, nothing changed; root
/// acts on all.
#[test]
fn a_sudo_caller_acts_only_on_their_own_workloads() {
    let sim = sim();
    let roots = start(&sim, false, &["run", "--name", "roots", "--mem", "1G", "--compute", "50", "--", "sleep", "600"], "roots");
    let mut mine = start(&sim, true, &["run", "--name", "mine", "--mem", "1G", "--compute", "50", "--", "sleep", "600"], "mine");
    let before = sim.row("roots");
    for args in [
        &["suspend", "roots"][..],
        &["suspend", "mine", "roots"][..],
        &["kill", "roots"][..],
        &["kill", "-s", "KILL", "mine", "roots"][..],
        &["update", "roots", "--compute", "10"][..],
        &["update", "mine", "roots", "--priority", "10"][..],
        &["resume", "roots"][..],
    ] {
        let line = refused(&sim, as_sudo_nobody(&sim, args), 2);
        assert!(line.contains("roots") && line.contains("runs as root") && line.contains("only your own workloads"), "{args:?}: {line}");
        let (now, mine) = (sim.row("roots"), sim.row("mine"));
        assert_eq!((&now["state"], &now["pids"], &now["priority"], &now["gpus"][0]["compute_pct"]), (&before["state"], &before["pids"], &before["priority"], &before["gpus"][0]["compute_pct"]), "{args:?} changed root's workload");
        assert_eq!((&mine["state"], mine["gpus"][0]["compute_pct"].as_u64()), (&serde_json::json!("running"), Some(50)), "{args:?} changed the caller's own workload");
    }
    // Suspended by root, it stays so for the sudo caller's resume.
    as_root(&sim, &["suspend", "roots"]).assert().success();
    refused(&sim, as_sudo_nobody(&sim, &["resume", "roots"]), 2);
    assert_eq!(sim.row("roots")["state"], "suspended");
    as_root(&sim, &["resume", "roots"]).assert().success();
    // Their own: every command works.
    for args in [&["update", "mine", "--compute", "20"][..], &["suspend", "mine"][..], &["resume", "mine"][..]] {
        as_sudo_nobody(&sim, args).assert().success();
    }
    assert_eq!(sim.row("mine")["gpus"][0]["compute_pct"], 20);
    as_sudo_nobody(&sim, &["kill", "mine"]).assert().success();
    assert_eq!(mine.0.wait().unwrap().code(), Some(143));
    // Root acts on anyone's.
    stop(&sim, roots, "roots");
}
