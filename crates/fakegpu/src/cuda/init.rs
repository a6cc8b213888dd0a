//! Initialization, version, devices and their attributes, error names.

use std::ffi::{c_char, c_int, c_uint};

use cudarc::driver::sys::{CUdevice, CUdevice_attribute as A, CUresult, CUuuid};

use super::error_names::CU_RESULTS;
use super::{entry, process, CuResult};
use crate::config::DeviceConfig;
use crate::ffi;

#[no_mangle]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CUresult {
    entry(|| {
        if flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        process::init()
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    // SAFETY: `version` is NULL or writable (driver API contract).
    entry(|| Ok(unsafe { ffi::write(version, crate::CUDA_DRIVER_VERSION) }?))
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    entry(|| {
        let n = process::with(|p| Ok(p.visible.len()))?;
        // SAFETY: `count` is NULL or writable (driver API contract).
        Ok(unsafe { ffi::write(count, n as c_int) }?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    entry(|| {
        process::with(|p| p.device_of(ordinal).map(|_| ()))?;
        // SAFETY: `device` is NULL or writable (driver API contract).
        Ok(unsafe { ffi::write(device, ordinal) }?)
    })
}

/// The config of CUDA ordinal `dev`.
fn config(dev: CUdevice) -> CuResult<&'static DeviceConfig> {
    process::with(|p| {
        let index = p.device_of(dev)?;
        Ok(&p.device(index)?.config)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    entry(|| {
        let config = config(dev)?;
        let len = usize::try_from(len).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: `name` is NULL or holds `len` writable bytes (driver API contract).
        Ok(unsafe { ffi::copy_c_string(name, len, &config.name, true) }?)
    })
}

/// The 16 bytes of a `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` UUID.
pub(crate) fn uuid_bytes(uuid: &str) -> [u8; 16] {
    let hex: Vec<u8> = uuid
        .trim_start_matches("GPU-")
        .bytes()
        .filter(u8::is_ascii_hexdigit)
        .collect();
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).take(16).enumerate() {
        let digit = |c: u8| (c as char).to_digit(16).unwrap_or(0) as u8;
        out[i] = (digit(pair[0]) << 4) | pair.get(1).map_or(0, |&c| digit(c));
    }
    out
}

fn write_uuid(uuid: *mut CUuuid, dev: CUdevice) -> CuResult {
    let config = config(dev)?;
    let bytes = uuid_bytes(&config.uuid).map(|b| b as c_char);
    // SAFETY: `uuid` is NULL or a writable CUuuid (driver API contract).
    Ok(unsafe { ffi::write(uuid, CUuuid { bytes }) }?)
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    entry(|| write_uuid(uuid, dev))
}

/// Same as cuDeviceGetUuid here: the two differ only for MIG instances.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    entry(|| write_uuid(uuid, dev))
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    entry(|| {
        let memory = config(dev)?.memory;
        // SAFETY: `bytes` is NULL or writable (driver API contract).
        Ok(unsafe { ffi::write(bytes, usize::try_from(memory).unwrap_or(usize::MAX)) }?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceComputeCapability(
    major: *mut c_int,
    minor: *mut c_int,
    dev: CUdevice,
) -> CUresult {
    entry(|| {
        let (ma, mi) = config(dev)?.compute_capability;
        // SAFETY: both are NULL or writable (driver API contract).
        unsafe {
            ffi::write(major, ma as c_int)?;
            ffi::write(minor, mi as c_int)?;
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    value: *mut c_int,
    attrib: c_uint,
    dev: CUdevice,
) -> CUresult {
    entry(|| {
        let config = config(dev)?;
        let v = attribute(config, attrib).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: `value` is NULL or writable (driver API contract).
        Ok(unsafe { ffi::write(value, v) }?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(
    bus_id: *mut c_char,
    len: c_int,
    dev: CUdevice,
) -> CUresult {
    entry(|| {
        let config = config(dev)?;
        let len = usize::try_from(len).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: `bus_id` is NULL or holds `len` writable bytes (driver API contract).
        Ok(unsafe { ffi::copy_c_string(bus_id, len, &config.pci.bus_id_legacy(), true) }?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetByPCIBusId(
    dev: *mut CUdevice,
    bus_id: *const c_char,
) -> CUresult {
    entry(|| {
        // SAFETY: `bus_id` is NULL or a C string (driver API contract).
        let text = unsafe { ffi::c_str(bus_id) }.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let wanted =
            crate::config::PciAddress::parse(text).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let ordinal = process::with(|p| {
            p.visible
                .iter()
                .position(|&i| p.driver.device(i).is_some_and(|d| d.config.pci == wanted))
                .ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)
        })?;
        // SAFETY: `dev` is NULL or writable (driver API contract).
        Ok(unsafe { ffi::write(dev, ordinal as CUdevice) }?)
    })
}

/// The value of device attribute `attrib`: the device's own figures where the config has
/// them, typical data-centre values otherwise, 0 for known attributes not simulated, and
/// `None` (CUDA_ERROR_INVALID_VALUE) outside the enum.
pub(crate) fn attribute(d: &DeviceConfig, attrib: c_uint) -> Option<c_int> {
    let clamp = |v: u64| c_int::try_from(v).unwrap_or(c_int::MAX);
    let hopper_or_later = d.compute_capability.0 >= 9;
    let table: [(A, c_int); 40] = [
        (A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024),
        (A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, 1024),
        (A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, 1024),
        (A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, 64),
        (A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, c_int::MAX),
        (A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, 65535),
        (A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, 65535),
        (A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, 48 << 10),
        (A::CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY, 64 << 10),
        (A::CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32),
        (A::CU_DEVICE_ATTRIBUTE_MAX_PITCH, c_int::MAX),
        (A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, 65536),
        (
            A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE,
            clamp(u64::from(d.max_clock_mhz) * 1000),
        ),
        (A::CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT, 512),
        (A::CU_DEVICE_ATTRIBUTE_GPU_OVERLAP, 1),
        (
            A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            clamp(u64::from(d.sm_count)),
        ),
        (A::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 1),
        (A::CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS, 1),
        (A::CU_DEVICE_ATTRIBUTE_ECC_ENABLED, 1),
        (
            A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID,
            clamp(u64::from(d.pci.bus)),
        ),
        (
            A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID,
            clamp(u64::from(d.pci.device)),
        ),
        (
            A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID,
            clamp(u64::from(d.pci.domain)),
        ),
        (
            A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE,
            clamp(u64::from(d.memory_clock_mhz) * 1000),
        ),
        (A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, 5120),
        (
            A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE,
            if hopper_or_later { 50 << 20 } else { 40 << 20 },
        ),
        (A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 2048),
        (A::CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT, 3),
        (A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1),
        (
            A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            clamp(u64::from(d.compute_capability.0)),
        ),
        (
            A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
            clamp(u64::from(d.compute_capability.1)),
        ),
        (A::CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED, 1),
        (
            A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
            if hopper_or_later {
                228 << 10
            } else {
                164 << 10
            },
        ),
        (
            A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            if hopper_or_later {
                227 << 10
            } else {
                163 << 10
            },
        ),
        (
            A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR,
            65536,
        ),
        (A::CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 1),
        (A::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 1),
        (A::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, 1),
        (A::CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR, 32),
        (
            A::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED,
            1,
        ),
        (A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 1),
    ];
    if let Some((_, v)) = table.iter().find(|(a, _)| *a as c_uint == attrib) {
        return Some(*v);
    }
    (attrib >= 1 && attrib < A::CU_DEVICE_ATTRIBUTE_MAX as c_uint).then_some(0)
}

/// Short texts of the real driver for the common codes; the rest use cuda.h's description.
const SHORT_TEXTS: [(CUresult, &str); 14] = [
    (CUresult::CUDA_SUCCESS, "no error"),
    (CUresult::CUDA_ERROR_INVALID_VALUE, "invalid argument"),
    (CUresult::CUDA_ERROR_OUT_OF_MEMORY, "out of memory"),
    (CUresult::CUDA_ERROR_NOT_INITIALIZED, "initialization error"),
    (CUresult::CUDA_ERROR_DEINITIALIZED, "driver shutting down"),
    (
        CUresult::CUDA_ERROR_NO_DEVICE,
        "no CUDA-capable device is detected",
    ),
    (
        CUresult::CUDA_ERROR_INVALID_DEVICE,
        "invalid device ordinal",
    ),
    (
        CUresult::CUDA_ERROR_INVALID_IMAGE,
        "device kernel image is invalid",
    ),
    (
        CUresult::CUDA_ERROR_INVALID_CONTEXT,
        "invalid device context",
    ),
    (
        CUresult::CUDA_ERROR_INVALID_HANDLE,
        "invalid resource handle",
    ),
    (CUresult::CUDA_ERROR_NOT_FOUND, "named symbol not found"),
    (CUresult::CUDA_ERROR_NOT_READY, "device not ready"),
    (
        CUresult::CUDA_ERROR_NOT_SUPPORTED,
        "operation not supported",
    ),
    (CUresult::CUDA_ERROR_UNKNOWN, "unknown error"),
];

/// Static NUL-terminated copies of every name and text, built on first use.
fn c_texts() -> &'static [(u32, std::ffi::CString, std::ffi::CString)] {
    static TEXTS: std::sync::OnceLock<Vec<(u32, std::ffi::CString, std::ffi::CString)>> =
        std::sync::OnceLock::new();
    TEXTS.get_or_init(|| {
        CU_RESULTS
            .iter()
            .filter_map(|&(value, name, description)| {
                let text = SHORT_TEXTS
                    .iter()
                    .find(|(r, _)| *r as u32 == value)
                    .map_or(description, |(_, t)| t);
                Some((
                    value,
                    std::ffi::CString::new(name).ok()?,
                    std::ffi::CString::new(text).ok()?,
                ))
            })
            .collect()
    })
}

fn lookup_text(
    error: c_uint,
    out: *mut *const c_char,
    pick: fn(&(u32, std::ffi::CString, std::ffi::CString)) -> *const c_char,
) -> CuResult {
    let found = c_texts().iter().find(|t| t.0 == error).map(pick);
    // SAFETY: `out` is NULL or writable (driver API contract); the strings are 'static.
    unsafe { ffi::write(out, found.unwrap_or(std::ptr::null())) }?;
    found.map(|_| ()).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
}

/// Works before cuInit, like the real one. Unknown codes: CUDA_ERROR_INVALID_VALUE and NULL.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(error: c_uint, name: *mut *const c_char) -> CUresult {
    entry(|| lookup_text(error, name, |t| t.1.as_ptr()))
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(error: c_uint, text: *mut *const c_char) -> CUresult {
    entry(|| lookup_text(error, text, |t| t.2.as_ptr()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_bytes_from_text() {
        let b = uuid_bytes("GPU-8932f937-d72c-4106-c12f-20bd9faed9f6");
        assert_eq!(b[0], 0x89);
        assert_eq!(b[15], 0xf6);
    }

    #[test]
    fn attributes() {
        let d = crate::config::default_config().devices.remove(0);
        let get = |a: A| attribute(&d, a as c_uint);
        assert_eq!(get(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT), Some(132));
        assert_eq!(
            get(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
            Some(9)
        );
        assert_eq!(get(A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE), Some(1_980_000));
        assert_eq!(get(A::CU_DEVICE_ATTRIBUTE_TCC_DRIVER), Some(0));
        assert_eq!(attribute(&d, 0), None);
        assert_eq!(attribute(&d, A::CU_DEVICE_ATTRIBUTE_MAX as c_uint), None);
    }

    #[test]
    fn error_texts() {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: `p` is a valid out-pointer.
        unsafe {
            assert_eq!(cuGetErrorName(2, &mut p), CUresult::CUDA_SUCCESS);
            assert_eq!(
                std::ffi::CStr::from_ptr(p).to_str().unwrap(),
                "CUDA_ERROR_OUT_OF_MEMORY"
            );
            assert_eq!(cuGetErrorString(2, &mut p), CUresult::CUDA_SUCCESS);
            assert_eq!(
                std::ffi::CStr::from_ptr(p).to_str().unwrap(),
                "out of memory"
            );
            assert_eq!(
                cuGetErrorName(12345, &mut p),
                CUresult::CUDA_ERROR_INVALID_VALUE
            );
            assert!(p.is_null());
        }
    }
}
