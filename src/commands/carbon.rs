//! `vgpu carbon …`

use anyhow::Result;
use clap::Args;

use crate::context::Context;

#[derive(Debug, Args)]
pub struct CarbonArgs {}

pub fn run(_ctx: &Context, _args: &CarbonArgs) -> Result<()> {
    anyhow::bail!("vgpu carbon is not implemented yet")
}
