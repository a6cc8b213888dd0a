//! The simulated driver's integration tests, in one test executable (`cargo test -p fakegpu
//! --test fake`; a test is named `MODULE::TEST`). Each module is one file beside this one;
//! `common/` is their shared installation of the fake (a private directory of links,
//! state and config), with `c/` and `py/` the client programs they build or run.
//!
//! A test that must be the first to initialize the driver in its process runs itself in a
//! child process (`conformance`, `nvml_monitoring`: `--exact MODULE::TEST`); the tests that
//! load the driver into this process (`dlopen`, `conformance`) only look functions up and
//! read the driver version, which needs no initialization and touches no config or shared
//! state. Nothing sets process-wide environment: every client gets the driver's environment
//! on its own command (`Fake::command`).

mod common;

mod abi;
mod c_program;
mod checkpoint;
mod conformance;
mod cross_process;
mod cuda_api;
mod cuda_families;
mod dlopen;
mod generated;
mod nvml_monitoring;
mod nvml_wrapper;
mod python_ctypes;
mod quota_race;
mod timeline;
