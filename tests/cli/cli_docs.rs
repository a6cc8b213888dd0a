//! The man pages (one per command) are generated from the clap definition; they must never
//! go stale. Regenerate with: VGPU_BLESS=1 cargo test --test integration cli::cli_docs::
//! The completion scripts call back into vgpu; what they complete is tested through bash.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::common::{self, Sim};

/// The generated pages by file name.
fn rendered() -> BTreeMap<String, String> {
    vgpu::cli::man::pages().expect("render man pages").into_iter().map(|p| (p.file, String::from_utf8(p.roff).expect("UTF-8"))).collect()
}

#[test]
fn man_pages_are_in_sync_with_the_cli() {
    let pages = rendered();
    let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join("man");
    let on_disk = || -> BTreeMap<String, String> {
        std::fs::read_dir(&dir)
            .expect("man/")
            .map(|e| e.expect("entry").path())
            .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read_to_string(&p).unwrap_or_default()))
            .collect()
    };
    if std::env::var_os("VGPU_BLESS").is_some() {
        for name in on_disk().keys().filter(|n| !pages.contains_key(*n)) {
            std::fs::remove_file(dir.join(name)).expect("remove a page no command has");
        }
        for (name, text) in &pages {
            std::fs::write(dir.join(name), text).expect("write a page");
        }
    }
    let disk = on_disk();
    let stale: Vec<&String> = pages.keys().filter(|n| disk.get(*n) != pages.get(*n)).collect();
    let extra: Vec<&String> = disk.keys().filter(|n| !pages.contains_key(*n)).collect();
    assert!(
        stale.is_empty() && extra.is_empty(),
        "man/ is stale (missing or different: {stale:?}; no longer generated: {extra:?}): regenerate with `VGPU_BLESS=1 cargo test --test integration cli::cli_docs::`"
    );
}

/// The text of a page with roff's font switches and escaped hyphens undone.
fn plain(roff: &str) -> String {
    roff.replace("\\fB", "").replace("\\fI", "").replace("\\fR", "").replace("\\-", "-")
}

#[test]
fn every_command_has_a_page_with_the_standard_sections() {
    let pages = rendered();
    for name in ["vgpu.1", "vgpu-run.1", "vgpu-ps.1", "vgpu-kill.1", "vgpu-partition.1", "vgpu-partition-create.1", "vgpu-carbon-apply.1", "vgpu-completions.1"] {
        assert!(pages.contains_key(name), "no {name}: {:?}", pages.keys());
    }
    for (name, text) in &pages {
        let sections: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix(".SH ")).collect();
        for wanted in ["NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "\"EXIT STATUS\"", "\"SEE ALSO\""] {
            assert_eq!(sections.iter().filter(|s| **s == wanted).count(), 1, "{name}: section {wanted} not exactly once in {sections:?}");
        }
        let page = name.trim_end_matches(".1");
        assert!(text.starts_with(".ie") && text.contains(&format!(".TH {page} 1")), "{name}: title");
        assert_eq!(text.matches(".ie \\n(.g").count(), 1, "{name}: the roff preamble repeated");
    }
    let top = plain(&pages["vgpu.1"]);
    for needle in [".SH FILES", ".SH ENVIRONMENT", "/etc/vgpu/config.toml", "/etc/vgpu/workloads/NAME.toml", "/run/vgpu/workloads/ID.json", "/var/lib/vgpu/partitions.json"] {
        assert!(top.contains(needle), "vgpu.1 lacks {needle:?}");
    }
    for var in ["VGPU_CONFIG", "VGPU_STATE_DIR", "VGPU_LIB_DIR", "VGPU_SIMULATE", "VGPU_LOG"] {
        assert!(top.contains(var), "vgpu.1 ENVIRONMENT lacks {var}");
    }
    let run = plain(&pages["vgpu-run.1"]);
    for needle in ["LD_PRELOAD", "CUDA_VISIBLE_DEVICES", "VGPU_DIR", "VGPU_WORKLOAD_ID", "VGPU_NUM_GPUS", "127", "126", "128+N", "--gpus", "--memory"] {
        assert!(run.contains(needle), "vgpu-run.1 lacks {needle:?}");
    }
    // Options grouped under their help headings, inside the one OPTIONS section.
    for heading in [".SS \"GPU slice\"", ".SS \"Host limits\"", ".SS \"Compute pool\""] {
        assert!(run.contains(heading), "vgpu-run.1 lacks {heading}");
    }
    // Exit statuses come from the one list in src/error.rs.
    for (status, _, _) in vgpu_store::error::EXIT_STATUS_DOC {
        assert!(top.contains(&format!("\n{status}\n")), "vgpu.1 EXIT STATUS lacks {status}");
    }
}

#[test]
fn every_page_a_page_refers_to_exists() {
    let pages = rendered();
    let mut checked = 0;
    for (name, text) in &pages {
        let text = plain(text);
        // Every "vgpu…(N)" reference: the name before "(N)", back to a character that
        // cannot be in one.
        for (at, _) in text.match_indices("(1)") {
            let before = &text[..at];
            let start = before.rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')).map_or(0, |i| i + 1);
            let target = &before[start..];
            if target.starts_with("vgpu") {
                assert!(pages.contains_key(&format!("{target}.1")), "{name} refers to {target}(1), which has no page");
                checked += 1;
            }
        }
        if name != "vgpu.1" {
            assert!(text.contains("vgpu(1)"), "{name}: SEE ALSO lacks vgpu(1)");
        }
    }
    // vgpu(1) refers to every other page.
    let top = plain(&pages["vgpu.1"]);
    for name in pages.keys().filter(|n| *n != "vgpu.1") {
        assert!(top.contains(&format!("{}(1)", name.trim_end_matches(".1"))), "vgpu.1 does not refer to {name}");
    }
    assert!(checked > pages.len(), "too few references checked: {checked}");
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
    // fish asks the same way (one candidate a line, a tab before its description).
    let mut fish = assert_cmd::Command::cargo_bin("vgpu").unwrap();
    fish.env("COMPLETE", "fish").args(["--", "vgpu", "resume", ""]);
    for (k, v) in &env {
        fish.env(k, v);
    }
    let out = String::from_utf8(fish.output().unwrap().stdout).unwrap();
    assert!(out.lines().any(|l| l == format!("{id}\ttrain (running)")) && out.lines().any(|l| l.starts_with("train\t")), "fish: {out}");
    assert_eq!(bash_complete(&env, &["vgpu", "update", &id[..3]]), std::slice::from_ref(&id));
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

#[test]
fn help_groups_options_and_tells_gpu_memory_from_host_memory() {
    let help = |args: &[&str]| {
        let out = assert_cmd::Command::cargo_bin("vgpu").unwrap().args(args).output().unwrap();
        assert!(out.status.success());
        // One line: help wraps long texts at the terminal's width.
        String::from_utf8_lossy(&out.stdout).split_whitespace().collect::<Vec<_>>().join(" ")
    };
    let run = help(&["run", "--help"]);
    let at = |needle: &str| run.find(needle).unwrap_or_else(|| panic!("vgpu run --help lacks {needle:?}"));
    // Each option under its group: --mem with the GPU slice, --memory with the host limits.
    assert!(at("GPU slice:") < at("--mem <") && at("--mem <") < at("Compute pool:"));
    assert!(at("Host limits:") < at("--memory <") && at("--memory <") < at("Process:"));
    assert!(at("Compute pool:") < at("--kind <") && at("Carbon:") < at("--freq-sensitivity"));
    for needle in ["not host RAM: see --memory", "not GPU memory: see --mem", "for a number of whole GPUs see --gpus", "for particular GPUs see --gpu"] {
        at(needle);
    }
    let update = help(&["update", "--help"]);
    assert!(update.contains("GPU slice:") && update.contains("Compute pool:") && update.contains("not host RAM"), "{update}");
    let create = help(&["partition", "create", "--help"]);
    assert!(create.contains("GPU slice:") && create.contains("Access:") && create.contains("not host RAM"), "{create}");
}
