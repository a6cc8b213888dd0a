//! No code. See this crate's `Cargo.toml`: as a workspace member it makes
//! `cargo build --workspace` ask the same dependency features as `cargo test --workspace`,
//! so that a CI run compiles each crate once.
