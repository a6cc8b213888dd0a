//! (d) A C program compiled at test time against NVIDIA's cuda.h and linked with
//! `-l:libcuda.so.1` runs on the fake through the dynamic linker: init rules, device
//! queries, allocation, OOM, cuMemGetInfo, error names.

use crate::common::{field, run_ok, Fake};

const GIB: u64 = 1 << 30;

#[test]
fn c_program_linked_against_libcuda() {
    let fake = Fake::new();
    let client = fake.build_client();
    let needed = run_ok(std::process::Command::new("readelf").arg("-d").arg(&client));
    assert!(
        needed.contains("[libcuda.so.1]"),
        "the client needs libcuda.so.1:\n{needed}"
    );

    let out = run_ok(&mut fake.command(&client));
    assert_eq!(field(&out, "before_init"), "CUDA_ERROR_NOT_INITIALIZED");
    assert_eq!(field(&out, "version"), "12080");
    assert_eq!(field(&out, "count"), "1");
    assert_eq!(field(&out, "name"), "NVIDIA H100 80GB HBM3");
    assert_eq!(field(&out, "total"), (80 * GIB).to_string());
    assert_eq!(field(&out, "sms"), "132");
    assert_eq!(field(&out, "cc_major"), "9");
    assert_eq!(field(&out, "no_context"), "CUDA_ERROR_INVALID_CONTEXT");
    assert_eq!(field(&out, "free"), (79 * GIB).to_string());
    assert_eq!(field(&out, "oom"), "CUDA_ERROR_OUT_OF_MEMORY");
    assert_eq!(field(&out, "oom_text"), "out of memory");
    assert_eq!(field(&out, "double_free"), "CUDA_ERROR_INVALID_VALUE");
    assert_eq!(field(&out, "free_after"), (80 * GIB).to_string());
    let state = &fake.states()[0];
    assert_eq!((state.used(), state.peak()), (0, GIB));
}
