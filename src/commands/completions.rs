//! `vgpu completions SHELL`

use anyhow::Result;

use crate::cli::CompletionsArgs;

pub fn run(args: &CompletionsArgs) -> Result<()> {
    let mut cmd = crate::cli::command();
    clap_complete::generate(args.shell, &mut cmd, "vgpu", &mut std::io::stdout());
    Ok(())
}
