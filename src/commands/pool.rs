//! `vgpu pool …`

use anyhow::Result;
use clap::Args;

use crate::context::Context;

#[derive(Debug, Args)]
pub struct PoolArgs {}

pub fn run(_ctx: &Context, _args: &PoolArgs) -> Result<()> {
    anyhow::bail!("vgpu pool is not implemented yet")
}
