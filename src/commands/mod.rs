//! One module per subcommand: each is thin and calls into the library modules.

pub mod carbon;
pub mod completions;
pub mod control;
pub mod devices;
pub mod doctor;
pub mod partition;
pub mod pool;
pub mod ps;
pub mod run;
pub mod update;
pub mod watch;

use anyhow::Result;

use crate::cli::Command;
use crate::context::Context;

/// Run the command; the result is the process exit code (`vgpu run` passes its
/// workload's through).
pub fn dispatch(ctx: &Context, command: &Command) -> Result<u8> {
    let done = |r: Result<()>| r.map(|()| 0);
    match command {
        Command::Devices(args) => done(devices::run(ctx, args)),
        Command::Doctor(args) => done(doctor::run(ctx, args)),
        Command::Run(args) => run::run(ctx, args),
        Command::Ps(args) => done(ps::run(ctx, args)),
        Command::Suspend(args) => done(control::suspend_or_resume(ctx, args, control::Action::Suspend)),
        Command::Resume(args) => done(control::suspend_or_resume(ctx, args, control::Action::Resume)),
        Command::Kill(args) => done(control::kill(ctx, args)),
        Command::Update(args) => done(update::run(ctx, args)),
        Command::Partition(args) => done(partition::run(ctx, args)),
        Command::Carbon(args) => done(carbon::run(ctx, args)),
        Command::Pool(args) => done(pool::run(ctx, args)),
        Command::Watch(args) => done(watch::run(ctx, args)),
        Command::Completions(args) => done(completions::run(args)),
    }
}
