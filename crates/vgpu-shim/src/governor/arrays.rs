//! Bytes a CUDA array counts, from its descriptor: width × max(height, 1) × max(depth, 1) ×
//! channels × bytes per channel; a mipmapped array the sum of its levels, each halving every
//! non-zero extent (not the layer count of a layered array) down to 1. Block-compressed
//! formats count their 4×4 blocks, NV12 1.5 bytes per pixel. The driver may pad arrays
//! further (tiling); that padding is the driver's and is not counted.

use crate::ffi::*;

/// The extents and format of an array, the format as its raw `CUarray_format` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub width: u64,
    pub height: u64,
    pub depth: u64,
    pub format: u32,
    pub channels: u32,
    pub layered: bool,
}

/// Bits per pixel of a whole-pixel format family: (format values, bits per channel).
const PER_CHANNEL: &[(&[u32], u64)] = &[
    // UNSIGNED_INT8, SIGNED_INT8, UNORM_INT8X1/2/4, SNORM_INT8X1/2/4
    (&[0x01, 0x08, 0xc0, 0xc1, 0xc2, 0xc6, 0xc7, 0xc8], 8),
    // UNSIGNED_INT16, SIGNED_INT16, HALF, UNORM_INT16X1/2/4, SNORM_INT16X1/2/4
    (&[0x02, 0x09, 0x10, 0xc3, 0xc4, 0xc5, 0xc9, 0xca, 0xcb], 16),
    // UNSIGNED_INT32, SIGNED_INT32, FLOAT
    (&[0x03, 0x0a, 0x20], 32),
];
/// BC1 and BC4: 8 bytes per 4×4 block.
const BC_8_BYTE_BLOCKS: &[u32] = &[0x91, 0x92, 0x97, 0x98];
/// BC2, BC3, BC5, BC6H, BC7: 16 bytes per 4×4 block.
const BC_16_BYTE_BLOCKS: &[u32] = &[0x93, 0x94, 0x95, 0x96, 0x99, 0x9a, 0x9b, 0x9c, 0x9d, 0x9e];
const NV12: u32 = 0xb0;

impl Shape {
    /// # Safety
    /// `desc` points to a readable CUDA_ARRAY_DESCRIPTOR.
    pub unsafe fn of_2d(desc: *const CUDA_ARRAY_DESCRIPTOR) -> Shape {
        // SAFETY: by the contract; the enum field is read as its raw 32-bit value.
        unsafe {
            Shape {
                width: std::ptr::addr_of!((*desc).Width).read_unaligned() as u64,
                height: std::ptr::addr_of!((*desc).Height).read_unaligned() as u64,
                depth: 0,
                format: std::ptr::addr_of!((*desc).Format).cast::<u32>().read_unaligned(),
                channels: std::ptr::addr_of!((*desc).NumChannels).read_unaligned(),
                layered: false,
            }
        }
    }

    /// # Safety
    /// `desc` points to a readable CUDA_ARRAY3D_DESCRIPTOR.
    pub unsafe fn of_3d(desc: *const CUDA_ARRAY3D_DESCRIPTOR) -> Shape {
        // SAFETY: by the contract; the enum field is read as its raw 32-bit value.
        unsafe {
            Shape {
                width: std::ptr::addr_of!((*desc).Width).read_unaligned() as u64,
                height: std::ptr::addr_of!((*desc).Height).read_unaligned() as u64,
                depth: std::ptr::addr_of!((*desc).Depth).read_unaligned() as u64,
                format: std::ptr::addr_of!((*desc).Format).cast::<u32>().read_unaligned(),
                channels: std::ptr::addr_of!((*desc).NumChannels).read_unaligned(),
                layered: std::ptr::addr_of!((*desc).Flags).read_unaligned() & CUDA_ARRAY3D_LAYERED != 0,
            }
        }
    }

    /// Bytes of level 0; `None` for a shape the driver will refuse (or an unknown format,
    /// which is then not counted: the driver refuses what it does not know).
    pub fn bytes(&self) -> Option<u64> {
        self.level_bytes(0)
    }

    /// Bytes of a mipmapped array of `levels` levels.
    pub fn mipmapped_bytes(&self, levels: u32) -> Option<u64> {
        (0..levels.max(1)).try_fold(0u64, |sum, level| sum.checked_add(self.level_bytes(level)?))
    }

    fn level_bytes(&self, level: u32) -> Option<u64> {
        let shrink = |v: u64| if v == 0 { 1 } else { (v >> level.min(63)).max(1) };
        let (w, h) = (shrink(self.width), shrink(self.height));
        let d = if self.layered {
            self.depth.max(1)
        } else {
            shrink(self.depth)
        };
        let planes = h.checked_mul(d)?;
        if let Some(bits) = PER_CHANNEL
            .iter()
            .find(|(f, _)| f.contains(&self.format))
            .map(|(_, b)| *b)
        {
            let pixel_bits = bits.checked_mul(u64::from(self.channels))?;
            return w.checked_mul(planes)?.checked_mul(pixel_bits).map(|b| b / 8);
        }
        let blocks = |v: u64| v.div_ceil(4);
        let block_bytes = if BC_8_BYTE_BLOCKS.contains(&self.format) {
            8
        } else if BC_16_BYTE_BLOCKS.contains(&self.format) {
            16
        } else if self.format == NV12 {
            // Luma plane plus half-height interleaved chroma.
            return w.checked_mul(h)?.checked_mul(3).map(|b| b / 2)?.checked_mul(d);
        } else {
            return None;
        };
        blocks(w)
            .checked_mul(blocks(h))?
            .checked_mul(d)?
            .checked_mul(block_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(width: u64, height: u64, depth: u64, format: u32, channels: u32, layered: bool) -> Shape {
        Shape {
            width,
            height,
            depth,
            format,
            channels,
            layered,
        }
    }

    #[test]
    fn plain_formats() {
        // FLOAT × 4 channels, 100 × 50.
        assert_eq!(shape(100, 50, 0, 0x20, 4, false).bytes(), Some(100 * 50 * 16));
        // 1D UNSIGNED_INT8 × 1: height 0 counts as 1.
        assert_eq!(shape(1000, 0, 0, 0x01, 1, false).bytes(), Some(1000));
        // HALF × 2, 3D.
        assert_eq!(shape(8, 8, 8, 0x10, 2, false).bytes(), Some(8 * 8 * 8 * 4));
    }

    #[test]
    fn compressed_and_unknown() {
        assert_eq!(shape(16, 16, 0, 0x91, 1, false).bytes(), Some(16 * 8)); // BC1: 4×4 blocks of 8 B
        assert_eq!(shape(5, 5, 0, 0x9d, 1, false).bytes(), Some(4 * 16)); // BC7, partial blocks
        assert_eq!(shape(64, 32, 0, 0xb0, 1, false).bytes(), Some(64 * 32 * 3 / 2));
        assert_eq!(shape(64, 32, 0, 0x77, 1, false).bytes(), None);
    }

    #[test]
    fn mipmaps_halve_but_not_layers() {
        let s = shape(64, 16, 0, 0x01, 1, false);
        // 64×16, 32×8, 16×4, 8×2
        assert_eq!(s.mipmapped_bytes(4), Some(1024 + 256 + 64 + 16));
        let layered = shape(8, 8, 3, 0x01, 1, true);
        assert_eq!(layered.mipmapped_bytes(2), Some(8 * 8 * 3 + 4 * 4 * 3));
        let volume = shape(8, 8, 8, 0x01, 1, false);
        assert_eq!(volume.mipmapped_bytes(2), Some(512 + 64));
    }

    #[test]
    fn overflow_is_none() {
        assert_eq!(shape(u64::MAX, 2, 0, 0x20, 4, false).bytes(), None);
    }
}
