//! The command line's contract and what ships with vgpu: command-line conventions, the man
//! pages and completions, the JSON schema, the scripting contract (quiet/verbose, exit
//! statuses), the shipped config, install.sh and the Debian package's assets, the
//! maintainer checklists of ARCHITECTURE.md, short fuzz runs of every parser, and real
//! third-party clients from PyPI on the simulated driver.
//!
//! An area of the integration harness (tests/integration.rs): each file of tests/cli/ is
//! a module here. This area: `cargo test --test integration cli::`; one file's tests:
//! `cargo test --test integration cli::json_schema::`.


#[path = "cli/architecture.rs"]
mod architecture;
#[path = "cli/cli_conventions.rs"]
mod cli_conventions;
#[path = "cli/cli_docs.rs"]
mod cli_docs;
#[path = "cli/json_schema.rs"]
mod json_schema;
#[path = "cli/scripting.rs"]
mod scripting;
#[path = "cli/default_config.rs"]
mod default_config;
#[path = "cli/install.rs"]
mod install;
#[path = "cli/maintainer_guide.rs"]
mod maintainer_guide;
#[path = "cli/fuzz_parsers.rs"]
mod fuzz_parsers;
#[path = "cli/doc_examples.rs"]
mod doc_examples;
#[path = "cli/user_guide.rs"]
mod user_guide;
#[path = "cli/rough_edges.rs"]
mod rough_edges;
#[path = "cli/pyclients.rs"]
mod pyclients;
#[path = "cli/linking.rs"]
mod linking;
