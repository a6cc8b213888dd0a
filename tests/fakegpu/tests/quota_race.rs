//! Allocation is one atomic step across processes: processes racing for the last bytes of a
//! device never push its usage past the device size, at any instant (the peak proves it).

mod common;

use common::{field, in_child, Cuda, Fake};
use cudarc::driver::sys::CUresult;

const GIB: u64 = 1 << 30;

/// Child: grab 512 MiB blocks until OOM, free them, 50 rounds; print how many it held most.
#[test]
#[ignore = "child process of racing_processes_never_exceed_the_device"]
fn grabber() {
    assert!(
        in_child(),
        "run by racing_processes_never_exceed_the_device"
    );
    let cuda = Cuda::load();
    assert_eq!(cuda.init(), 0);
    cuda.ctx_create(0).unwrap();
    let mut most = 0;
    for _ in 0..50 {
        let mut held = Vec::new();
        loop {
            match cuda.alloc((GIB / 2) as usize) {
                Ok(p) => held.push(p),
                Err(e) => {
                    assert_eq!(e, CUresult::CUDA_ERROR_OUT_OF_MEMORY as u32);
                    break;
                }
            }
        }
        most = most.max(held.len());
        for p in held {
            assert_eq!(cuda.free(p), 0);
        }
    }
    println!("most={most}");
}

#[test]
fn racing_processes_never_exceed_the_device() {
    let fake =
        Fake::with_config("[[device]]\nname = \"NVIDIA H100 80GB HBM3\"\nmemory = \"4GiB\"\n");
    let state = &fake.states()[0];
    let children: Vec<_> = (0..4)
        .map(|_| {
            fake.rerun("grabber")
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("spawn grabber")
        })
        .collect();
    let mut total_most = 0;
    for child in children {
        let out = child.wait_with_output().expect("wait for grabber");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        total_most += field(&String::from_utf8_lossy(&out.stdout), "most")
            .parse::<u64>()
            .unwrap();
    }
    assert!(total_most >= 8, "the device was filled at some point");
    assert_eq!(state.used(), 0);
    assert_eq!(
        state.peak(),
        4 * GIB,
        "usage reached the device size and never went past it"
    );
}
