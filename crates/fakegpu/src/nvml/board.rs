//! The board: serial, VBIOS, infoROM, brand, part number, board id; its modes (power
//! management, compute, display, MIG handle, driver model) and memory interface (bus width,
//! BAR1).
//!
//! Strings come from the config (`serial`, `vbios_version`, `board_part_number`, with the
//! presets' values); the infoROM versions are those of the preset's architecture. Nothing
//! here changes at run time except BAR1 use: 1 MiB for the driver plus 2 MiB per process
//! holding a context on the device (its mappings), out of `bar1_memory`.

use std::ffi::{c_char, c_uint};

use nvml_wrapper_sys::bindings::{
    self as nv, nvmlBAR1Memory_t, nvmlBrandType_t, nvmlComputeMode_t, nvmlDevice_t,
    nvmlDriverModel_t, nvmlEnableState_t, nvmlReturn_t,
};

use super::device::{put_string, query};
use super::{entry, NvResult, NOT_SUPPORTED};
use crate::config::Architecture;
use crate::driver::Device;
use crate::state::CheckpointState;

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSerial(
    handle: nvmlDevice_t,
    serial: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    entry(|| put_string(handle, serial, length, |d| d.config.serial.clone()))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetVbiosVersion(
    handle: nvmlDevice_t,
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    entry(|| put_string(handle, version, length, |d| d.config.vbios_version.clone()))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetBoardPartNumber(
    handle: nvmlDevice_t,
    part_number: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    entry(|| {
        put_string(handle, part_number, length, |d| {
            d.config.board_part_number.clone()
        })
    })
}

/// The infoROM image of the architecture's SXM board.
fn inforom_image(d: &Device) -> &'static str {
    if d.config.architecture == Architecture::Hopper {
        "G520.0200.00.05"
    } else {
        "G506.0200.00.04"
    }
}

/// OEM and ECC objects; the power object is absent on these boards (NOT_SUPPORTED), and
/// so is the DEN object.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetInforomVersion(
    handle: nvmlDevice_t,
    object: c_uint,
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    entry(|| {
        let text = match object {
            nv::nvmlInforomObject_enum_NVML_INFOROM_OEM => "2.1",
            nv::nvmlInforomObject_enum_NVML_INFOROM_ECC => "7.0",
            nv::nvmlInforomObject_enum_NVML_INFOROM_POWER
            | nv::nvmlInforomObject_enum_NVML_INFOROM_DEN => {
                super::device(handle)?;
                return Err(NOT_SUPPORTED);
            }
            _ => {
                super::device(handle)?;
                return Err(super::INVALID_ARGUMENT);
            }
        };
        put_string(handle, version, length, |_| text.to_string())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetInforomImageVersion(
    handle: nvmlDevice_t,
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    entry(|| put_string(handle, version, length, |d| inforom_image(d).to_string()))
}

/// A checksum of the configuration: FNV-1a of the image version and serial (stable).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetInforomConfigurationChecksum(
    handle: nvmlDevice_t,
    checksum: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| {
        query(handle, checksum, |d| {
            let mut h: u32 = 0x811c_9dc5;
            for b in inforom_image(d).bytes().chain(d.config.serial.bytes()) {
                h ^= u32::from(b);
                h = h.wrapping_mul(0x0100_0193);
            }
            Ok(h)
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetBrand(
    handle: nvmlDevice_t,
    brand: *mut nvmlBrandType_t,
) -> nvmlReturn_t {
    entry(|| {
        query(handle, brand, |_| {
            Ok(nv::nvmlBrandType_enum_NVML_BRAND_NVIDIA)
        })
    })
}

/// Derived from the PCI location, as the driver does: distinct for every device.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetBoardId(
    handle: nvmlDevice_t,
    board_id: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| {
        query(handle, board_id, |d| {
            let p = d.config.pci;
            Ok((p.domain << 16) | (p.bus << 8) | (p.device << 3))
        })
    })
}

/// One GPU per board (SXM modules).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMultiGpuBoard(
    handle: nvmlDevice_t,
    multi_gpu_bool: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| query(handle, multi_gpu_bool, |_| Ok(0)))
}

/// Power management (the power limit) is always active.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementMode(
    handle: nvmlDevice_t,
    mode: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    entry(|| {
        query(handle, mode, |_| {
            Ok(nv::nvmlEnableState_enum_NVML_FEATURE_ENABLED)
        })
    })
}

/// Default: any number of processes may share the device (compute modes are not simulated).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeMode(
    handle: nvmlDevice_t,
    mode: *mut nvmlComputeMode_t,
) -> nvmlReturn_t {
    entry(|| {
        query(handle, mode, |_| {
            Ok(nv::nvmlComputeMode_enum_NVML_COMPUTEMODE_DEFAULT)
        })
    })
}

/// No display is connected to a data-centre GPU.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDisplayMode(
    handle: nvmlDevice_t,
    display: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    entry(|| {
        query(handle, display, |_| {
            Ok(nv::nvmlEnableState_enum_NVML_FEATURE_DISABLED)
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDisplayActive(
    handle: nvmlDevice_t,
    is_active: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    entry(|| {
        query(handle, is_active, |_| {
            Ok(nv::nvmlEnableState_enum_NVML_FEATURE_DISABLED)
        })
    })
}

/// Every handle is a whole GPU (MIG is not simulated).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    handle: nvmlDevice_t,
    is_mig_device: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| query(handle, is_mig_device, |_| Ok(0)))
}

/// HBM: 5120 bits on both presets' parts.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryBusWidth(
    handle: nvmlDevice_t,
    bus_width: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| query(handle, bus_width, |_| Ok(5120)))
}

/// BAR1 in use: 1 MiB plus 2 MiB per process on the device (checkpointed ones released it).
fn bar1_used(d: &Device) -> u64 {
    let processes = d
        .state
        .processes()
        .iter()
        .filter(|p| p.checkpoint != CheckpointState::Checkpointed)
        .count() as u64;
    ((1 + 2 * processes) << 20).min(d.config.bar1_memory)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetBAR1MemoryInfo(
    handle: nvmlDevice_t,
    bar1_memory: *mut nvmlBAR1Memory_t,
) -> nvmlReturn_t {
    entry(|| {
        query(handle, bar1_memory, |d| {
            let total = d.config.bar1_memory;
            let used = bar1_used(d);
            Ok(nvmlBAR1Memory_t {
                bar1Total: total,
                bar1Free: total - used,
                bar1Used: used,
            })
        })
    })
}

/// WDDM/TCC driver models are Windows's: NVML_ERROR_NOT_SUPPORTED on Linux, as the real
/// library answers there (nvitop asks at start).
fn driver_model(
    handle: nvmlDevice_t,
    current: *mut nvmlDriverModel_t,
    pending: *mut nvmlDriverModel_t,
) -> NvResult {
    super::device(handle)?;
    if current.is_null() && pending.is_null() {
        return Err(super::INVALID_ARGUMENT);
    }
    Err(NOT_SUPPORTED)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDriverModel_v2(
    handle: nvmlDevice_t,
    current: *mut nvmlDriverModel_t,
    pending: *mut nvmlDriverModel_t,
) -> nvmlReturn_t {
    entry(|| driver_model(handle, current, pending))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDriverModel(
    handle: nvmlDevice_t,
    current: *mut nvmlDriverModel_t,
    pending: *mut nvmlDriverModel_t,
) -> nvmlReturn_t {
    entry(|| driver_model(handle, current, pending))
}
