//! The strided gather template (`gather.cu`): copies any strided view of up to [`MAX_DIMS`]
//! dims (size-1 dims dropped) into a contiguous buffer, one kernel per element size (1, 2, 4, 8
//! bytes), launched grid-stride ([`super::grid_stride_launch`]) over the elements. cuBLASLt
//! takes a matrix only as a leading dimension plus a transpose flag, and its bias epilogue only
//! a contiguous vector; the runtime (`coil_runtime::cuda::gather`) gathers the few views that
//! are not expressible so, and the attention template's operands that its tensor-core kernels
//! cannot read in place.
//!
//! Kernel signature: `(const T *src, T *dst, long long n, int ndim, CoilDims d)`, `src` already
//! at the view's offset; 32-bit index arithmetic below `2^31` elements.
//!
//! `coil_copy_batch(CoilCopyBatch c)` copies up to [`COPY_BATCH`] contiguous buffers in one
//! launch, one block of [`COPY_BATCH_BLOCK`] threads per copy: a replayed CUDA graph's inputs
//! that are copied into the graph's own buffers before each launch, one launch instead of one
//! `cuMemcpyDtoDAsync` per input (each of those costs the host several microseconds). Meant for
//! small copies ([`COPY_BATCH_MAX_BYTES`] each at most); larger ones are plain copies.

/// The CUDA C of every kernel of the template.
pub const SOURCE: &str = include_str!("gather.cu");

/// Most dims a gather handles (after dropping size-1 dims).
pub const MAX_DIMS: usize = 8;

/// The kernels' `CoilDims` argument, laid out as the C struct: the view's sizes and strides
/// (in elements), outermost first; unused dims size 1.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GatherDims {
    /// Sizes of the dims.
    pub size: [i64; MAX_DIMS],
    /// Strides of the dims, in elements.
    pub stride: [i64; MAX_DIMS],
}

/// Most copies one `coil_copy_batch` launch makes.
pub const COPY_BATCH: usize = 8;

/// Threads of each block of `coil_copy_batch` (a block per copy).
pub const COPY_BATCH_BLOCK: u32 = 256;

/// The largest copy `coil_copy_batch` takes: one block moves it in a few dozen 2 KiB strides.
pub const COPY_BATCH_MAX_BYTES: usize = 64 << 10;

/// The batched copy kernel's name.
pub const COPY_BATCH_KERNEL: &str = "coil_copy_batch";

/// `coil_copy_batch`'s argument, laid out as the C struct `CoilCopyBatch`: destination and
/// source addresses and byte counts; entries past the launch's grid are not read.
///
/// ```
/// use coil_codegen::templates::gather::{CopyBatch, COPY_BATCH};
/// let mut b = CopyBatch::default();
/// b.dst[0] = 0x1000;
/// b.src[0] = 0x2000;
/// b.bytes[0] = 8;
/// assert_eq!(std::mem::size_of::<CopyBatch>(), 3 * 8 * COPY_BATCH);
/// ```
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyBatch {
    /// Destination device addresses.
    pub dst: [u64; COPY_BATCH],
    /// Source device addresses.
    pub src: [u64; COPY_BATCH],
    /// Bytes of each copy.
    pub bytes: [i64; COPY_BATCH],
}

/// The kernel for elements of `bytes` bytes, if there is one.
///
/// ```
/// use coil_codegen::templates::gather::kernel;
/// assert_eq!(kernel(2), Some("coil_gather_2"));
/// assert_eq!(kernel(16), None);
/// ```
pub fn kernel(bytes: usize) -> Option<&'static str> {
    Some(match bytes {
        1 => "coil_gather_1",
        2 => "coil_gather_2",
        4 => "coil_gather_4",
        8 => "coil_gather_8",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_is_in_the_source_and_the_dims_match_the_c_struct() {
        for bytes in [1, 2, 4, 8] {
            assert!(SOURCE.contains(&format!("COIL_GATHER({},", kernel(bytes).unwrap())), "{bytes}");
        }
        assert!(SOURCE
            .contains(&format!("struct CoilDims {{ long long size[{MAX_DIMS}]; long long stride[{MAX_DIMS}]; }};")));
        assert_eq!(std::mem::size_of::<GatherDims>(), 2 * 8 * MAX_DIMS);
        assert!(SOURCE.contains(&format!("#define COIL_COPY_BATCH {COPY_BATCH}\n")));
        assert!(SOURCE.contains(&format!("__global__ void {COPY_BATCH_KERNEL}(CoilCopyBatch c)")));
    }
}
