//! The man page is generated from the clap definition; it must never go stale.
//! Regenerate with: VGPU_BLESS=1 cargo test --test cli_docs

mod common;

use std::path::{Path, PathBuf};

use common::Sim;

#[test]
fn man_page_is_in_sync_with_the_cli() {
    let rendered = vgpu::cli::render_man_page().expect("render man page");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("man/vgpu.1");
    if std::env::var_os("VGPU_BLESS").is_some() {
        std::fs::write(&path, &rendered).expect("write man/vgpu.1");
    }
    let on_disk = std::fs::read(&path).unwrap_or_default();
    assert!(
        on_disk == rendered,
        "man/vgpu.1 is stale: regenerate it with `VGPU_BLESS=1 cargo test --test cli_docs`"
    );
    let text = String::from_utf8_lossy(&rendered);
    for needle in [".TH vgpu 1", "devices", "doctor", "completions", "\\-\\-simulate", "VGPU_STATE_DIR"] {
        assert!(text.contains(needle), "man page lacks {needle:?}");
    }
}

#[test]
fn completion_scripts_call_back_into_vgpu() {
    // Each shell's script registers a function that asks `vgpu` itself (COMPLETE=SHELL), so
    // that what completes is what exists now: workloads, partitions.
    for (shell, marker) in [("bash", "complete -o nospace"), ("zsh", "#compdef vgpu"), ("fish", "complete --keep-order --exclusive --command vgpu")] {
        let out = assert_cmd::Command::cargo_bin("vgpu").unwrap().args(["completions", shell]).output().unwrap();
        assert!(out.status.success(), "{shell}: {}", String::from_utf8_lossy(&out.stderr));
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(script.contains(marker), "{shell} script lacks {marker:?}: {script}");
        assert!(script.contains(&format!("COMPLETE=\"{shell}\"")) || script.contains(&format!("COMPLETE={shell}")), "{shell} script does not call back: {script}");
        // `COMPLETE=SHELL vgpu` (the clap_complete convention) prints it too, calling back
        // into vgpu by the path it was started as.
        let bin = env!("CARGO_BIN_EXE_vgpu");
        let direct = assert_cmd::Command::cargo_bin("vgpu").unwrap().env("COMPLETE", shell).output().unwrap();
        assert!(direct.status.success(), "COMPLETE={shell} vgpu");
        assert_eq!(String::from_utf8_lossy(&direct.stdout).replace(bin, "vgpu"), script, "{shell}");
    }
}

/// What bash completes for the command line `words` (the last one being completed), through
/// the script `vgpu completions bash` prints, with `vgpu` on PATH and `env` set.
fn bash_complete(env: &[(String, PathBuf)], words: &[&str]) -> Vec<String> {
    let script = r#"source <(vgpu completions bash) || exit 9
COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); COMP_TYPE=9
_clap_complete_vgpu vgpu "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}" 2>/dev/null
printf '%s\n' "${COMPREPLY[@]}""#;
    let bin_dir = common::artefact_dir();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let mut cmd = std::process::Command::new("bash");
    cmd.args(["-c", script, "bash"]).args(words).env("PATH", path).env_remove("VGPU_SIMULATE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("bash");
    assert!(out.status.success(), "bash completion of {words:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_string).collect()
}

#[test]
fn completions_list_subcommands_and_enumerated_values() {
    let sim = Sim::new(&[("NVIDIA A100-SXM4-40GB", "40GiB")]);
    let env = sim.env();
    let subcommands = bash_complete(&env, &["vgpu", ""]);
    for name in ["devices", "run", "kill", "partition", "completions"] {
        assert!(subcommands.iter().any(|s| s == name), "vgpu <TAB> lacks {name}: {subcommands:?}");
    }
    let signals = bash_complete(&env, &["vgpu", "kill", "--signal", ""]);
    for name in ["TERM", "KILL", "INT", "HUP", "USR1"] {
        assert!(signals.iter().any(|s| s == name), "--signal <TAB> lacks {name}: {signals:?}");
    }
    assert_eq!(bash_complete(&env, &["vgpu", "kill", "--signal", "KI"]), ["KILL"]);
    assert_eq!(bash_complete(&env, &["vgpu", "run", "--kind", ""]), ["gpu", "npu", "fpga", "any"]);
    assert_eq!(bash_complete(&env, &["vgpu", "run", "--compute-policy", ""]), ["strict", "fair"]);
    assert_eq!(bash_complete(&env, &["vgpu", "completions", "f"]), ["fish"]);
}

#[test]
fn completions_list_running_workloads_and_partitions() {
    let sim = Sim::new(&[("NVIDIA A100-SXM4-40GB", "40GiB")]);
    let env = sim.env();
    let values = |words: &[&str]| -> Vec<String> { bash_complete(&env, words).into_iter().filter(|c| !c.starts_with('-')).collect() };
    assert_eq!(values(&["vgpu", "kill", ""]), Vec::<String>::new(), "no workload yet");
    sim.vgpu(&["partition", "create", "shared", "--gpu", "0", "--mem", "4G"]).assert().success();
    let mut child = sim.spawn_running("train", &["--mem", "1G"], "exec sleep 600");
    let id = sim.row("train")["id"].as_str().expect("id").to_string();
    let listed = values(&["vgpu", "kill", ""]);
    assert!(listed.contains(&id) && listed.contains(&"train".to_string()), "vgpu kill <TAB>: {listed:?}, expected {id} and train");
    assert_eq!(bash_complete(&env, &["vgpu", "suspend", "tr"]), ["train"]);
    assert_eq!(bash_complete(&env, &["vgpu", "update", &id[..3]]), [id.clone()]);
    assert_eq!(bash_complete(&env, &["vgpu", "run", "--partition", ""]), ["shared"]);
    assert_eq!(bash_complete(&env, &["vgpu", "partition", "remove", "s"]), ["shared"]);
    // Completion reads the records as they are: a writer holding the store lock (taken
    // here with flock(1), as vgpu takes it) does not make it wait.
    let mut holder = std::process::Command::new("flock")
        .arg(sim.path("run/lock"))
        .args(["-c", "echo locked; read _"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("flock");
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(holder.stdout.take().unwrap()), &mut line).unwrap();
    assert_eq!(line.trim(), "locked");
    assert!(values(&["vgpu", "kill", ""]).contains(&id), "completion under a held lock");
    drop(holder.stdin.take());
    holder.wait().unwrap();
    sim.vgpu(&["kill", "train", "--signal", "KILL"]).assert().success();
    child.wait().unwrap();
}

#[test]
fn clap_definition_is_consistent() {
    vgpu::cli::command().debug_assert();
}
