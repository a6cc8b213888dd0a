//! NVML as monitoring tools (nvitop, gpustat, nvidia-ml-py users, exporters) read it: PCI
//! identity of every version against CUDA's, the PCIe link, thermals and fans, ECC, media
//! engines, BAR1, board strings, clocks and clock event reasons under load, locked clocks
//! and a power cap, process lists of every version, and a whole refresh through
//! nvml-wrapper.
//!
//! Each test's client is this test binary itself: the test runs itself (`--exact
//! nvml_monitoring::NAME`) in a child process with the driver's environment
//! (`Fake::command`) and a marker variable; there it is the client (`client_NAME`), which
//! loads `libnvidia-ml.so.1` and `libcuda.so.1` by soname as real clients do.

#[path = "../examples/fakegpu_probe/cuda.rs"]
#[allow(dead_code)]
mod cuda;

use std::ffi::{c_char, c_uint, c_void, CStr};
use std::time::{Duration, Instant};

use crate::common::{self, run_ok, Fake};

/// Set in the child's environment: there each test is its own client.
const CHILD: &str = "FAKEGPU_NVML_MONITORING_CHILD";

/// Run the child test `name` (of this module) against `fake`; its stdout.
fn child(fake: &Fake, name: &str) -> String {
    let exe = std::env::current_exe().expect("path of the test binary");
    let mut cmd = fake.command(exe);
    cmd.args([
        "--exact",
        &common::test_path(module_path!(), name),
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD, "1");
    let out = run_ok(&mut cmd);
    assert!(
        out.contains("1 passed"),
        "child test {name} did not run:\n{out}"
    );
    out
}

fn in_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

const TWO_DEVICES: &str = r#"
[[device]]
name = "NVIDIA H100 80GB HBM3"
memory = "80GiB"

[[device]]
name = "NVIDIA A100-SXM4-40GB"
memory = "40GiB"
pci_bus = "0001:9A:00.0"
serial = "1320421000777"
vbios_version = "92.00.45.00.09"
board_part_number = "692-2G506-0212-002"
fans = 2
ecc = false
pcie_width = 8
"#;

// ----- the raw C API -----

type Handle = *mut c_void;

const SUCCESS: u32 = 0;
const INVALID_ARGUMENT: u32 = 2;
const NOT_SUPPORTED: u32 = 3;
const NOT_FOUND: u32 = 6;
const INSUFFICIENT_SIZE: u32 = 7;
const ARGUMENT_VERSION_MISMATCH: u32 = 25;

const REASON_IDLE: u64 = 0x1;
const REASON_APP_CLOCKS: u64 = 0x2;
const REASON_SW_POWER_CAP: u64 = 0x4;

/// `libnvidia-ml.so.1` by soname, initialized.
struct Nv {
    lib: libloading::Library,
}

fn ok<T>(rc: u32, value: T) -> Result<T, u32> {
    if rc == SUCCESS {
        Ok(value)
    } else {
        Err(rc)
    }
}

/// nvml.h's NVML_STRUCT_VERSION(T, v).
fn version_of<T>(version: u32) -> u32 {
    std::mem::size_of::<T>() as u32 | (version << 24)
}

impl Nv {
    fn load() -> Nv {
        // SAFETY: loading the fake driver runs no initializers beyond Rust's own.
        let lib = unsafe { libloading::Library::new("libnvidia-ml.so.1") }
            .expect("dlopen libnvidia-ml.so.1");
        let nv = Nv { lib };
        let init: unsafe extern "C" fn() -> u32 = nv.f("nvmlInit_v2");
        // SAFETY: no arguments.
        assert_eq!(unsafe { init() }, SUCCESS);
        nv
    }

    /// The function `name`, typed as the caller says (nvml.h's signature).
    fn f<T: Copy>(&self, name: &str) -> T {
        // SAFETY: the caller names the C signature of `name` as nvml.h declares it.
        unsafe {
            *self
                .lib
                .get::<T>(name.as_bytes())
                .unwrap_or_else(|e| panic!("dlsym {name}: {e}"))
        }
    }

    fn handle(&self, index: u32) -> Handle {
        let f: unsafe extern "C" fn(c_uint, *mut Handle) -> u32 =
            self.f("nvmlDeviceGetHandleByIndex_v2");
        let mut h = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { f(index, &mut h) }, SUCCESS);
        h
    }

    /// `name(device, unsigned int *)` and its kin with other 4- or 8-byte outputs.
    fn get<T: Copy>(&self, name: &str, h: Handle) -> Result<T, u32> {
        let f: unsafe extern "C" fn(Handle, *mut T) -> u32 = self.f(name);
        let mut v = zeroed::<T>();
        // SAFETY: valid out-pointer of the declared type.
        ok(unsafe { f(h, &mut v) }, v)
    }

    /// `name(device, unsigned int arg, T *)`.
    fn get_at<T: Copy>(&self, name: &str, h: Handle, arg: c_uint) -> Result<T, u32> {
        let f: unsafe extern "C" fn(Handle, c_uint, *mut T) -> u32 = self.f(name);
        let mut v = zeroed::<T>();
        // SAFETY: valid out-pointer.
        ok(unsafe { f(h, arg, &mut v) }, v)
    }

    /// `name(device, unsigned int a, unsigned int b, T *)`.
    fn get_at2<T: Copy>(&self, name: &str, h: Handle, a: c_uint, b: c_uint) -> Result<T, u32> {
        let f: unsafe extern "C" fn(Handle, c_uint, c_uint, *mut T) -> u32 = self.f(name);
        let mut v = zeroed::<T>();
        // SAFETY: valid out-pointer.
        ok(unsafe { f(h, a, b, &mut v) }, v)
    }

    /// `name(device, T *, T *)`.
    fn get_pair(&self, name: &str, h: Handle) -> Result<(u32, u32), u32> {
        let f: unsafe extern "C" fn(Handle, *mut u32, *mut u32) -> u32 = self.f(name);
        let (mut a, mut b) = (0, 0);
        // SAFETY: valid out-pointers.
        ok(unsafe { f(h, &mut a, &mut b) }, (a, b))
    }

    /// `name(device, char *, unsigned int length)` with a buffer of `length`.
    fn string(&self, name: &str, h: Handle, length: u32) -> Result<String, u32> {
        let f: unsafe extern "C" fn(Handle, *mut c_char, c_uint) -> u32 = self.f(name);
        let mut buf = vec![0 as c_char; length as usize];
        // SAFETY: `length` writable bytes.
        let rc = unsafe { f(h, buf.as_mut_ptr(), length) };
        ok(rc, ()).map(|()| {
            // SAFETY: NUL-terminated within the buffer on success.
            unsafe { CStr::from_ptr(buf.as_ptr()) }
                .to_string_lossy()
                .into_owned()
        })
    }

    fn by_bus_id(&self, name: &str, bus_id: &str) -> Result<Handle, u32> {
        let f: unsafe extern "C" fn(*const c_char, *mut Handle) -> u32 = self.f(name);
        let text = std::ffi::CString::new(bus_id).unwrap();
        let mut h = std::ptr::null_mut();
        // SAFETY: a C string and a valid out-pointer.
        ok(unsafe { f(text.as_ptr(), &mut h) }, h)
    }

    fn set_locked_clocks(&self, h: Handle, min: u32, max: u32) {
        let f: unsafe extern "C" fn(Handle, c_uint, c_uint) -> u32 =
            self.f("nvmlDeviceSetGpuLockedClocks");
        // SAFETY: plain arguments.
        assert_eq!(unsafe { f(h, min, max) }, SUCCESS, "needs root");
    }

    fn reset_locked_clocks(&self, h: Handle) {
        let f: unsafe extern "C" fn(Handle) -> u32 = self.f("nvmlDeviceResetGpuLockedClocks");
        // SAFETY: plain argument.
        assert_eq!(unsafe { f(h) }, SUCCESS);
    }

    fn set_power_limit(&self, h: Handle, mw: u32) {
        let f: unsafe extern "C" fn(Handle, c_uint) -> u32 =
            self.f("nvmlDeviceSetPowerManagementLimit");
        // SAFETY: plain arguments.
        assert_eq!(unsafe { f(h, mw) }, SUCCESS, "needs root");
    }
}

/// A zeroed `T`; only used with nvml.h's integer and integer-array types, for which every
/// bit pattern (zero included) is valid.
fn zeroed<T: Copy>() -> T {
    // SAFETY: see above: `T` is plain integers.
    unsafe { std::mem::zeroed() }
}

fn c_text(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8(bytes).unwrap()
}

// ----- identity, PCI, board, thermals, ECC, media: a machine at rest -----

#[test]
fn identity_pci_board_thermal_ecc_at_rest() {
    if in_child() {
        return client_identity_pci_board_thermal_ecc_at_rest();
    }
    let fake = Fake::with_config(TWO_DEVICES);
    child(&fake, "identity_pci_board_thermal_ecc_at_rest");
}

/// The client process of [`identity_pci_board_thermal_ecc_at_rest`].
fn client_identity_pci_board_thermal_ecc_at_rest() {
    let config = fakegpu::config::load().expect("the test's config");
    let nv = Nv::load();
    let cu = cuda::Cuda::load();
    assert_eq!(cu.init(), 0);
    let bus_id_of: unsafe extern "C" fn(*mut c_char, i32, i32) -> u32 =
        cu.sym("cuDeviceGetPCIBusId");
    let mut board_ids = Vec::new();
    for (i, c) in config.devices.iter().enumerate() {
        let h = nv.handle(i as u32);

        // PCI, every version, against CUDA's bus id and the lookups.
        let mut cuda_id = [0 as c_char; 64];
        // SAFETY: 64 writable bytes; CUDA device i is NVML device i (no CUDA_VISIBLE_DEVICES).
        assert_eq!(unsafe { bus_id_of(cuda_id.as_mut_ptr(), 64, i as i32) }, 0);
        let cuda_id = c_text(&cuda_id);
        let v3: nvml_wrapper_sys::bindings::nvmlPciInfo_t = nv
            .get("nvmlDeviceGetPciInfo_v3", h)
            .unwrap_or_else(|e| panic!("v3 {e}"));
        assert_eq!(c_text(&v3.busIdLegacy), cuda_id);
        assert_eq!(c_text(&v3.busId), c.pci.bus_id());
        assert_eq!(
            (v3.domain, v3.bus, v3.device),
            (c.pci.domain, c.pci.bus, c.pci.device)
        );
        assert_eq!(v3.pciDeviceId & 0xffff, 0x10de);
        for name in [
            "nvmlDeviceGetHandleByPciBusId",
            "nvmlDeviceGetHandleByPciBusId_v2",
        ] {
            assert_eq!(nv.by_bus_id(name, &cuda_id), Ok(h), "{name} {cuda_id}");
            assert_eq!(nv.by_bus_id(name, &c.pci.bus_id()), Ok(h), "{name}");
            assert_eq!(nv.by_bus_id(name, &cuda_id.to_lowercase()), Ok(h), "{name}");
            assert_eq!(nv.by_bus_id(name, "0000:07:00.0"), Err(NOT_FOUND));
            assert_eq!(nv.by_bus_id(name, "not a bus"), Err(INVALID_ARGUMENT));
        }
        // v1 and v2 write the 52-byte structure of their time and nothing past it.
        for name in ["nvmlDeviceGetPciInfo", "nvmlDeviceGetPciInfo_v2"] {
            let f: unsafe extern "C" fn(Handle, *mut u8) -> u32 = nv.f(name);
            let mut buf = [0xAAu8; 96];
            // SAFETY: 96 writable bytes, more than nvmlPciInfo_t's 68.
            assert_eq!(unsafe { f(h, buf.as_mut_ptr()) }, SUCCESS);
            let word = |at: usize| u32::from_ne_bytes(buf[at..at + 4].try_into().unwrap());
            let legacy: Vec<c_char> = buf[..16].iter().map(|&b| b as c_char).collect();
            assert_eq!(c_text(&legacy), cuda_id, "{name}");
            assert_eq!(
                (word(16), word(20), word(24), word(28), word(32)),
                (
                    v3.domain,
                    v3.bus,
                    v3.device,
                    v3.pciDeviceId,
                    v3.pciSubSystemId
                ),
                "{name}"
            );
            assert!(buf[36..52].iter().all(|&b| b == 0), "{name}: reserved");
            assert!(buf[52..].iter().all(|&b| b == 0xAA), "{name} wrote past 52");
        }
        let mut ext: nvml_wrapper_sys::bindings::nvmlPciInfoExt_t =
            // SAFETY: all-integer struct, zero is valid.
            unsafe { std::mem::zeroed() };
        let get_ext: unsafe extern "C" fn(Handle, *mut _) -> u32 = nv.f("nvmlDeviceGetPciInfoExt");
        // SAFETY: a valid struct.
        assert_eq!(unsafe { get_ext(h, &mut ext) }, ARGUMENT_VERSION_MISMATCH);
        ext.version = version_of::<nvml_wrapper_sys::bindings::nvmlPciInfoExt_t>(1);
        // SAFETY: a valid struct.
        assert_eq!(unsafe { get_ext(h, &mut ext) }, SUCCESS);
        assert_eq!(
            (ext.bus, ext.baseClass, ext.subClass, c_text(&ext.busId)),
            (c.pci.bus, 3, 2, c.pci.bus_id())
        );

        // The link at rest: Gen 1, full width, nothing moving.
        let preset_gen = if c.name.contains("A100") { 4 } else { 5 };
        assert_eq!(c.pcie_generation, preset_gen);
        assert_eq!(
            nv.get::<u32>("nvmlDeviceGetCurrPcieLinkGeneration", h),
            Ok(1)
        );
        assert_eq!(
            nv.get::<u32>("nvmlDeviceGetMaxPcieLinkGeneration", h),
            Ok(preset_gen)
        );
        assert_eq!(
            nv.get::<u32>("nvmlDeviceGetGpuMaxPcieLinkGeneration", h),
            Ok(preset_gen)
        );
        assert_eq!(
            nv.get::<u32>("nvmlDeviceGetCurrPcieLinkWidth", h),
            Ok(c.pcie_width)
        );
        assert_eq!(
            nv.get::<u32>("nvmlDeviceGetMaxPcieLinkWidth", h),
            Ok(c.pcie_width)
        );
        assert_eq!(nv.get::<u32>("nvmlDeviceGetPcieSpeed", h), Ok(2500));
        assert_eq!(
            nv.get::<u32>("nvmlDeviceGetPcieLinkMaxSpeed", h),
            Ok(preset_gen)
        );
        for counter in [0, 1] {
            assert_eq!(
                nv.get_at::<u32>("nvmlDeviceGetPcieThroughput", h, counter),
                Ok(0)
            );
        }
        assert_eq!(
            nv.get_at::<u32>("nvmlDeviceGetPcieThroughput", h, 2),
            Err(INVALID_ARGUMENT)
        );
        assert_eq!(nv.get::<u32>("nvmlDeviceGetPcieReplayCounter", h), Ok(0));
        assert_eq!(nv.get::<u32>("nvmlDeviceGetBusType", h), Ok(2));

        // Board strings and numbers.
        assert_eq!(
            nv.string("nvmlDeviceGetSerial", h, 30).as_deref(),
            Ok(&*c.serial)
        );
        assert_eq!(
            nv.string("nvmlDeviceGetSerial", h, c.serial.len() as u32),
            Err(INSUFFICIENT_SIZE)
        );
        assert_eq!(
            nv.string("nvmlDeviceGetVbiosVersion", h, 32).as_deref(),
            Ok(&*c.vbios_version)
        );
        assert_eq!(
            nv.string("nvmlDeviceGetBoardPartNumber", h, 80).as_deref(),
            Ok(&*c.board_part_number)
        );
        let inforom: unsafe extern "C" fn(Handle, c_uint, *mut c_char, c_uint) -> u32 =
            nv.f("nvmlDeviceGetInforomVersion");
        let mut buf = [0 as c_char; 16];
        // SAFETY: 16 writable bytes.
        assert_eq!(unsafe { inforom(h, 0, buf.as_mut_ptr(), 16) }, SUCCESS);
        assert_eq!(c_text(&buf), "2.1");
        // SAFETY: 16 writable bytes.
        assert_eq!(
            unsafe { inforom(h, 2, buf.as_mut_ptr(), 16) },
            NOT_SUPPORTED
        );
        // SAFETY: 16 writable bytes.
        assert_eq!(
            unsafe { inforom(h, 9, buf.as_mut_ptr(), 16) },
            INVALID_ARGUMENT
        );
        assert!(nv
            .string("nvmlDeviceGetInforomImageVersion", h, 16)
            .unwrap()
            .starts_with('G'));
        assert_eq!(nv.get::<u32>("nvmlDeviceGetBrand", h), Ok(14));
        board_ids.push(nv.get::<u32>("nvmlDeviceGetBoardId", h).unwrap());
        assert_eq!(nv.get::<u32>("nvmlDeviceGetMultiGpuBoard", h), Ok(0));
        assert_eq!(nv.get::<u32>("nvmlDeviceGetMinorNumber", h), Ok(i as u32));
        assert_eq!(nv.get::<u32>("nvmlDeviceGetPowerManagementMode", h), Ok(1));
        assert_eq!(nv.get::<u32>("nvmlDeviceGetComputeMode", h), Ok(0));
        assert_eq!(nv.get::<u32>("nvmlDeviceGetDisplayMode", h), Ok(0));
        assert_eq!(nv.get::<u32>("nvmlDeviceGetDisplayActive", h), Ok(0));
        assert_eq!(nv.get::<u32>("nvmlDeviceIsMigDeviceHandle", h), Ok(0));
        assert_eq!(nv.get::<u32>("nvmlDeviceGetMemoryBusWidth", h), Ok(5120));
        // Driver models are Windows's.
        for name in ["nvmlDeviceGetDriverModel", "nvmlDeviceGetDriverModel_v2"] {
            assert_eq!(nv.get_pair(name, h), Err(NOT_SUPPORTED), "{name}");
        }

        // BAR1: the memory rounded up to a power of two; the driver's 1 MiB in use.
        let bar1: [u64; 3] = nv.get("nvmlDeviceGetBAR1MemoryInfo", h).unwrap();
        assert_eq!(
            bar1,
            [c.memory.next_power_of_two(), bar1[0] - (1 << 20), 1 << 20]
        );

        // Thermals at rest.
        let temp: u32 = nv.get_at("nvmlDeviceGetTemperature", h, 0).unwrap();
        assert_eq!(temp, 30);
        let gpu_max = if c.name.contains("A100") { 85 } else { 87 };
        for (kind, want) in [
            (0, Ok(92)),
            (1, Ok(89)),
            (2, Ok(95)),
            (3, Ok(gpu_max)),
            (4, Err(NOT_SUPPORTED)),
            (7, Err(NOT_SUPPORTED)),
            (8, Err(INVALID_ARGUMENT)),
        ] {
            assert_eq!(
                nv.get_at::<u32>("nvmlDeviceGetTemperatureThreshold", h, kind),
                want,
                "threshold {kind}"
            );
        }
        let mut tv = [0u32, 0, 0];
        let get_tv: unsafe extern "C" fn(Handle, *mut [u32; 3]) -> u32 =
            nv.f("nvmlDeviceGetTemperatureV");
        // SAFETY: a 12-byte nvmlTemperature_t.
        assert_eq!(unsafe { get_tv(h, &mut tv) }, ARGUMENT_VERSION_MISMATCH);
        tv[0] = 12 | (1 << 24);
        // SAFETY: as above.
        assert_eq!(unsafe { get_tv(h, &mut tv) }, SUCCESS);
        assert_eq!(tv[2], temp);
        let mut margin: [u32; 2] = [8 | (1 << 24), 0];
        let get_margin: unsafe extern "C" fn(Handle, *mut [u32; 2]) -> u32 =
            nv.f("nvmlDeviceGetMarginTemperature");
        // SAFETY: an 8-byte nvmlMarginTemperature_t.
        assert_eq!(unsafe { get_margin(h, &mut margin) }, SUCCESS);
        assert_eq!(margin[1], 89 - temp);

        // Fans: none on the H100 (SXM), two configured on the second device.
        if c.fans == 0 {
            for r in [
                nv.get::<u32>("nvmlDeviceGetNumFans", h),
                nv.get::<u32>("nvmlDeviceGetFanSpeed", h),
                nv.get_at::<u32>("nvmlDeviceGetFanSpeed_v2", h, 0),
            ] {
                assert_eq!(r, Err(NOT_SUPPORTED));
            }
        } else {
            assert_eq!(nv.get::<u32>("nvmlDeviceGetNumFans", h), Ok(2));
            assert_eq!(nv.get::<u32>("nvmlDeviceGetFanSpeed", h), Ok(30));
            assert_eq!(nv.get_at::<u32>("nvmlDeviceGetFanSpeed_v2", h, 1), Ok(30));
            assert_eq!(
                nv.get_at::<u32>("nvmlDeviceGetFanSpeed_v2", h, 2),
                Err(INVALID_ARGUMENT)
            );
            assert_eq!(nv.get_pair("nvmlDeviceGetMinMaxFanSpeed", h), Ok((30, 100)));
        }

        // ECC: on by default (zero errors), off where the config says so.
        let on = u32::from(c.ecc);
        assert_eq!(nv.get_pair("nvmlDeviceGetEccMode", h), Ok((on, on)));
        assert_eq!(nv.get::<u32>("nvmlDeviceGetDefaultEccMode", h), Ok(1));
        for error_type in [0, 1] {
            for counter in [0, 1] {
                let total =
                    nv.get_at2::<u64>("nvmlDeviceGetTotalEccErrors", h, error_type, counter);
                let detailed = nv.get_at2::<[u64; 4]>(
                    "nvmlDeviceGetDetailedEccErrors",
                    h,
                    error_type,
                    counter,
                );
                if c.ecc {
                    assert_eq!((total, detailed), (Ok(0), Ok([0; 4])));
                } else {
                    assert_eq!((total, detailed), (Err(NOT_SUPPORTED), Err(NOT_SUPPORTED)));
                }
            }
        }
        assert_eq!(
            nv.get_at2::<u64>("nvmlDeviceGetTotalEccErrors", h, 2, 0),
            Err(INVALID_ARGUMENT)
        );
        let counter: unsafe extern "C" fn(Handle, c_uint, c_uint, c_uint, *mut u64) -> u32 =
            nv.f("nvmlDeviceGetMemoryErrorCounter");
        let mut n = 7u64;
        // SAFETY: valid out-pointer.
        let rc = unsafe { counter(h, 1, 1, 2, &mut n) };
        assert_eq!(
            (rc, n),
            if c.ecc {
                (SUCCESS, 0)
            } else {
                (NOT_SUPPORTED, 7)
            }
        );
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { counter(h, 0, 0, 8, &mut n) }, INVALID_ARGUMENT);
        // Ampere and Hopper remap rows instead of retiring pages.
        let rows: unsafe extern "C" fn(Handle, *mut u32, *mut u32, *mut u32, *mut u32) -> u32 =
            nv.f("nvmlDeviceGetRemappedRows");
        let mut r = [9u32; 4];
        let [a, b, p, f] = r.each_mut().map(|x| x as *mut u32);
        // SAFETY: four valid out-pointers.
        assert_eq!(unsafe { rows(h, a, b, p, f) }, SUCCESS);
        assert_eq!(r, [0; 4]);
        let pages: unsafe extern "C" fn(Handle, c_uint, *mut c_uint, *mut u64) -> u32 =
            nv.f("nvmlDeviceGetRetiredPages");
        let mut count = 0;
        // SAFETY: a valid count pointer, no array with count 0.
        assert_eq!(
            unsafe { pages(h, 0, &mut count, std::ptr::null_mut()) },
            NOT_SUPPORTED
        );

        // Media engines idle, no sessions.
        for name in [
            "nvmlDeviceGetEncoderUtilization",
            "nvmlDeviceGetDecoderUtilization",
            "nvmlDeviceGetJpgUtilization",
            "nvmlDeviceGetOfaUtilization",
        ] {
            assert_eq!(nv.get_pair(name, h), Ok((0, 1_000_000)), "{name}");
        }
        let stats: unsafe extern "C" fn(Handle, *mut u32, *mut u32, *mut u32) -> u32 =
            nv.f("nvmlDeviceGetEncoderStats");
        let mut s = [5u32; 3];
        let [a, b, c3] = s.each_mut().map(|x| x as *mut u32);
        // SAFETY: three valid out-pointers.
        assert_eq!(unsafe { stats(h, a, b, c3) }, SUCCESS);
        assert_eq!(s, [0; 3]);
        for name in ["nvmlDeviceGetEncoderSessions", "nvmlDeviceGetFBCSessions"] {
            let f: unsafe extern "C" fn(Handle, *mut c_uint, *mut c_void) -> u32 = nv.f(name);
            let mut count = 4;
            let mut space = [0u64; 64];
            // SAFETY: room for 4 entries of either session struct (< 128 bytes each).
            assert_eq!(
                unsafe { f(h, &mut count, space.as_mut_ptr().cast()) },
                SUCCESS
            );
            assert_eq!(count, 0, "{name}");
        }
        assert_eq!(nv.get::<[u32; 3]>("nvmlDeviceGetFBCStats", h), Ok([0; 3]));

        // Clocks of every type and id, at rest.
        let lowest = c.lowest_clock_mhz();
        for kind in 0..4u32 {
            let memory = kind == 2;
            let (now, max, app) = if memory {
                (c.memory_clock_mhz, c.memory_clock_mhz, c.memory_clock_mhz)
            } else {
                (lowest, c.max_clock_mhz, c.default_clock_mhz)
            };
            assert_eq!(
                nv.get_at::<u32>("nvmlDeviceGetClockInfo", h, kind),
                Ok(now),
                "{kind}"
            );
            assert_eq!(
                nv.get_at::<u32>("nvmlDeviceGetMaxClockInfo", h, kind),
                Ok(max)
            );
            assert_eq!(
                nv.get_at::<u32>("nvmlDeviceGetMaxCustomerBoostClock", h, kind),
                Ok(max)
            );
            assert_eq!(
                nv.get_at::<u32>("nvmlDeviceGetApplicationsClock", h, kind),
                Ok(app)
            );
            assert_eq!(
                nv.get_at::<u32>("nvmlDeviceGetDefaultApplicationsClock", h, kind),
                Ok(app)
            );
            for (id, want) in [(0, now), (1, app), (2, app), (3, max)] {
                assert_eq!(
                    nv.get_at2::<u32>("nvmlDeviceGetClock", h, kind, id),
                    Ok(want),
                    "clock {kind} id {id}"
                );
            }
        }
        assert_eq!(
            nv.get_at::<u32>("nvmlDeviceGetMaxCustomerBoostClock", h, 4),
            Err(INVALID_ARGUMENT)
        );
        // At rest: idle is the one reason, P8.
        for name in [
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetCurrentClocksThrottleReasons",
        ] {
            assert_eq!(nv.get::<u64>(name, h), Ok(REASON_IDLE), "{name}");
        }
        for name in [
            "nvmlDeviceGetSupportedClocksEventReasons",
            "nvmlDeviceGetSupportedClocksThrottleReasons",
        ] {
            let supported = nv.get::<u64>(name, h).unwrap();
            assert_eq!(supported & 0x7, 0x7, "{name}: idle, app clocks, power cap");
            assert_eq!(supported & 0x100, 0, "{name}: no display");
        }
        assert_eq!(nv.get::<u32>("nvmlDeviceGetPerformanceState", h), Ok(8));
        assert_eq!(nv.get::<u32>("nvmlDeviceGetPowerState", h), Ok(8));
    }
    board_ids.dedup();
    assert_eq!(board_ids.len(), 2, "board ids are distinct");
}

// ----- load, a power cap and locked clocks -----

/// A kernel of `waves` waves of 100 µs at the maximum clock, queued now (not waited for).
fn queue_kernel(cu: &cuda::Cuda, function: *mut c_void, waves: u32) {
    assert_eq!(cu.launch(function, 132 * waves), 0);
}

#[test]
fn load_power_cap_and_locked_clocks_show_in_reasons_clocks_link_and_fans() {
    if in_child() {
        return client_load_power_cap_and_locked_clocks_show_in_reasons_clocks_link_and_fans();
    }
    let fake = Fake::with_config(
        "[[device]]\nname = \"NVIDIA H100 80GB HBM3\"\nmemory = \"80GiB\"\nfans = 1\n",
    );
    child(
        &fake,
        "load_power_cap_and_locked_clocks_show_in_reasons_clocks_link_and_fans",
    );
    let state = &fake.states()[0];
    assert_eq!(state.locked_clocks(), None);
}

/// The client process of [`load_power_cap_and_locked_clocks_show_in_reasons_clocks_link_and_fans`].
fn client_load_power_cap_and_locked_clocks_show_in_reasons_clocks_link_and_fans() {
    let nv = Nv::load();
    let h = nv.handle(0);
    let cu = cuda::Cuda::load();
    assert_eq!(cu.init(), 0);
    let ctx = cu.ctx_create(0).unwrap();
    let function = cu.function();
    let reasons = || {
        nv.get::<u64>("nvmlDeviceGetCurrentClocksEventReasons", h)
            .unwrap()
    };
    let sm_clock = || nv.get_at::<u32>("nvmlDeviceGetClockInfo", h, 1).unwrap();

    // A 200 W cap on a busy H100: the power limit holds the clock down.
    nv.set_power_limit(h, 200_000);
    queue_kernel(&cu, function, 3000); // 300 ms at 1980 MHz, longer capped
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(reasons(), REASON_SW_POWER_CAP);
    assert_eq!(
        nv.get::<u64>("nvmlDeviceGetCurrentClocksThrottleReasons", h),
        Ok(REASON_SW_POWER_CAP)
    );
    let capped = sm_clock();
    assert!((345..1980).contains(&capped), "capped clock {capped}");
    assert_eq!(nv.get_at::<u32>("nvmlDeviceGetClockInfo", h, 0), Ok(capped));
    assert_eq!(nv.get_at::<u32>("nvmlDeviceGetClockInfo", h, 3), Ok(capped));
    assert_eq!(nv.get::<u32>("nvmlDeviceGetPerformanceState", h), Ok(0));
    assert_eq!(
        nv.get::<u32>("nvmlDeviceGetCurrPcieLinkGeneration", h),
        Ok(5)
    );
    assert_eq!(nv.get::<u32>("nvmlDeviceGetPcieSpeed", h), Ok(32_000));
    let rx = nv
        .get_at::<u32>("nvmlDeviceGetPcieThroughput", h, 1)
        .unwrap();
    let tx = nv
        .get_at::<u32>("nvmlDeviceGetPcieThroughput", h, 0)
        .unwrap();
    assert!(rx > 0 && tx > 0 && tx <= rx, "tx {tx} rx {rx}");
    let power = nv.get::<u32>("nvmlDeviceGetPowerUsage", h).unwrap();
    assert!((70_001..=200_000).contains(&power), "power {power}");
    let temp: u32 = nv.get_at("nvmlDeviceGetTemperature", h, 0).unwrap();
    assert!(temp > 30, "a busy GPU warms: {temp}");
    let fan = nv.get::<u32>("nvmlDeviceGetFanSpeed", h).unwrap();
    assert!(
        fan > 30 && fan.abs_diff(30 + (temp - 30) * 50 / 45) <= 2,
        "fan {fan} at {temp}"
    );
    assert_eq!(cu.synchronize(), 0);

    // Locked at 1005 MHz with the default limit: the lock, not the power, sets the clock.
    nv.set_power_limit(h, 700_000);
    nv.set_locked_clocks(h, 1005, 1005);
    queue_kernel(&cu, function, 1000);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(reasons(), REASON_APP_CLOCKS);
    assert_eq!(sm_clock(), 1005);
    assert_eq!(nv.get::<u32>("nvmlDeviceGetPerformanceState", h), Ok(0));
    assert_eq!(cu.synchronize(), 0);

    // At rest, still locked: idle and the lock; the clock stays at the locked minimum.
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(reasons(), REASON_IDLE | REASON_APP_CLOCKS);
    assert_eq!(sm_clock(), 1005);
    assert_eq!(nv.get::<u32>("nvmlDeviceGetPerformanceState", h), Ok(0));
    assert_eq!(
        nv.get::<u32>("nvmlDeviceGetCurrPcieLinkGeneration", h),
        Ok(1)
    );
    assert_eq!(nv.get_at::<u32>("nvmlDeviceGetPcieThroughput", h, 1), Ok(0));
    assert_eq!(nv.get::<u32>("nvmlDeviceGetFanSpeed", h), Ok(30));

    // Unlocked at rest: idle only, the lowest clock, P8.
    nv.reset_locked_clocks(h);
    assert_eq!(reasons(), REASON_IDLE);
    assert_eq!(sm_clock(), 345);
    assert_eq!(nv.get::<u32>("nvmlDeviceGetPerformanceState", h), Ok(8));
    assert_eq!(cu.ctx_destroy(ctx), 0);
}

// ----- process lists of every version -----

#[test]
fn process_lists_of_every_version_agree() {
    if in_child() {
        return client_process_lists_of_every_version_agree();
    }
    let fake = Fake::new();
    child(&fake, "process_lists_of_every_version_agree");
}

type ProcessInfo = nvml_wrapper_sys::bindings::nvmlProcessInfo_t;
type ProcessInfoV1 = nvml_wrapper_sys::bindings::nvmlProcessInfo_v1_t;
type Detail = nvml_wrapper_sys::bindings::nvmlProcessDetail_v1_t;
type DetailList = nvml_wrapper_sys::bindings::nvmlProcessDetailList_t;

/// (pid, bytes) of `name`'s list, in the v2/v3 structure.
fn list_v3(nv: &Nv, name: &str, h: Handle) -> Vec<(u32, u64)> {
    let f: unsafe extern "C" fn(Handle, *mut c_uint, *mut ProcessInfo) -> u32 = nv.f(name);
    let mut count = 0;
    // SAFETY: count 0 with no array asks for the size.
    let rc = unsafe { f(h, &mut count, std::ptr::null_mut()) };
    if count == 0 {
        assert_eq!(rc, SUCCESS, "{name}");
        return Vec::new();
    }
    assert_eq!(rc, INSUFFICIENT_SIZE, "{name}");
    // SAFETY: all-integer struct.
    let mut infos = vec![unsafe { std::mem::zeroed::<ProcessInfo>() }; count as usize];
    // SAFETY: `count` entries.
    assert_eq!(unsafe { f(h, &mut count, infos.as_mut_ptr()) }, SUCCESS);
    infos.truncate(count as usize);
    for i in &infos {
        assert_eq!((i.gpuInstanceId, i.computeInstanceId), (u32::MAX, u32::MAX));
    }
    infos.iter().map(|i| (i.pid, i.usedGpuMemory)).collect()
}

fn list_v1(nv: &Nv, name: &str, h: Handle) -> Vec<(u32, u64)> {
    let f: unsafe extern "C" fn(Handle, *mut c_uint, *mut ProcessInfoV1) -> u32 = nv.f(name);
    let mut count = 8;
    // SAFETY: all-integer struct.
    let mut infos = [unsafe { std::mem::zeroed::<ProcessInfoV1>() }; 8];
    // SAFETY: 8 entries.
    assert_eq!(
        unsafe { f(h, &mut count, infos.as_mut_ptr()) },
        SUCCESS,
        "{name}"
    );
    infos[..count as usize]
        .iter()
        .map(|i| (i.pid, i.usedGpuMemory))
        .collect()
}

fn detail_list(nv: &Nv, h: Handle, mode: u32) -> Result<Vec<(u32, u64)>, u32> {
    let f: unsafe extern "C" fn(Handle, *mut DetailList) -> u32 =
        nv.f("nvmlDeviceGetRunningProcessDetailList");
    // SAFETY: all-integer struct.
    let mut array = [unsafe { std::mem::zeroed::<Detail>() }; 8];
    let mut list = DetailList {
        version: version_of::<DetailList>(1),
        mode,
        numProcArrayEntries: 8,
        procArray: array.as_mut_ptr(),
    };
    // SAFETY: a valid list with room for 8.
    ok(unsafe { f(h, &mut list) }, ())?;
    Ok(array[..list.numProcArrayEntries as usize]
        .iter()
        .map(|d| (d.pid, d.usedGpuMemory))
        .collect())
}

/// The client process of [`process_lists_of_every_version_agree`].
fn client_process_lists_of_every_version_agree() {
    let nv = Nv::load();
    let h = nv.handle(0);
    let cu = cuda::Cuda::load();
    assert_eq!(cu.init(), 0);
    let ctx = cu.ctx_create(0).unwrap();
    let ptr = cu.alloc(64 << 20).unwrap();
    let me = std::process::id();
    let want = vec![(me, 64u64 << 20)];

    let compute = |nv: &Nv| {
        let v3 = list_v3(nv, "nvmlDeviceGetComputeRunningProcesses_v3", h);
        assert_eq!(
            list_v3(nv, "nvmlDeviceGetComputeRunningProcesses_v2", h),
            v3
        );
        assert_eq!(list_v1(nv, "nvmlDeviceGetComputeRunningProcesses", h), v3);
        assert_eq!(detail_list(nv, h, 0), Ok(v3.clone()));
        v3
    };
    assert_eq!(compute(&nv), want);
    for name in [
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        "nvmlDeviceGetGraphicsRunningProcesses_v2",
        "nvmlDeviceGetMPSComputeRunningProcesses_v3",
        "nvmlDeviceGetMPSComputeRunningProcesses_v2",
    ] {
        assert_eq!(list_v3(&nv, name, h), Vec::new(), "{name}");
    }
    for name in [
        "nvmlDeviceGetGraphicsRunningProcesses",
        "nvmlDeviceGetMPSComputeRunningProcesses",
    ] {
        assert_eq!(list_v1(&nv, name, h), Vec::new(), "{name}");
    }
    assert_eq!(detail_list(&nv, h, 1), Ok(Vec::new()));
    assert_eq!(detail_list(&nv, h, 2), Ok(Vec::new()));
    assert_eq!(detail_list(&nv, h, 3), Err(INVALID_ARGUMENT));

    // The detail list's protocol: a bad version, then too small an array.
    let f: unsafe extern "C" fn(Handle, *mut DetailList) -> u32 =
        nv.f("nvmlDeviceGetRunningProcessDetailList");
    let mut list = DetailList {
        version: 1,
        mode: 0,
        numProcArrayEntries: 0,
        procArray: std::ptr::null_mut(),
    };
    // SAFETY: a valid list.
    assert_eq!(unsafe { f(h, &mut list) }, INVALID_ARGUMENT);
    list.version = version_of::<DetailList>(1);
    // SAFETY: a valid list; no array with capacity 0.
    assert_eq!(unsafe { f(h, &mut list) }, INSUFFICIENT_SIZE);
    assert_eq!(list.numProcArrayEntries, 1);

    // nvml-wrapper (as Rust tools use it) reads the same.
    let nvml = nvml_wrapper::Nvml::init().unwrap();
    let device = nvml.device_by_index(0).unwrap();
    let seen: Vec<(u32, u64)> = device
        .running_compute_processes()
        .unwrap()
        .into_iter()
        .map(|p| match p.used_gpu_memory {
            nvml_wrapper::enums::device::UsedGpuMemory::Used(b) => (p.pid, b),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(seen, want);

    // BAR1 holds this process's mappings.
    let bar1: [u64; 3] = nv.get("nvmlDeviceGetBAR1MemoryInfo", h).unwrap();
    assert_eq!(bar1[2], 3 << 20);

    assert_eq!(cu.free(ptr), 0);
    assert_eq!(cu.ctx_destroy(ctx), 0);
    assert_eq!(compute(&nv), Vec::new());
    let bar1: [u64; 3] = nv.get("nvmlDeviceGetBAR1MemoryInfo", h).unwrap();
    assert_eq!(bar1[2], 1 << 20);
}

// ----- a monitoring tool's refresh, through nvml-wrapper -----

#[test]
fn a_monitoring_refresh_through_nvml_wrapper() {
    if in_child() {
        return client_a_monitoring_refresh_through_nvml_wrapper();
    }
    let fake = Fake::with_config(TWO_DEVICES);
    let out = child(&fake, "a_monitoring_refresh_through_nvml_wrapper");
    // The child's harness prints its test's name on the same line.
    let refresh = out.split("refresh=").nth(1).and_then(|r| r.lines().next());
    println!(
        "one refresh of two devices: {}",
        refresh.expect("refresh= in the output")
    );
}

/// The client process of [`a_monitoring_refresh_through_nvml_wrapper`].
fn client_a_monitoring_refresh_through_nvml_wrapper() {
    use nvml_wrapper::enum_wrappers::device::{
        Clock, ClockId, EccCounter, MemoryError, PcieUtilCounter, PerformanceState,
        TemperatureSensor, TemperatureThreshold,
    };
    use nvml_wrapper::error::NvmlError;
    let nvml = nvml_wrapper::Nvml::init().unwrap();
    let config = fakegpu::config::load().unwrap();
    assert!(nvml.sys_driver_version().is_ok());
    assert!(nvml.sys_cuda_driver_version().is_ok());
    // What gpustat and nvitop read for every device on every refresh, and more.
    let refresh = || {
        for (i, c) in config.devices.iter().enumerate() {
            let d = nvml.device_by_index(i as u32).unwrap();
            assert_eq!(d.name().unwrap(), c.name);
            assert_eq!(d.uuid().unwrap(), c.uuid);
            assert_eq!(d.pci_info().unwrap().bus_id, c.pci.bus_id());
            assert_eq!(d.serial().unwrap(), c.serial);
            assert_eq!(d.vbios_version().unwrap(), c.vbios_version);
            assert_eq!(d.board_part_number().unwrap(), c.board_part_number);
            assert!(d.temperature(TemperatureSensor::Gpu).unwrap() >= 30);
            assert_eq!(
                d.temperature_threshold(TemperatureThreshold::Shutdown)
                    .unwrap(),
                92
            );
            match d.fan_speed(0) {
                Ok(speed) => assert!(c.fans > 0 && speed >= 30),
                Err(NvmlError::NotSupported) => assert_eq!(c.fans, 0),
                Err(e) => panic!("fan: {e}"),
            }
            assert!(d.power_usage().unwrap() >= c.power_idle_mw);
            assert_eq!(d.enforced_power_limit().unwrap(), c.power_limit_default_mw);
            assert_eq!(d.utilization_rates().unwrap().gpu, 0);
            assert_eq!(d.encoder_utilization().unwrap().utilization, 0);
            assert_eq!(d.decoder_utilization().unwrap().utilization, 0);
            assert_eq!(d.memory_info().unwrap().total, c.memory);
            assert_eq!(d.bar1_memory_info().unwrap().total, c.bar1_memory);
            assert!(d.running_compute_processes().unwrap().is_empty());
            assert!(d.running_graphics_processes().unwrap().is_empty());
            assert_eq!(
                d.clock(Clock::SM, ClockId::Current).unwrap(),
                c.lowest_clock_mhz()
            );
            assert_eq!(d.max_clock_info(Clock::Memory).unwrap(), c.memory_clock_mhz);
            assert_eq!(
                d.max_customer_boost_clock(Clock::Graphics).unwrap(),
                c.max_clock_mhz
            );
            assert_eq!(d.performance_state().unwrap(), PerformanceState::Eight);
            assert_eq!(d.current_pcie_link_gen().unwrap(), 1);
            assert_eq!(d.max_pcie_link_gen().unwrap(), c.pcie_generation);
            assert_eq!(d.current_pcie_link_width().unwrap(), c.pcie_width);
            assert_eq!(d.pcie_throughput(PcieUtilCounter::Receive).unwrap(), 0);
            assert!(d.current_throttle_reasons().unwrap().bits() == REASON_IDLE);
            assert_eq!(d.is_ecc_enabled().unwrap().currently_enabled, c.ecc);
            if c.ecc {
                assert_eq!(
                    d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Aggregate)
                        .unwrap(),
                    0
                );
            }
            assert!(!d.is_display_active().unwrap());
            assert_eq!(d.encoder_stats().unwrap().session_count, 0);
            assert_eq!(d.fbc_stats().unwrap().sessions_count, 0);
        }
    };
    refresh();
    // Cheap enough to poll: 50 refreshes of everything well under a second each.
    let start = Instant::now();
    for _ in 0..50 {
        refresh();
    }
    let each = start.elapsed() / 50;
    println!("refresh={each:?}");
    assert!(
        each < Duration::from_millis(200),
        "one refresh took {each:?}"
    );
}
