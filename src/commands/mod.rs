//! One module per subcommand: each is thin and calls into the library modules.

pub mod carbon;
pub mod completions;
pub mod devices;
pub mod doctor;
pub mod pool;

use anyhow::Result;

use crate::cli::Command;
use crate::context::Context;

pub fn dispatch(ctx: &Context, command: &Command) -> Result<()> {
    match command {
        Command::Devices(args) => devices::run(ctx, args),
        Command::Doctor(args) => doctor::run(ctx, args),
        Command::Carbon(args) => carbon::run(ctx, args),
        Command::Pool(args) => pool::run(ctx, args),
        Command::Completions(args) => completions::run(args),
    }
}
