//! The carbon decision log is capped: past `[carbon] log_max_bytes` it is rotated to
//! `carbon.jsonl.1` (… `.log_keep`), whole lines only, and a rotation killed half-way loses
//! no more than the history it was rotating out.

use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::ExitStatusExt as _;
use std::path::PathBuf;

use crate::common::Sim;
use serde_json::Value;

const H100: (&str, &str) = ("NVIDIA H100 80GB HBM3", "80GiB");
const APPLY: &[&str] = &["carbon", "apply", "--json", "--intensity", "300", "--budget", "100"];

fn log_files(sim: &Sim) -> Vec<PathBuf> {
    let mut files = vec![sim.path("lib/carbon.jsonl")];
    files.extend((1..=9).map(|n| sim.path(&format!("lib/carbon.jsonl.{n}"))));
    files.into_iter().filter(|p| p.exists()).collect()
}

/// Every line of every log file, each checked to be a whole decision.
fn all_lines(sim: &Sim) -> usize {
    let mut count = 0;
    for file in log_files(sim) {
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(text.ends_with('\n'), "{} ends in a half line", file.display());
        for line in text.lines() {
            let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{}: {e}: {line}", file.display()));
            assert_eq!(v["action"], "apply");
            count += 1;
        }
    }
    count
}

/// Apply until `lib/carbon.jsonl.N` exists (at most 200 times); how many applies that took.
fn apply_until_exists(sim: &Sim, n: u32) -> usize {
    let path = sim.path(&format!("lib/carbon.jsonl.{n}"));
    for i in 1..=200 {
        sim.json(APPLY);
        if path.exists() {
            return i;
        }
    }
    panic!("{} never appeared", path.display());
}

#[test]
fn the_log_is_rotated_at_its_cap_keeping_log_keep_old_files() {
    let sim = Sim::new(&[H100]);
    sim.write_vgpu_config("[carbon]\nlog_max_bytes = 4096\nlog_keep = 2\n");
    let mut written = apply_until_exists(&sim, 1);
    assert!(written > 2, "a few lines fit in 4 KiB");
    assert_eq!(all_lines(&sim), written, "nothing dropped by the first rotation");
    written += apply_until_exists(&sim, 2);
    let kept_before = all_lines(&sim);
    assert_eq!(kept_before, written, "nor by the second (two old files are kept)");
    for _ in 0..written {
        sim.json(APPLY);
    }
    written *= 2;
    assert!(!sim.path("lib/carbon.jsonl.3").exists(), "only log_keep old files");
    let kept = all_lines(&sim);
    assert!(kept < written && kept >= kept_before / 2, "the oldest history dropped: {kept} of {written} kept");
    for file in log_files(&sim) {
        let meta = std::fs::metadata(&file).unwrap();
        assert!(meta.len() <= 4096, "{} is {} bytes", file.display(), meta.len());
        assert_eq!(meta.permissions().mode() & 0o7777, 0o644, "{}", file.display());
    }
}

#[test]
fn a_rotation_killed_between_its_steps_loses_nothing_and_the_next_append_carries_on() {
    for stop in ["carbon-log:shifted", "carbon-log:rotated"] {
        let sim = Sim::new(&[H100]);
        sim.write_vgpu_config("[carbon]\nlog_max_bytes = 4096\nlog_keep = 2\n");
        apply_until_exists(&sim, 1);
        // Append with the stop point armed until an apply is killed there: that one was
        // rotating (the log and .1 full).
        let mut killed = None;
        for _ in 0..200 {
            let before = all_lines(&sim);
            let out = sim.vgpu(APPLY).env("VGPU_TEST_STOP_AT", stop).output().unwrap();
            if out.status.success() {
                continue;
            }
            assert_eq!(out.status.signal(), Some(9), "{stop}: {}", String::from_utf8_lossy(&out.stderr));
            killed = Some(before);
            break;
        }
        let before = killed.unwrap_or_else(|| panic!("{stop}: no apply rotated"));
        // Nothing lost (the line being written never was, and nothing was rotated out).
        assert_eq!(all_lines(&sim), before, "{stop}");
        sim.json(APPLY);
        assert_eq!(all_lines(&sim), before + 1, "{stop}");
    }
}

#[test]
fn bad_rotation_settings_are_refused_naming_the_key() {
    let sim = Sim::new(&[H100]);
    for (config, key) in [("log_max_bytes = 100", "[carbon] log_max_bytes"), ("log_keep = 0", "[carbon] log_keep")] {
        sim.write_vgpu_config(&format!("[carbon]\n{config}\n"));
        let out = sim.vgpu(APPLY).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{config}");
        assert!(String::from_utf8_lossy(&out.stderr).contains(key), "{}", String::from_utf8_lossy(&out.stderr));
    }
}
