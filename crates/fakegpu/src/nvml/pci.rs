//! PCI identity and the PCIe link: bus ids (every `nvmlDeviceGetPciInfo*` version, lookup by
//! bus id), link generation, width and speed, throughput, replay counter, bus type.
//!
//! Bus ids agree with CUDA's `cuDeviceGetPCIBusId` (both come from the config's `pci_bus`).
//! The link follows the load as on real boards: at rest it trains down to Gen 1 to save
//! power, while a kernel ran within the last second it runs at `pcie_generation`; its width
//! is always `pcie_width`. Throughput is a load-following figure (nothing is copied here):
//! `utilization × link bandwidth ÷ 16` received by the device, half that sent.

use std::ffi::{c_char, c_uint};

use nvml_wrapper_sys::bindings::{
    self as nv, nvmlBusType_t, nvmlDevice_t, nvmlPciInfoExt_t, nvmlPciInfo_t, nvmlReturn_t,
};

use super::device::{put, query, versioned};
use super::{
    device, driver, entry, handle, null_arg, NvResult, ARGUMENT_VERSION_MISMATCH, INVALID_ARGUMENT,
    NOT_FOUND,
};
use crate::config::{DeviceConfig, PciAddress};
use crate::driver::Device;
use crate::ffi::{self, now_ns};

/// Sub-system id of the board (`device << 16 | vendor`), as an SXM board of the part reports.
fn subsystem_id(c: &DeviceConfig) -> u32 {
    let board: u32 = match c.architecture {
        crate::config::Architecture::Hopper => 0x16c1,
        crate::config::Architecture::Ampere => 0x134f,
        _ => 0x1212,
    };
    (board << 16) | 0x10de
}

pub(super) fn c_chars<const N: usize>(text: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (o, b) in out.iter_mut().zip(text.bytes().take(N - 1)) {
        *o = b as c_char;
    }
    out
}

fn pci_info(d: &Device) -> nvmlPciInfo_t {
    let a = d.config.pci;
    nvmlPciInfo_t {
        busIdLegacy: c_chars(&a.bus_id_legacy()),
        domain: a.domain,
        bus: a.bus,
        device: a.device,
        pciDeviceId: d.config.pci_device_id(),
        pciSubSystemId: subsystem_id(&d.config),
        busId: c_chars(&a.bus_id()),
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    handle: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    entry(|| query(handle, pci, |d| Ok(pci_info(d))))
}

/// The structure `nvmlDeviceGetPciInfo` and `_v2` were made for (nvml.h before driver 410,
/// when `_v3` came with `busIdLegacy` and a 32-byte `busId`): a 16-byte legacy bus id, the
/// five numbers, four reserved words; 52 bytes.
#[repr(C)]
#[derive(Clone, Copy)]
struct PciInfoV1 {
    bus_id: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    reserved: [c_uint; 4],
}

/// Writes the 52-byte structure of its time and nothing past it, so that old callers' buffers
/// are safe; through nvml.h's current `nvmlPciInfo_t` that fills `busIdLegacy` and the numbers.
fn pci_info_v1(handle: nvmlDevice_t, pci: *mut nvmlPciInfo_t) -> NvResult {
    query(handle, pci.cast::<PciInfoV1>(), |d| {
        let info = pci_info(d);
        Ok(PciInfoV1 {
            bus_id: info.busIdLegacy,
            domain: info.domain,
            bus: info.bus,
            device: info.device,
            pci_device_id: info.pciDeviceId,
            pci_sub_system_id: info.pciSubSystemId,
            reserved: [0; 4],
        })
    })
}

/// See [`PciInfoV1`]: the pre-`_v3` layout.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo(
    handle: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    entry(|| pci_info_v1(handle, pci))
}

/// See [`PciInfoV1`]: the pre-`_v3` layout.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v2(
    handle: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    entry(|| pci_info_v1(handle, pci))
}

/// `pci->version` must be nvml.h's `nvmlPciInfoExt_v1`. Class 0x03/0x02: a 3D controller.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfoExt(
    handle: nvmlDevice_t,
    pci: *mut nvmlPciInfoExt_t,
) -> nvmlReturn_t {
    entry(|| {
        let d = device(handle)?;
        // SAFETY: `pci` is NULL or points to an nvmlPciInfoExt_t, whose first field is the
        // unsigned int `version` (NVML API contract).
        let version = unsafe { ffi::read(pci.cast_const().cast::<c_uint>()) }.map_err(null_arg)?;
        if version != versioned::<nvmlPciInfoExt_t>(1) {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        let info = pci_info(d);
        put(
            pci,
            nvmlPciInfoExt_t {
                version,
                domain: info.domain,
                bus: info.bus,
                device: info.device,
                pciDeviceId: info.pciDeviceId,
                pciSubSystemId: info.pciSubSystemId,
                baseClass: 0x03,
                subClass: 0x02,
                busId: info.busId,
            },
        )
    })
}

/// Either bus id form (`00000000:18:00.0`, `0000:18:00.0`, `18:00.0`), any case.
fn by_bus_id(bus_id: *const c_char, out: *mut nvmlDevice_t) -> NvResult {
    // SAFETY: `bus_id` is NULL or a C string (NVML API contract).
    let text = unsafe { ffi::c_str(bus_id) }.ok_or(INVALID_ARGUMENT)?;
    let wanted = PciAddress::parse(text).ok_or(INVALID_ARGUMENT)?;
    let index = driver()?
        .devices
        .iter()
        .position(|d| d.config.pci == wanted)
        .ok_or(NOT_FOUND)?;
    // SAFETY: `out` is NULL or writable (NVML API contract).
    unsafe { ffi::write(out, handle(index)) }.map_err(null_arg)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    entry(|| by_bus_id(bus_id, device))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(
    bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    entry(|| by_bus_id(bus_id, device))
}

/// The link generation now: the maximum while busy, Gen 1 at rest.
fn current_generation(d: &Device) -> u32 {
    if super::clocks::busy(d, now_ns()) {
        d.config.pcie_generation
    } else {
        1
    }
}

/// Per-lane transfer rate of a generation, in Mbps (nvmlDeviceGetPcieSpeed's unit).
fn lane_mbps(generation: u32) -> u32 {
    match generation {
        1 => 2_500,
        2 => 5_000,
        3 => 8_000,
        4 => 16_000,
        5 => 32_000,
        _ => 64_000,
    }
}

/// Usable bandwidth of one lane after encoding, in KB/s.
fn lane_kbps(generation: u32) -> u64 {
    match generation {
        1 => 250_000,
        2 => 500_000,
        3 => 984_600,
        4 => 1_969_200,
        5 => 3_938_400,
        _ => 7_563_000,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkGeneration(
    handle: nvmlDevice_t,
    curr_link_gen: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| query(handle, curr_link_gen, |d| Ok(current_generation(d))))
}

/// The highest generation of the GPU and the system together (the config's one value).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkGeneration(
    handle: nvmlDevice_t,
    max_link_gen: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| query(handle, max_link_gen, |d| Ok(d.config.pcie_generation)))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuMaxPcieLinkGeneration(
    handle: nvmlDevice_t,
    max_link_gen_device: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| {
        query(handle, max_link_gen_device, |d| {
            Ok(d.config.pcie_generation)
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkWidth(
    handle: nvmlDevice_t,
    curr_link_width: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| query(handle, curr_link_width, |d| Ok(d.config.pcie_width)))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkWidth(
    handle: nvmlDevice_t,
    max_link_width: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| query(handle, max_link_width, |d| Ok(d.config.pcie_width)))
}

/// Per-lane rate of the current link, Mbps.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPcieSpeed(
    handle: nvmlDevice_t,
    pcie_speed: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| query(handle, pcie_speed, |d| Ok(lane_mbps(current_generation(d)))))
}

/// `NVML_PCIE_LINK_MAX_SPEED_*` of the highest generation.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPcieLinkMaxSpeed(
    handle: nvmlDevice_t,
    max_speed: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| {
        query(handle, max_speed, |d| {
            Ok(match d.config.pcie_generation {
                1 => nv::NVML_PCIE_LINK_MAX_SPEED_2500MBPS,
                2 => nv::NVML_PCIE_LINK_MAX_SPEED_5000MBPS,
                3 => nv::NVML_PCIE_LINK_MAX_SPEED_8000MBPS,
                4 => nv::NVML_PCIE_LINK_MAX_SPEED_16000MBPS,
                5 => nv::NVML_PCIE_LINK_MAX_SPEED_32000MBPS,
                _ => nv::NVML_PCIE_LINK_MAX_SPEED_64000MBPS,
            })
        })
    })
}

/// KB/s over the last sample: `NVML_PCIE_UTIL_RX_BYTES` is utilization × link bandwidth ÷ 16,
/// `TX_BYTES` half that; an idle device moves nothing.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPcieThroughput(
    handle: nvmlDevice_t,
    counter: c_uint,
    value: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| {
        query(handle, value, |d| {
            let divisor = match counter {
                nv::nvmlPcieUtilCounter_enum_NVML_PCIE_UTIL_RX_BYTES => 16.0,
                nv::nvmlPcieUtilCounter_enum_NVML_PCIE_UTIL_TX_BYTES => 32.0,
                _ => return Err(INVALID_ARGUMENT),
            };
            let link = u64::from(d.config.pcie_width) * lane_kbps(current_generation(d));
            let kbps = d.utilization(now_ns()) * link as f64 / divisor;
            Ok(kbps.round().min(f64::from(u32::MAX)) as c_uint)
        })
    })
}

/// No link errors are simulated.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPcieReplayCounter(
    handle: nvmlDevice_t,
    value: *mut c_uint,
) -> nvmlReturn_t {
    entry(|| query(handle, value, |_| Ok(0)))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetBusType(
    handle: nvmlDevice_t,
    bus_type: *mut nvmlBusType_t,
) -> nvmlReturn_t {
    entry(|| query(handle, bus_type, |_| Ok(nv::NVML_BUS_TYPE_PCIE)))
}
