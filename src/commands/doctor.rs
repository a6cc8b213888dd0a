//! `vgpu doctor` (being written)
use anyhow::Result;
use crate::cli::JsonArgs;
use crate::context::Context;
pub fn run(_ctx: &Context, _args: &JsonArgs) -> Result<()> { Ok(()) }
