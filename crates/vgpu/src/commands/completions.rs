//! `vgpu completions SHELL`: the shell's registration script for vgpu's dynamic completions.
//!
//! The script calls back into `vgpu` (found on `PATH`) with `COMPLETE=SHELL` set at each
//! completion; `main` answers those calls through `clap_complete::CompleteEnv` before
//! anything else runs, so workload ids and names, partitions and enumerated values complete
//! as they are now. `source <(COMPLETE=bash vgpu)` prints the same script.

use anyhow::{Context as _, Result};

use crate::args::CompletionsArgs;

/// The environment variable the registration scripts set to ask `vgpu` for completions.
pub const COMPLETE_VAR: &str = "COMPLETE";

pub fn run(args: &CompletionsArgs) -> Result<()> {
    let name = args.shell.to_string();
    let shells = clap_complete::env::Shells::builtins();
    let shell = shells.completer(&name).with_context(|| format!("no dynamic completions for {name}"))?;
    let mut out = Vec::new();
    shell.write_registration(COMPLETE_VAR, "vgpu", "vgpu", "vgpu", &mut out)?;
    std::io::Write::write_all(&mut std::io::stdout().lock(), &out).context("writing the script")?;
    Ok(())
}
