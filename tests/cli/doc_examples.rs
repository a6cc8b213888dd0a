//! Examples that cannot go stale: every ```console block of README.md and of the user
//! guide (docs/*.md) is run against the simulated driver and its output compared, so a
//! changed message or a removed flag fails here.
//!
//! A block is a terminal session, as trycmd reads one: `$ COMMAND` (continued on lines
//! starting with `> `, a shell's PS2), an optional `? N` for an exit status other than 0,
//! then the output expected, stdout and stderr together as a terminal shows them. In the
//! expected output `[..]` matches any text within a line and a line `...` any number of
//! lines (trycmd's wildcards, for IDs, ages and timings). Each file runs in a fresh
//! simulation of its own (`Sim`: its processes killed when it ends), in a temporary
//! directory that has `examples/` of the repository, on the tour's two simulated GPUs (an
//! A100 and an L4) unless it exports its own `FAKEGPU_CONFIG`, with `VGPU_SIMULATE=1`.
//!
//! Each command runs with `sh -c`, as root, without its leading `sudo` (CI has no sudo,
//! and sudo would reset the simulation's environment). `export …` changes the environment
//! of the commands after it. A command ending in `&` runs in the background, its output
//! not shown, and the next command waits for its event: `vgpu run --name NAME …` until
//! `vgpu ps` shows NAME running, `vgpu watch` until it logs that it is ready.
//!
//! `cargo test --test integration cli::doc_examples::` (a failure names the file and line); with
//! `VGPU_DOC_SHOW=1` and `--nocapture` it prints what each command printed, to write an
//! example from.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::Sim;

/// The simulated host of the README's tour.
const TOUR_GPUS: &[(&str, &str)] = &[("NVIDIA A100-SXM4-40GB", "40GiB"), ("NVIDIA L4", "24GiB")];

fn repo() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).canonicalize().expect("repository root")
}

/// One `$` command of a block, where it is, and what it should print.
#[derive(Debug)]
struct Step {
    line: usize,
    command: String,
    status: i32,
    expected: Vec<String>,
}

/// The console blocks of a Markdown text, each a list of steps.
fn blocks(text: &str) -> Vec<Vec<Step>> {
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate().peekable();
    while let Some((_, fence)) = lines.next() {
        if fence.trim() != "```console" {
            continue;
        }
        // A block in a list item is indented: its lines are, as much as its fence.
        let indent = fence.len() - fence.trim_start().len();
        let mut steps: Vec<Step> = Vec::new();
        for (n, line) in lines.by_ref() {
            let line = line.get(indent..).filter(|_| line[..indent.min(line.len())].trim().is_empty()).unwrap_or(line.trim_start());
            if line.starts_with("```") {
                break;
            }
            if let Some(command) = line.strip_prefix("$ ") {
                steps.push(Step { line: n + 1, command: command.to_string(), status: 0, expected: Vec::new() });
            } else if let Some(step) = steps.last_mut() {
                if let Some(more) = line.strip_prefix("> ").or(if line == ">" { Some("") } else { None }).filter(|_| step.expected.is_empty()) {
                    step.command.push('\n');
                    step.command.push_str(more);
                } else if let Some(code) = line.strip_prefix("? ").filter(|_| step.expected.is_empty()) {
                    step.status = code.trim().parse().unwrap_or_else(|_| panic!("line {}: `? {code}` is no exit status", n + 1));
                } else {
                    step.expected.push(line.to_string());
                }
            } else {
                panic!("line {}: a console block starts with `$ COMMAND`, not {line:?}", n + 1);
            }
        }
        out.push(steps);
    }
    out
}

/// Whether `actual` matches `expected` with `[..]` inside a line.
fn line_matches(expected: &str, actual: &str) -> bool {
    let parts: Vec<&str> = expected.split("[..]").collect();
    if parts.len() == 1 {
        return expected == actual;
    }
    let Some(mut rest) = actual.strip_prefix(parts[0]) else {
        return false;
    };
    let last = parts[parts.len() - 1];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// Whether the lines match, `...` standing for any number of lines.
fn lines_match(expected: &[String], actual: &[String]) -> bool {
    match expected.split_first() {
        None => actual.is_empty(),
        Some((first, rest)) if first == "..." => (0..=actual.len()).any(|skip| lines_match(rest, &actual[skip..])),
        Some((first, rest)) => actual.split_first().is_some_and(|(a, more)| line_matches(first, a) && lines_match(rest, more)),
    }
}

/// The simulation one file's examples run in, and its environment as exported so far.
struct Session {
    sim: Sim,
    env: BTreeMap<String, String>,
}

impl Session {
    fn new() -> Session {
        let sim = Sim::new(TOUR_GPUS);
        std::os::unix::fs::symlink(repo().join("examples"), sim.path("examples")).expect("link examples/");
        let mut env: BTreeMap<String, String> = std::env::vars().filter(|(k, _)| !k.starts_with("VGPU_") && !k.starts_with("FAKEGPU_")).collect();
        for (k, v) in sim.env() {
            env.insert(k, v.display().to_string());
        }
        let bin = PathBuf::from(env!("CARGO_BIN_EXE_vgpu"));
        let path = format!("{}:{}", bin.parent().expect("bin dir").display(), env.get("PATH").cloned().unwrap_or_default());
        env.insert("PATH".into(), path);
        env.insert("VGPU_SIMULATE".into(), "1".into());
        env.insert("VGPU_LOG".into(), "vgpu=warn".into());
        env.insert("COLUMNS".into(), "200".into());
        Session { sim, env }
    }

    fn command(&self, script: &str) -> Command {
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(script).env_clear().envs(&self.env).current_dir(self.sim.dir.path()).stdin(Stdio::null());
        cmd
    }

    /// Run one step; the error says what differed.
    fn run(&mut self, step: &Step) -> Result<(), String> {
        let command = step.command.strip_prefix("sudo ").unwrap_or(&step.command);
        if command.starts_with("export ") {
            let out = self.command(&format!("{command}\nenv -0")).output().map_err(|e| e.to_string())?;
            if !out.status.success() {
                return Err(format!("failed: {}", String::from_utf8_lossy(&out.stderr)));
            }
            self.env = out.stdout.split(|b| *b == 0).filter_map(|kv| String::from_utf8_lossy(kv).split_once('=').map(|(k, v)| (k.to_string(), v.to_string()))).collect();
            return Ok(());
        }
        if let Some(background) = command.strip_suffix('&') {
            if !step.expected.is_empty() {
                return Err("a background command shows no output".into());
            }
            return self.background(background.trim_end());
        }
        let out = self.command(&format!("exec 2>&1\n{command}")).output().map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let actual: Vec<String> = text.lines().map(|l| l.trim_end().to_string()).collect();
        let expected: Vec<String> = step.expected.iter().map(|l| l.trim_end().to_string()).collect();
        let status = out.status.code().unwrap_or(-1);
        if std::env::var_os("VGPU_DOC_SHOW").is_some() {
            // Writing an example: what the command prints, to paste (and wildcard).
            eprintln!("=== line {}: $ {command}\n? {status}\n{text}", step.line);
        }
        if status != step.status || !lines_match(&expected, &actual) {
            return Err(format!("exit status {status} (expected {}); it printed:\n{text}", step.status));
        }
        Ok(())
    }

    /// Start a background command and wait for its event.
    fn background(&mut self, command: &str) -> Result<(), String> {
        let words: Vec<&str> = command.split_whitespace().collect();
        if words.contains(&"watch") {
            let mut cmd = self.command(&format!("exec {command}"));
            cmd.env("VGPU_LOG", "vgpu=info").stdout(Stdio::null()).stderr(Stdio::piped());
            let mut child = cmd.spawn().map_err(|e| e.to_string())?;
            let stderr = child.stderr.take().expect("piped");
            // Read it on a thread, so that a watch that never says it is ready fails the
            // step instead of hanging it; the thread keeps draining its log.
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if line.contains("ready") {
                        let _ = tx.send(());
                    }
                }
            });
            return rx.recv_timeout(Duration::from_secs(30)).map_err(|_| "vgpu watch never said it was ready".to_string());
        }
        let Some(name) = words.windows(2).find(|w| w[0] == "--name").map(|w| w[1].to_string()) else {
            return Err("a background command needs an event to wait on: `vgpu run --name NAME …` or `vgpu watch`".into());
        };
        let mut cmd = self.command(&format!("exec {command}"));
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        cmd.spawn().map_err(|e| e.to_string())?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let out = self.command("vgpu ps --json").output().map_err(|e| e.to_string())?;
            let running = serde_json::from_slice::<serde_json::Value>(&out.stdout).ok().is_some_and(|ps| {
                ps["workloads"].as_array().is_some_and(|rows| {
                    rows.iter().any(|w| w["name"] == name.as_str() && w["state"] == "running" && w["pids"].as_array().is_some_and(|p| !p.is_empty()))
                })
            });
            if running {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!("workload {name} never ran"))
    }
}

/// README.md and every page of the guide, repository-relative.
fn documents() -> Vec<String> {
    let mut out = vec!["README.md".to_string()];
    let mut pages: Vec<String> = std::fs::read_dir(repo().join("docs"))
        .expect("docs/")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    pages.sort();
    out.extend(pages);
    out
}

/// Run every console block of `file`; the failures, each naming its line.
fn run_file(file: &str) -> Vec<String> {
    let text = std::fs::read_to_string(repo().join(file)).expect("read");
    let blocks = blocks(&text);
    let mut failures = Vec::new();
    if blocks.is_empty() {
        return failures;
    }
    let mut session = Session::new();
    for step in blocks.iter().flatten() {
        if let Err(why) = session.run(step) {
            failures.push(format!("{file}:{}: $ {}\n  {}", step.line, step.command, why.replace('\n', "\n  ")));
            // The steps after it depend on it (unless showing them all).
            if std::env::var_os("VGPU_DOC_SHOW").is_none() {
                break;
            }
        }
    }
    failures
}

#[test]
fn every_console_example_of_the_readme_and_the_guide_runs_as_shown() {
    let files = documents();
    let total: usize = files.iter().map(|f| blocks(&std::fs::read_to_string(repo().join(f)).unwrap()).iter().map(Vec::len).sum::<usize>()).sum();
    assert!(total >= 15, "only {total} console commands in README.md and docs/: the tour alone has more");
    let handles: Vec<_> = files.into_iter().map(|f| std::thread::spawn(move || run_file(&f))).collect();
    let failures: Vec<String> = handles.into_iter().flat_map(|h| h.join().expect("runner")).collect();
    assert!(failures.is_empty(), "examples that no longer run as documented:\n{}", failures.join("\n"));
}

/// The README shows a command only in a console block the test above runs: a `$ vgpu`
/// anywhere else would be an example nobody checks.
#[test]
fn every_shown_vgpu_command_is_in_a_console_block() {
    for file in documents() {
        let text = std::fs::read_to_string(repo().join(&file)).unwrap();
        let mut in_console = false;
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("```") {
                in_console = line.trim() == "```console";
                continue;
            }
            let shown = line.trim_start().strip_prefix("$ ").is_some_and(|c| c.starts_with("vgpu ") || c.starts_with("sudo vgpu "));
            assert!(!shown || in_console, "{file}:{}: `{}` is shown outside a ```console block, so no test runs it", n + 1, line.trim());
        }
    }
}

/// The command lines a page shows in a code block without running them (a reference block
/// of several commands with comments, a crontab line): `(line, words)`. Synopses (`[…]`,
/// `A|B`) and log lines (`vgpu watch: …`, `vgpu watch on n1: …`) are not commands; `\` continues a line; `# …`
/// after a space is a comment; a leading `sudo` and `VAR=value` words are dropped.
fn shown_commands(text: &str) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let mut fence: Option<bool> = None; // Some(is_console) inside a fence
    let mut pending: Option<(usize, String)> = None;
    for (n, raw) in text.lines().enumerate() {
        let trimmed = raw.trim_start();
        if trimmed.starts_with("```") {
            fence = match fence {
                Some(_) => None,
                None => Some(trimmed.trim_end() == "```console"),
            };
            continue;
        }
        let in_code = match fence {
            Some(console) => !console,
            None => raw.starts_with("    "),
        };
        if !in_code {
            pending = None;
            continue;
        }
        let (start, mut line) = match pending.take() {
            Some((start, before)) => (start, format!("{before} {trimmed}")),
            None => (n + 1, trimmed.to_string()),
        };
        if let Some(at) = line.find(" #") {
            line.truncate(at);
        }
        if let Some(continued) = line.trim_end().strip_suffix('\\') {
            pending = Some((start, continued.to_string()));
            continue;
        }
        let mut words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        while words.first().is_some_and(|w| w == "sudo" || (w.contains('=') && w.chars().next().is_some_and(|c| c.is_ascii_uppercase()))) {
            words.remove(0);
        }
        let is_vgpu = words.first().is_some_and(|w| w == "vgpu" || w.ends_with("/vgpu"));
        let synopsis = line.contains('[') || line.contains('|') || line.contains('…');
        // `vgpu watch: …`, `vgpu watch on n1: killed …`: a word ending in `:` early on.
        let log_line = words.iter().skip(1).take(3).any(|w| w.ends_with(':'));
        if is_vgpu && !synopsis && !log_line && words.len() > 1 {
            out.push((start, words));
        }
    }
    out
}

/// Every vgpu command a page shows without running it still parses: a removed or renamed
/// option, or a value no longer accepted, fails here.
#[test]
fn every_vgpu_command_shown_in_a_code_block_parses() {
    let mut checked = 0;
    let mut problems = Vec::new();
    for file in documents() {
        let text = std::fs::read_to_string(repo().join(&file)).unwrap();
        for (line, words) in shown_commands(&text) {
            checked += 1;
            let argv = std::iter::once("vgpu".to_string()).chain(words.iter().skip(1).cloned());
            match vgpu::cli::command().try_get_matches_from(argv) {
                Ok(_) => {}
                Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelp => {}
                Err(e) => problems.push(format!("{file}:{line}: `{}`: {}", words.join(" "), e.render().to_string().lines().next().unwrap_or(""))),
            }
        }
    }
    assert!(checked >= 20, "only {checked} commands found in code blocks");
    assert!(problems.is_empty(), "commands shown in the documentation that vgpu no longer takes:\n{}", problems.join("\n"));
}

#[test]
fn the_wildcards_match_as_trycmd_s() {
    assert!(line_matches("id [..] running", "id 1a2b3c4d running"));
    assert!(!line_matches("id [..] running", "id 1a2b3c4d stopped"));
    assert!(line_matches("[..]", ""));
    assert!(!line_matches("exact", "exact "));
    let lines = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert!(lines_match(&lines(&["a", "...", "d"]), &lines(&["a", "b", "c", "d"])));
    assert!(lines_match(&lines(&["a", "...", "b"]), &lines(&["a", "b"])));
    assert!(!lines_match(&lines(&["a", "...", "d"]), &lines(&["a", "b"])));
    assert!(!lines_match(&lines(&["a"]), &lines(&["a", "b"])));
}
