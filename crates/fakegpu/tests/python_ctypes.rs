//! (e) Python ctypes loads both sonames and drives the fake.

use crate::common::{field, run_ok, Fake};
use nvml_wrapper_sys::bindings as nv;

#[test]
fn python_ctypes_client() {
    let fake = Fake::new();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/client.py");
    let out = run_ok(fake.command("python3").arg(script));
    let mib256 = (256u64 << 20).to_string();
    assert_eq!(field(&out, "count"), "1");
    assert_eq!(field(&out, "name"), "NVIDIA H100 80GB HBM3");
    assert_eq!(field(&out, "cuda_used"), mib256);
    assert_eq!(field(&out, "nvml_name"), "NVIDIA H100 80GB HBM3");
    assert_eq!(
        field(&out, "nvml_used"),
        mib256,
        "NVML sees what CUDA allocated"
    );
    assert_eq!(field(&out, "nvml_total"), (80u64 << 30).to_string());
    assert_eq!(
        field(&out, "v2_unversioned"),
        nv::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH.to_string()
    );
    assert_eq!(field(&out, "v2"), "0");
    assert_eq!(field(&out, "v2_used"), mib256);
    assert_eq!(
        field(&out, "small_buffer"),
        nv::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE.to_string()
    );
    assert_eq!(field(&out, "error_string"), "Insufficient Size");
    assert_eq!(
        field(&out, "process_count_rc"),
        nv::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE.to_string()
    );
    assert_eq!(field(&out, "process_count"), "1");
    assert_eq!(
        field(&out, "shutdown_again"),
        nv::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED.to_string()
    );
    assert_eq!(fake.states()[0].used(), 0);
}
