//! The `vgpu` command line: parse (`cli`), call the library crates (`commands`, one module
//! per subcommand), print (`output`). Everything else is in the crates under `crates/`
//! (see ARCHITECTURE.md).

pub mod args;
pub mod cli;
pub mod commands;
pub mod output;
pub mod start;
