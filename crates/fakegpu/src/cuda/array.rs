//! CUDA arrays: cuArrayCreate, cuArray3DCreate, cuMipmappedArrayCreate and their destroys.
//!
//! An array is charged `width × max(height, 1) × max(depth, 1) × channels × element size`
//! bytes; a mipmapped array the sum of its levels, each level halving every non-zero
//! dimension (not the layer count of a layered array) down to 1. Formats with a
//! per-channel element size are simulated; block-compressed and YUV formats are refused
//! with CUDA_ERROR_INVALID_VALUE.

use std::ffi::c_uint;

use cudarc::driver::sys::{
    CUarray, CUarray_format as F, CUmipmappedArray, CUresult, CUDA_ARRAY3D_DESCRIPTOR,
    CUDA_ARRAY3D_LAYERED, CUDA_ARRAY_DESCRIPTOR,
};

use super::process::{self, Alloc};
use super::{entry, CuResult};
use crate::ffi;

/// Bytes per channel of `format` (a raw CUarray_format value).
fn element_size(format: u32) -> Option<u64> {
    let sizes: [(F, u64); 20] = [
        (F::CU_AD_FORMAT_UNSIGNED_INT8, 1),
        (F::CU_AD_FORMAT_SIGNED_INT8, 1),
        (F::CU_AD_FORMAT_UNSIGNED_INT16, 2),
        (F::CU_AD_FORMAT_SIGNED_INT16, 2),
        (F::CU_AD_FORMAT_HALF, 2),
        (F::CU_AD_FORMAT_UNSIGNED_INT32, 4),
        (F::CU_AD_FORMAT_SIGNED_INT32, 4),
        (F::CU_AD_FORMAT_FLOAT, 4),
        (F::CU_AD_FORMAT_UNORM_INT8X1, 1),
        (F::CU_AD_FORMAT_UNORM_INT8X2, 1),
        (F::CU_AD_FORMAT_UNORM_INT8X4, 1),
        (F::CU_AD_FORMAT_SNORM_INT8X1, 1),
        (F::CU_AD_FORMAT_SNORM_INT8X2, 1),
        (F::CU_AD_FORMAT_SNORM_INT8X4, 1),
        (F::CU_AD_FORMAT_UNORM_INT16X1, 2),
        (F::CU_AD_FORMAT_UNORM_INT16X2, 2),
        (F::CU_AD_FORMAT_UNORM_INT16X4, 2),
        (F::CU_AD_FORMAT_SNORM_INT16X1, 2),
        (F::CU_AD_FORMAT_SNORM_INT16X2, 2),
        (F::CU_AD_FORMAT_SNORM_INT16X4, 2),
    ];
    sizes
        .iter()
        .find(|(f, _)| *f as u32 == format)
        .map(|(_, s)| *s)
}

/// What an array descriptor says, with the format as a raw integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    pub width: u64,
    pub height: u64,
    pub depth: u64,
    pub format: u32,
    pub channels: u32,
    pub layered: bool,
}

impl Shape {
    fn bytes_per_element(&self) -> CuResult<u64> {
        if self.width == 0 || ![1, 2, 4].contains(&self.channels) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let size = element_size(self.format).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        Ok(size * u64::from(self.channels))
    }

    /// Bytes of the array (level 0).
    pub(crate) fn bytes(&self) -> CuResult<u64> {
        self.level_bytes(0)
    }

    /// Bytes of mipmap level `level`.
    fn level_bytes(&self, level: u32) -> CuResult<u64> {
        let shrink = |v: u64| {
            if v == 0 {
                1
            } else {
                (v >> level.min(63)).max(1)
            }
        };
        let depth = if self.layered {
            self.depth.max(1)
        } else {
            shrink(self.depth)
        };
        [
            shrink(self.width),
            shrink(self.height),
            depth,
            self.bytes_per_element()?,
        ]
        .into_iter()
        .try_fold(1u64, u64::checked_mul)
        .ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
    }

    /// Bytes of a mipmapped array with `levels` levels.
    pub(crate) fn mipmapped_bytes(&self, levels: u32) -> CuResult<u64> {
        if levels == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        (0..levels).try_fold(0u64, |sum, level| {
            sum.checked_add(self.level_bytes(level)?)
                .ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
        })
    }
}

/// # Safety
/// `desc` is non-NULL and points to a CUDA_ARRAY_DESCRIPTOR.
unsafe fn shape_2d(desc: *const CUDA_ARRAY_DESCRIPTOR) -> Shape {
    // SAFETY: by this function's contract; the enum field is read as a raw integer.
    unsafe {
        Shape {
            width: std::ptr::addr_of!((*desc).Width).read_unaligned() as u64,
            height: std::ptr::addr_of!((*desc).Height).read_unaligned() as u64,
            depth: 0,
            format: ffi::read_enum(std::ptr::addr_of!((*desc).Format)),
            channels: std::ptr::addr_of!((*desc).NumChannels).read_unaligned(),
            layered: false,
        }
    }
}

/// # Safety
/// `desc` is non-NULL and points to a CUDA_ARRAY3D_DESCRIPTOR.
unsafe fn shape_3d(desc: *const CUDA_ARRAY3D_DESCRIPTOR) -> Shape {
    // SAFETY: by this function's contract; the enum field is read as a raw integer.
    unsafe {
        let flags: c_uint = std::ptr::addr_of!((*desc).Flags).read_unaligned();
        Shape {
            width: std::ptr::addr_of!((*desc).Width).read_unaligned() as u64,
            height: std::ptr::addr_of!((*desc).Height).read_unaligned() as u64,
            depth: std::ptr::addr_of!((*desc).Depth).read_unaligned() as u64,
            format: ffi::read_enum(std::ptr::addr_of!((*desc).Format)),
            channels: std::ptr::addr_of!((*desc).NumChannels).read_unaligned(),
            layered: flags & CUDA_ARRAY3D_LAYERED != 0,
        }
    }
}

/// Charge `bytes` to the current context and register a handle in `pick`'s map.
fn create(bytes: u64, mipmapped: bool) -> CuResult<u64> {
    process::with(|p| {
        let (ctx, context) = p.current_ctx()?;
        let device = context.device;
        p.charge(device, bytes)?;
        let handle = p.new_handle();
        let map = if mipmapped {
            &mut p.mipmaps
        } else {
            &mut p.arrays
        };
        map.insert(
            handle,
            Alloc {
                device,
                size: bytes,
                ctx,
                managed: false,
                pool: 0,
                id: 0,
            },
        );
        Ok(handle)
    })
}

fn destroy(handle: u64, mipmapped: bool) -> CuResult {
    process::with(|p| {
        let map = if mipmapped {
            &mut p.mipmaps
        } else {
            &mut p.arrays
        };
        let alloc = map
            .remove(&handle)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        p.uncharge(alloc.device, alloc.size);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuArrayCreate_v2(
    array: *mut CUarray,
    desc: *const CUDA_ARRAY_DESCRIPTOR,
) -> CUresult {
    entry(|| {
        if array.is_null() || desc.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `desc` is non-NULL and points to a descriptor (driver API contract).
        let bytes = unsafe { shape_2d(desc) }.bytes()?;
        let handle = create(bytes, false)?;
        // SAFETY: `array` is non-NULL and writable (driver API contract).
        Ok(unsafe { ffi::write(array, handle as usize as CUarray) }?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    array: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
) -> CUresult {
    entry(|| {
        if array.is_null() || desc.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `desc` is non-NULL and points to a descriptor (driver API contract).
        let bytes = unsafe { shape_3d(desc) }.bytes()?;
        let handle = create(bytes, false)?;
        // SAFETY: `array` is non-NULL and writable (driver API contract).
        Ok(unsafe { ffi::write(array, handle as usize as CUarray) }?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuArrayDestroy(array: CUarray) -> CUresult {
    entry(|| destroy(array as u64, false))
}

#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    array: *mut CUmipmappedArray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
    levels: c_uint,
) -> CUresult {
    entry(|| {
        if array.is_null() || desc.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `desc` is non-NULL and points to a descriptor (driver API contract).
        let bytes = unsafe { shape_3d(desc) }.mipmapped_bytes(levels)?;
        let handle = create(bytes, true)?;
        // SAFETY: `array` is non-NULL and writable (driver API contract).
        Ok(unsafe { ffi::write(array, handle as usize as CUmipmappedArray) }?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(array: CUmipmappedArray) -> CUresult {
    entry(|| destroy(array as u64, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(width: u64, height: u64, depth: u64, format: F, channels: u32) -> Shape {
        Shape {
            width,
            height,
            depth,
            format: format as u32,
            channels,
            layered: false,
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(shape(100, 0, 0, F::CU_AD_FORMAT_FLOAT, 1).bytes(), Ok(400));
        assert_eq!(shape(100, 10, 0, F::CU_AD_FORMAT_HALF, 4).bytes(), Ok(8000));
        assert_eq!(
            shape(8, 8, 8, F::CU_AD_FORMAT_UNSIGNED_INT8, 2).bytes(),
            Ok(1024)
        );
        assert_eq!(
            shape(8, 8, 0, F::CU_AD_FORMAT_FLOAT, 3).bytes(),
            Err(CUresult::CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(
            shape(0, 8, 0, F::CU_AD_FORMAT_FLOAT, 1).bytes(),
            Err(CUresult::CUDA_ERROR_INVALID_VALUE)
        );
        let bc1 = Shape {
            format: F::CU_AD_FORMAT_BC1_UNORM as u32,
            ..shape(8, 8, 0, F::CU_AD_FORMAT_FLOAT, 4)
        };
        assert_eq!(bc1.bytes(), Err(CUresult::CUDA_ERROR_INVALID_VALUE));
    }

    #[test]
    fn mipmaps_sum_their_levels() {
        // 8x8 float: 64 + 16 + 4 + 1 texels.
        assert_eq!(
            shape(8, 8, 0, F::CU_AD_FORMAT_FLOAT, 1).mipmapped_bytes(4),
            Ok((64 + 16 + 4 + 1) * 4)
        );
        // Layered: the layer count does not shrink.
        let layered = Shape {
            layered: true,
            ..shape(4, 4, 3, F::CU_AD_FORMAT_UNSIGNED_INT8, 1)
        };
        assert_eq!(layered.mipmapped_bytes(2), Ok(16 * 3 + 4 * 3));
        assert_eq!(
            layered.mipmapped_bytes(0),
            Err(CUresult::CUDA_ERROR_INVALID_VALUE)
        );
    }
}
