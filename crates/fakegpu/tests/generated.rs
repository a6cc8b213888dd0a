//! The checked-in tables generated from NVIDIA's headers are what the generator produces
//! from the headers tests/fetch-headers.sh pins.

use crate::common;

#[test]
fn generated_tables_are_up_to_date() {
    let include = common::headers()
        .into_iter()
        .find(|d| d.join("cudaTypedefs.h").is_file())
        .expect("cuda include dir");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("gen_cuda_procs.py");
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(script).arg(include).arg("--check");
    common::run_ok(&mut cmd);
}

/// The NOT_SUPPORTED stubs (src/cuda/unsupported.rs, src/nvml/unsupported.rs) and the
/// README's conformance table are what gen_exports.py makes of the headers and of the
/// hand-written functions now under src/: adding an implementation without rerunning the
/// generator fails here (and the library would not link: two definitions of one symbol).
#[test]
fn stubs_and_conformance_table_are_up_to_date() {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("gen_exports.py");
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(script).args(common::headers()).arg("--check");
    common::run_ok(&mut cmd);
}
