//! The man pages, one per command, rendered from the clap definition: `vgpu(1)`,
//! `vgpu-run(1)`, `vgpu-partition(1)`, `vgpu-partition-create(1)`, …
//!
//! Nested commands get a page each, named by the whole command path, as podman's do
//! (`podman-volume(1)` lists `podman-volume-create(1)`, …): each has its own synopsis and
//! options, clap knows them as commands of their own, and `man vgpu-partition-create` finds
//! what the user typed. (git documents a command's subcommands inside one page, but git's
//! subcommands are modes of one option set; vgpu's are separate commands.)
//!
//! Each page: NAME, SYNOPSIS, DESCRIPTION and OPTIONS from clap_mangen (the options grouped
//! under their help headings as subsections of one OPTIONS section), SUBCOMMANDS where there
//! are some, then vgpu's own FILES, ENVIRONMENT (where they apply), EXIT STATUS (from
//! [`vgpu_store::error::EXIT_STATUS_DOC`]) and SEE ALSO, which names only pages rendered here.

use std::io;

use clap::{Command, CommandFactory};
use roff::{bold, italic, roman, Inline, Roff};

use vgpu_store::error::ExitScope;

use vgpu_store::error::EXIT_STATUS_DOC;

/// One generated page: its file name under `man/` (`vgpu-run.1`) and its roff text.
pub struct ManPage {
    pub file: String,
    pub roff: Vec<u8>,
}

/// Every page, `vgpu.1` first, then each command's in the order `vgpu --help` lists them
/// (a command's subcommands right after it).
pub fn pages() -> io::Result<Vec<ManPage>> {
    // Unbuilt: each command has only its own arguments, not the propagated global ones
    // (those are documented once, in vgpu(1)).
    let root = super::Cli::command();
    let mut commands = Vec::new();
    walk(&root, Vec::new(), &mut commands);
    let names: Vec<String> = commands.iter().map(|(path, _)| page_name(path)).collect();
    commands
        .iter()
        .map(|(path, cmd)| Ok(ManPage { file: format!("{}.1", page_name(path)), roff: render(&root, cmd, path, &names)? }))
        .collect()
}

fn walk(cmd: &Command, path: Vec<String>, out: &mut Vec<(Vec<String>, Command)>) {
    out.push((path.clone(), cmd.clone()));
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let mut sub_path = path.clone();
        sub_path.push(sub.get_name().to_string());
        walk(sub, sub_path, out);
    }
}

/// `vgpu`, `vgpu-run`, `vgpu-partition-create`.
fn page_name(path: &[String]) -> String {
    std::iter::once("vgpu").chain(path.iter().map(String::as_str)).collect::<Vec<_>>().join("-")
}

fn render(root: &Command, cmd: &Command, path: &[String], pages: &[String]) -> io::Result<Vec<u8>> {
    let name = page_name(path);
    let bin = std::iter::once("vgpu").chain(path.iter().map(String::as_str)).collect::<Vec<_>>().join(" ");
    // `vgpu help` is clap's, and has no page.
    let cmd = cmd.clone().display_name(name.clone()).bin_name(bin).disable_help_subcommand(true);
    let headings: Vec<String> = cmd.get_arguments().filter_map(|a| a.get_help_heading()).map(str::to_string).collect();
    let man = clap_mangen::Man::new(cmd.clone()).source(format!("vgpu {}", env!("CARGO_PKG_VERSION"))).manual("vgpu manual");

    let mut out = Vec::new();
    man.render_title(&mut out)?;
    section(&mut out, |w| man.render_name_section(w))?;
    section(&mut out, |w| man.render_synopsis_section(w))?;
    section(&mut out, |w| man.render_description_section(w))?;
    let mut options = Vec::new();
    section(&mut options, |w| man.render_options_section(w))?;
    out.extend(one_options_section(&String::from_utf8_lossy(&options), &headings).into_bytes());
    let top = path.first().map(String::as_str);
    let mut own = Roff::new();
    if top.is_some() {
        global_options(&mut own, root);
    }
    out.extend(body(&own));
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        section(&mut out, |w| man.render_subcommands_section(w))?;
    }
    let mut own = Roff::new();
    if top.is_none() {
        examples(&mut own);
    }
    files(&mut own, top);
    environment(&mut own, top);
    json_output(&mut own, path);
    exit_status(&mut own, top);
    see_also(&mut own, path, pages);
    out.extend(body(&own));
    Ok(out)
}

/// Append a clap_mangen section without the preamble every render repeats.
fn section(out: &mut Vec<u8>, render: impl FnOnce(&mut dyn io::Write) -> io::Result<()>) -> io::Result<()> {
    let mut buf = Vec::new();
    render(&mut buf)?;
    out.extend(strip_preamble(&String::from_utf8_lossy(&buf)).into_bytes());
    Ok(())
}

/// A section rendered by roff, without the preamble (the title's is the page's).
fn body(roff: &Roff) -> Vec<u8> {
    let mut buf = Vec::new();
    // Writing into a Vec cannot fail.
    let _ = roff.to_writer(&mut buf);
    strip_preamble(&String::from_utf8_lossy(&buf)).into_bytes()
}

/// The lines roff puts first in every rendering (the apostrophe string definition).
fn strip_preamble(text: &str) -> String {
    text.lines().filter(|l| !(l.starts_with(".ie \\n(.g .ds Aq") || l.starts_with(".el .ds Aq"))).map(|l| format!("{l}\n")).collect()
}

/// clap_mangen gives each help heading a section of its own (`.SH GPU SLICE`): make them
/// subsections of one OPTIONS section.
fn one_options_section(text: &str, headings: &[String]) -> String {
    if text.trim().is_empty() {
        return String::new();
    }
    let mut out = String::new();
    if !text.starts_with(".SH OPTIONS") {
        out.push_str(".SH OPTIONS\n");
    }
    for line in text.lines() {
        let title = line.strip_prefix(".SH ").map(|t| t.trim_matches('"'));
        match title.and_then(|t| headings.iter().find(|h| h.to_uppercase() == t)) {
            Some(heading) => out.push_str(&format!(".SS \"{heading}\"\n")),
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// A subcommand's page: the global options, by name, with a pointer to vgpu(1).
fn global_options(roff: &mut Roff, root: &Command) {
    let mut line: Vec<Inline> = vec![roman("Every command also takes the global options ")];
    let globals: Vec<String> = root
        .get_arguments()
        .filter(|a| a.is_global_set())
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")).or_else(|| a.get_short().map(|s| format!("-{s}"))))
        .collect();
    for (i, g) in globals.iter().enumerate() {
        if i > 0 {
            line.push(roman(", "));
        }
        line.push(bold(g));
    }
    line.extend([roman(": see "), bold("vgpu"), roman("(1).")]);
    roff.control("SS", ["Global options"]).text(line);
}

/// vgpu(1)'s EXAMPLES.
const EXAMPLES: &[(&str, &str)] = &[
    ("sudo vgpu run --mem 4G --compute 30 -- python train.py", "Run a job in a slice of one GPU: 4 GiB of its memory and 30% of its time."),
    ("sudo vgpu run --gpus all -- python train.py", "Run a job on every GPU of the host."),
    ("sudo vgpu run --gpu 0,1 --mem 50% --memory 16G -- ./serve", "Half of GPUs 0 and 1's memory each, and 16 GiB of host RAM."),
    ("sudo vgpu update train --compute 60 --compute-policy fair", "Raise a running workload's share to a floor of 60%."),
    ("vgpu --simulate devices", "Try vgpu on a machine without a GPU."),
    ("source <(vgpu completions bash)", "Complete commands, workload IDs and names, partitions in bash."),
];

fn examples(roff: &mut Roff) {
    roff.control("SH", ["EXAMPLES"]);
    for (command, what) in EXAMPLES {
        roff.control("TP", []).text([bold(*command)]).text([roman(*what)]);
    }
}

/// A file vgpu reads or writes: its path, what it is, and the top-level commands whose pages
/// list it (vgpu(1) lists them all).
const FILES: &[(&str, &str, &[&str])] = &[
    (
        "/etc/vgpu/config.toml",
        "The configuration (--config, VGPU_CONFIG): state directories, [policy], [compute], [pool], [carbon], [watch], [suspend], [history]. A missing default file means the defaults.",
        &["run", "update", "partition", "pool", "carbon", "watch", "doctor"],
    ),
    (
        "/etc/vgpu/workloads/NAME.toml",
        "A workload that the template unit vgpu@NAME.service runs (systemctl start vgpu@NAME).",
        &["run"],
    ),
    ("/run/vgpu/", "Runtime state (--state-dir, VGPU_STATE_DIR); root's, 0755, gone at reboot as the workloads are.", &["doctor"]),
    ("/run/vgpu/lock", "The store lock (flock); every command that changes the state takes it. Listings and completions never wait for it.", &["doctor"]),
    (
        "/run/vgpu/workloads/ID.json",
        "One record per workload: its command, GPUs, quotas, state, supervisor.",
        &["run", "ps", "kill", "suspend", "resume", "update"],
    ),
    (
        "/run/vgpu/vgpus/VGPU/",
        "A vGPU: its limits (read-only to the workload) and usage counters, mapped by the shim in every process of the workload.",
        &["run", "update", "partition"],
    ),
    ("/run/vgpu/pool.json", "The compute pool: its blocks, who holds them, who waits.", &["run", "update", "pool"]),
    ("/run/vgpu/intents/", "Multi-step changes under way; the next command finishes or undoes what a dead one left.", &["doctor"]),
    ("/run/vgpu/carbon-applied.json", "The clocks vgpu locked, to undo them.", &["carbon"]),
    ("/var/lib/vgpu/", "Persistent state (--lib-dir, VGPU_LIB_DIR).", &["doctor"]),
    ("/var/lib/vgpu/partitions.json", "The partitions.", &["partition", "run"]),
    ("/var/lib/vgpu/carbon.jsonl", "The log of applied clock plans, one JSON object a line.", &["carbon"]),
    (
        "/var/lib/vgpu/history.db",
        "The history (SQLite, root's, mode 0600): each GPU's energy and each workload's GPU time per vgpu watch interval, intensity readings, clock decisions; kept [history] keep (90 days). Schema and example queries: docs/history.md.",
        &["watch", "carbon"],
    ),
    ("/var/lib/vgpu/carbon-intensity.json", "The last carbon intensity read, used when the source does not answer.", &["carbon"]),
    ("/var/lib/vgpu/carbon-forecast.json", "The last intensity forecast read, used when the source does not answer.", &["carbon"]),
    (
        "/var/lib/vgpu/history-snapshot.db",
        "The public copy of the history (SQLite, 0644), replaced by vgpu watch at most once a minute: what carbon report, carbon plan and ps -a read when not run as root (root reads history.db, as does the line vgpu run prints at a workload's end).",
        &["carbon", "ps", "run", "watch"],
    ),
    (
        "libvgpu.so",
        "The quota shim vgpu run preloads into every workload; looked for next to the vgpu binary, then in PREFIX/lib/vgpu.",
        &["run", "doctor"],
    ),
];

fn files(roff: &mut Roff, top: Option<&str>) {
    let listed: Vec<_> = FILES.iter().filter(|(_, _, on)| top.is_none_or(|t| on.contains(&t))).collect();
    if listed.is_empty() {
        return;
    }
    roff.control("SH", ["FILES"]);
    for (path, what, _) in listed {
        roff.control("TP", []).text([italic(*path)]).text([roman(*what)]);
    }
}

/// vgpu's own environment variables (vgpu(1)).
const VGPU_ENV: &[(&str, &str)] = &[
    ("VGPU_CONFIG", "The config file, as --config."),
    ("VGPU_STATE_DIR", "The runtime state directory, as --state-dir."),
    ("VGPU_LIB_DIR", "The persistent state directory, as --lib-dir."),
    ("VGPU_SIMULATE", "Set (and not 0, false, no or off): use the bundled simulated driver, as --simulate."),
    ("VGPU_LOG", "A log filter (tracing's EnvFilter syntax, e.g. vgpu=debug) that replaces the one -v and -q set."),
    ("VGPU_CGROUP_MANAGER", "Who places a workload's cgroup: auto, cgroupfs, delegated or systemd, as the config's [cgroup] manager."),
    ("VGPU_WORKLOADS_DIR", "Where vgpu run --workload NAME finds NAME.toml [default: /etc/vgpu/workloads]. Refused through sudo."),
    ("VGPU_SYSTEMD_BUS", "For tests: the unix: D-Bus address (unix:path=...) the systemd cgroup manager asks instead of the system bus. Refused through sudo."),
    ("VGPU_CGROUP_SELF", "For tests: the cgroup vgpu takes as its own instead of /proc/self/cgroup's. Refused through sudo."),
    ("VGPU_NOW", "For tests, and only with --simulate: the time (RFC 3339) the carbon commands plan for and log their decisions at, instead of now."),
    ("VGPU_LOCK_TIMEOUT_MS", "How long a command waits for the state lock, in milliseconds [default: 5000]."),
    ("COMPLETE", "Set by the completion scripts (vgpu completions SHELL) to ask vgpu for completions."),
];

/// What `vgpu run` sets in the workload's environment (vgpu-run(1)).
const WORKLOAD_ENV: &[(&str, &str)] = &[
    ("LD_PRELOAD", "The quota shim (libvgpu.so), first; --env LD_PRELOAD=... only adds after it."),
    ("CUDA_VISIBLE_DEVICES", "The UUIDs of the workload's GPUs, comma-separated."),
    ("VGPU_DIR", "The vGPU's directory (limits and usage counters); cannot be replaced with --env."),
    ("VGPU_WORKLOAD_ID", "The workload's ID."),
    ("VGPU_WORKLOAD_NAME", "The workload's name (--name)."),
    ("VGPU_NUM_GPUS", "The number of the workload's GPUs."),
    ("LD_LIBRARY_PATH", "With --simulate: the simulated driver's directory, first."),
    ("HOME, USER, LOGNAME", "With --user (or through sudo): those of the user the workload runs as."),
];

fn environment(roff: &mut Roff, top: Option<&str>) {
    let (vars, intro): (Vec<&(&str, &str)>, Option<&str>) = match top {
        None => (VGPU_ENV.iter().collect(), None),
        Some("run") => (
            WORKLOAD_ENV.iter().collect(),
            Some("vgpu reads the variables vgpu(1) lists. The workload starts with vgpu's environment (less SUDO_*), the variables --env gives, and these:"),
        ),
        Some("completions") => (VGPU_ENV.iter().filter(|(k, _)| *k == "COMPLETE").collect(), None),
        Some(_) => return,
    };
    roff.control("SH", ["ENVIRONMENT"]);
    if let Some(intro) = intro {
        roff.text([roman(intro)]);
    }
    for (name, what) in vars {
        roff.control("TP", []).text([bold(*name)]).text([roman(*what)]);
    }
}

/// JSON OUTPUT: on vgpu(1) the schema's rules (stability, vocabulary), on a page whose
/// command has `--json` its fields, both from `docs/json-schema.md` (one text, also the
/// user guide's page), shown as written.
fn json_output(roff: &mut Roff, path: &[String]) {
    let doc = vgpu_json::JSON_SCHEMA_DOC;
    let text = if path.is_empty() {
        let intro = doc.split("\n## ").next().unwrap_or_default();
        Some(intro.lines().skip_while(|l| l.starts_with('#') || l.trim().is_empty()).collect::<Vec<_>>().join("\n"))
    } else {
        vgpu_json::doc_of(&path.join(" "))
    };
    let Some(text) = text else { return };
    roff.control("SH", ["JSON OUTPUT"]);
    roff.control("nf", []);
    for line in text.lines() {
        let plain = line.replace("**", "").replace('`', "");
        roff.text([roman(plain.trim_start_matches("## ").to_string())]);
    }
    roff.control("fi", []);
}

fn exit_status(roff: &mut Roff, top: Option<&str>) {
    roff.control("SH", ["EXIT STATUS"]);
    for (status, meaning, scope) in EXIT_STATUS_DOC {
        let applies = match (scope, top) {
            (_, None) | (ExitScope::All, _) => true,
            (ExitScope::Run, Some(t)) => t == "run",
            (ExitScope::NotRunOrWatch, Some(t)) => t != "run" && t != "watch",
        };
        if applies {
            let meaning = match (scope, top) {
                (ExitScope::Run, None) => format!("vgpu run: {}{}", meaning[..1].to_lowercase(), &meaning[1..]),
                _ => meaning.to_string(),
            };
            roff.control("TP", []).text([bold(*status)]).text([roman(meaning)]);
        }
    }
}

/// Pages a top-level command's page points to besides vgpu(1), its parent and children.
const RELATED: &[(&str, &[&str])] = &[
    ("devices", &["ps", "doctor"]),
    ("doctor", &["watch", "devices"]),
    ("run", &["ps", "kill", "update", "partition", "pool"]),
    ("ps", &["run", "kill", "update"]),
    ("suspend", &["resume", "kill", "pool"]),
    ("resume", &["suspend"]),
    ("kill", &["ps", "suspend", "run"]),
    ("update", &["run", "partition-update", "pool"]),
    ("partition", &["run", "update"]),
    ("carbon", &["run", "watch"]),
    ("pool", &["run", "update", "suspend"]),
    ("watch", &["doctor", "carbon"]),
    ("completions", &[]),
];

/// The systemd units vgpu ships, and the commands whose pages name them.
const UNITS: &[(&str, &[&str])] = &[
    ("vgpu-watch.service", &["watch"]),
    ("vgpu-carbon.service", &["carbon"]),
    ("vgpu-carbon.timer", &["carbon"]),
    ("vgpu@.service", &["run"]),
];

fn see_also(roff: &mut Roff, path: &[String], pages: &[String]) {
    let name = page_name(path);
    let mut refs: Vec<String> = Vec::new();
    let mut add = |page: String| {
        if page != name && pages.contains(&page) && !refs.contains(&page) {
            refs.push(page);
        }
    };
    match path.first() {
        None => pages.iter().for_each(|p| add(p.clone())),
        Some(top) => {
            add("vgpu".into());
            for i in 1..path.len() {
                add(page_name(&path[..i]));
            }
            // Children and siblings.
            pages.iter().filter(|p| p.starts_with(&format!("{name}-")) || is_sibling(p, &name)).for_each(|p| add(p.clone()));
            for (_, related) in RELATED.iter().filter(|(t, _)| t == top) {
                related.iter().for_each(|r| add(format!("vgpu-{r}")));
            }
        }
    }
    let mut line: Vec<Inline> = Vec::new();
    for page in &refs {
        if !line.is_empty() {
            line.push(roman(", "));
        }
        line.extend([bold(page), roman("(1)")]);
    }
    let external: &[&str] = match path.first().map(String::as_str) {
        None => &["nvidia-smi(1)", "systemctl(1)", "systemd.unit(5)", "cgroups(7)"],
        Some("run") => &["nvidia-smi(1)", "cgroups(7)"],
        Some("watch") | Some("carbon") => &["systemctl(1)", "systemd.timer(5)"],
        Some(_) => &[],
    };
    for page in external {
        line.push(roman(format!(", {page}")));
    }
    line.push(roman("."));
    roff.control("SH", ["SEE ALSO"]).text(line);
    let units: Vec<&str> =
        UNITS.iter().filter(|(_, on)| path.first().is_none_or(|t| on.contains(&t.as_str()))).map(|(unit, _)| *unit).collect();
    if !units.is_empty() {
        let what = if units.len() == 1 { "unit" } else { "units" };
        roff.control("PP", []).text([roman(format!("The systemd {what} {}, installed with vgpu.", units.join(", ")))]);
    }
}

/// Whether page `p` is a sibling of page `name` (same parent, both nested).
fn is_sibling(p: &str, name: &str) -> bool {
    match (p.rsplit_once('-'), name.rsplit_once('-')) {
        (Some((a, _)), Some((b, _))) => a == b && a != "vgpu" && p != name,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every variable root's vgpu honours from its environment is in vgpu(1)'s ENVIRONMENT,
    /// and those `vgpu run` refuses through sudo say so.
    #[test]
    fn the_environment_section_lists_the_variables_vgpu_reads() {
        let listed = |var: &str| VGPU_ENV.iter().find(|(k, _)| *k == var).map(|(_, what)| *what);
        for var in [vgpu_cgroups::home::ENV_MANAGER, vgpu_store::state::lock::TIMEOUT_ENV].into_iter().chain(crate::commands::run::ROOT_ONLY_ENV) {
            assert!(listed(var).is_some(), "{var} is not in vgpu(1)'s ENVIRONMENT");
        }
        for var in crate::commands::run::ROOT_ONLY_ENV {
            assert!(listed(var).is_some_and(|what| what.contains("Refused through sudo")), "{var}");
        }
    }
}
