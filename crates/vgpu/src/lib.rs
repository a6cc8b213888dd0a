//! vgpu as a library: everything the `vgpu` binary does. The modules the binary, the
//! integration tests, the benchmarks and the fuzz targets use are `pub`; the rest is
//! `pub(crate)`.

pub mod cli;
pub mod commands;
pub mod output;
