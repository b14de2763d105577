//! The attention forward template (`ExternCall::Attention` on CUDA): a FlashAttention-2-style
//! kernel, so the `[*batch, L, S]` scores never exist in memory.
//!
//! * **f16 / bf16 on sm_80 and newer** ([`AttentionKernel::Mma`], `coil_attention_mma_*`): a
//!   block of 4 warps takes 64 query rows of one batch index (16 rows per warp, their Q
//!   fragments kept in registers) and walks the keys in blocks of 64 (for causal attention only
//!   up to the diagonal block, masked inside it). K and V tiles are staged in shared memory by
//!   `cp.async` (16-byte copies, rows padded by 16 bytes so `ldmatrix` is conflict-free); V's
//!   copy overlaps `S = Q K^T` and the next K's copy overlaps the softmax and `P V`. Both
//!   products run on tensor cores (`mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}`, f32
//!   accumulators); the online softmax works on the accumulator fragments in f32 (row max and
//!   sum across the 4 threads of a quad by shuffles, `exp2` with the scale folded into
//!   `log2(e)`); P is converted to A fragments in registers; at the end `O / l` is rounded once
//!   and stored through the output's strides, and, when a backward needs it, the row
//!   logsumexp `(max + log2(l)) ln 2` in f32. The head dim is a template parameter padded to a
//!   multiple of 16 (16..128; the padding reads as zeros). Operands must be 16-byte aligned
//!   rows with unit column stride ([`mma_reads`]), the output 4-byte aligned pairs
//!   ([`mma_writes`]).
//! * **f32, and any dtype before sm_80** ([`AttentionKernel::Simple`],
//!   `coil_attention_simple_*`): one thread per query row, keys and values staged in shared
//!   memory as f32, the same online softmax, any strides. Not tensor-core speed, but no `[L, S]`
//!   scores either.
//!
//! One module per variant (dtype, padded head dim). Entry points (all variants):
//!
//! ```text
//! extern "C" __global__ void coil_attention_{mma,simple}_{bf16,f16,f32}_d{16,32,..,128}(
//!     const T *q, const T *k, const T *v, T *o, float *lse /* or null */, CoilAttnParams p)
//! grid (batch indices, ceil(L / 64)), block 128 (mma) or 64 (simple) threads, no dynamic
//! shared memory; query blocks run last-first, so causal blocks with the most keys start first.
//! ```

use coil_ir::{DType, Error, Result};

/// What the forward and backward kernels share (helpers, the operand struct, the PTX wrappers).
pub const COMMON_SOURCE: &str = include_str!("attention_common.cuh");

/// The forward kernels.
pub const FORWARD_SOURCE: &str = include_str!("attention_forward.cu");

/// Query rows (and keys) per block of the tensor-core kernels; query rows per block of the
/// simple ones.
pub const BLOCK_ROWS: usize = 64;

/// The largest head dim the kernels run (a query row block stays in registers).
pub const MAX_HEAD_DIM: usize = 128;

/// The kernel argument `CoilAttnOperand`, laid out as the C struct: element
/// `(b, h, row, col)` of an operand with batch dims `[B, H]` is at
/// `offset + b*outer + h*inner + row*row + col*col`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AttnOperand {
    /// Element offset of the first element.
    pub offset: i64,
    /// Stride of the outer batch dim (0 with one batch dim).
    pub outer: i64,
    /// Stride of the inner batch dim (the heads).
    pub inner: i64,
    /// Row stride.
    pub row: i64,
    /// Column stride (1 for the tensor-core kernels).
    pub col: i64,
}

impl AttnOperand {
    /// The operand of a view with at most 2 batch dims (`None` with more).
    pub fn new(offset: usize, batch_strides: &[usize], row: usize, col: usize) -> Option<AttnOperand> {
        let (outer, inner) = match *batch_strides {
            [] => (0, 0),
            [inner] => (0, inner),
            [outer, inner] => (outer, inner),
            _ => return None,
        };
        let i = |x: usize| x as i64;
        Some(AttnOperand { offset: i(offset), outer: i(outer), inner: i(inner), row: i(row), col: i(col) })
    }
}

/// The kernel argument `CoilAttnParams`, laid out as the C struct.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AttnParams {
    /// Queries, keys, values and the output.
    pub q: AttnOperand,
    pub k: AttnOperand,
    pub v: AttnOperand,
    pub o: AttnOperand,
    /// Inner batch dim's size: block `x` is batch index `(x / heads, x % heads)`.
    pub heads: i32,
    /// Query rows, keys, head dim.
    pub l: i32,
    pub s: i32,
    pub d: i32,
    /// `scale * log2(e)`.
    pub scale_log2: f32,
    /// 1 for causal attention.
    pub causal: i32,
}

/// Which forward kernel runs a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionKernel {
    /// The tensor-core kernel (f16 / bf16 on sm_80+): `bf16` or f16, head dim padded to `dp`.
    Mma { bf16: bool, dp: usize },
    /// The one-row-per-thread kernel: `dtype` f32, f16 or bf16, head dim padded to `dp`.
    Simple { dtype: DType, dp: usize },
}

/// The tensor-core kind for f16 / bf16 on sm_80+ with whole 16-byte chunks per row (a multiple
/// of 8 elements: the copies never pass a row's end), else the simple kind; `(bf16?, padded
/// head dim)` or `(dtype, padded head dim)`. An error for what no kernel runs.
pub(crate) fn choose_kind(what: &str, dtype: DType, d: usize, sm_major: u32) -> Result<(Option<bool>, usize)> {
    if d == 0 || d > MAX_HEAD_DIM {
        return Err(Error::unsupported(format!("{what} with head dim {d} on CUDA (1 to {MAX_HEAD_DIM})")));
    }
    let dp = d.div_ceil(16) * 16;
    match dtype {
        DType::F16 | DType::BF16 if sm_major >= 8 && d.is_multiple_of(8) => Ok((Some(dtype == DType::BF16), dp)),
        DType::F16 | DType::BF16 | DType::F32 => Ok((None, dp)),
        _ => Err(Error::unsupported(format!("{what} of {dtype} values on CUDA"))),
    }
}

/// The simple kernels' element kind: 0 f32, 1 f16, 2 bf16.
pub(crate) fn element_kind(dtype: DType) -> u32 {
    match dtype {
        DType::F16 => 1,
        DType::BF16 => 2,
        _ => 0,
    }
}

impl AttentionKernel {
    /// The kernel for `dtype` and head dim `d` on a device of compute capability major
    /// `sm_major`; an error for what no kernel runs.
    pub fn choose(dtype: DType, d: usize, sm_major: u32) -> Result<AttentionKernel> {
        Ok(match choose_kind("attention", dtype, d, sm_major)? {
            (Some(bf16), dp) => AttentionKernel::Mma { bf16, dp },
            (None, dp) => AttentionKernel::Simple { dtype, dp },
        })
    }

    /// The entry point's name, e.g. `coil_attention_mma_bf16_d64`.
    pub fn name(self) -> String {
        match self {
            AttentionKernel::Mma { bf16, dp } => {
                format!("coil_attention_mma_{}_d{dp}", if bf16 { "bf16" } else { "f16" })
            }
            AttentionKernel::Simple { dtype, dp } => format!("coil_attention_simple_{dtype}_d{dp}"),
        }
    }

    /// The variant's whole translation unit: the shared helpers, the kernels, one line
    /// instantiating the entry point.
    pub fn source(self) -> String {
        let entry = match self {
            AttentionKernel::Mma { bf16, dp } => format!("COIL_ATTENTION_MMA({}, {dp}, {bf16})\n", self.name()),
            AttentionKernel::Simple { dtype, dp } => {
                format!("COIL_ATTENTION_SIMPLE({}, {dp}, {})\n", self.name(), element_kind(dtype))
            }
        };
        format!("{COMMON_SOURCE}\n{FORWARD_SOURCE}\n{entry}")
    }

    /// The simple variant of the same dtype and head dim (for outputs the tensor-core kernel
    /// cannot write).
    pub fn simple(self, dtype: DType) -> AttentionKernel {
        match self {
            AttentionKernel::Mma { dp, .. } | AttentionKernel::Simple { dp, .. } => {
                AttentionKernel::Simple { dtype, dp }
            }
        }
    }

    /// Threads per block.
    pub fn block(self) -> u32 {
        match self {
            AttentionKernel::Mma { .. } => 128,
            AttentionKernel::Simple { .. } => 64,
        }
    }

    /// The grid for `batch` batch indices and `l` query rows: one block per (batch index,
    /// block of 64 query rows).
    pub fn grid(batch: usize, l: usize) -> (u32, u32, u32) {
        (batch as u32, l.div_ceil(BLOCK_ROWS) as u32, 1)
    }
}

/// Whether a tensor-core kernel reads an operand in place: unit column stride (or one column)
/// and every row start 16-byte aligned (element offset and strides multiples of 8 elements of 2
/// bytes from a 16-byte aligned base address). Else it is gathered into a contiguous copy first.
pub fn mma_reads(base: u64, offset: usize, batch_strides: &[usize], row: usize, col: usize, d: usize) -> bool {
    (col == 1 || d == 1) && base.is_multiple_of(16) && [offset, row].iter().chain(batch_strides).all(|x| x % 8 == 0)
}

/// Whether a tensor-core kernel writes an output in place: it stores pairs of elements, so unit
/// column stride (or one column) and 4-byte aligned pairs. Else the simple kernel runs.
pub fn mma_writes(base: u64, offset: usize, batch_strides: &[usize], row: usize, col: usize, d: usize) -> bool {
    (col == 1 || d == 1) && base.is_multiple_of(4) && [offset, row].iter().chain(batch_strides).all(|x| x % 2 == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_by_dtype_head_dim_and_architecture() {
        assert_eq!(AttentionKernel::choose(DType::BF16, 64, 9).unwrap(), AttentionKernel::Mma { bf16: true, dp: 64 });
        assert_eq!(AttentionKernel::choose(DType::F16, 40, 8).unwrap(), AttentionKernel::Mma { bf16: false, dp: 48 });
        let simple = |dtype, dp| AttentionKernel::Simple { dtype, dp };
        assert_eq!(AttentionKernel::choose(DType::BF16, 64, 7).unwrap(), simple(DType::BF16, 64));
        assert_eq!(AttentionKernel::choose(DType::F32, 8, 9).unwrap(), simple(DType::F32, 16));
        assert!(AttentionKernel::choose(DType::F64, 64, 9).is_err());
        assert!(AttentionKernel::choose(DType::BF16, 136, 9).is_err());
        let v = AttentionKernel::Mma { bf16: true, dp: 64 };
        assert_eq!(v.name(), "coil_attention_mma_bf16_d64");
        assert!(v.source().ends_with("COIL_ATTENTION_MMA(coil_attention_mma_bf16_d64, 64, true)\n"));
        assert_eq!(simple(DType::F32, 32).name(), "coil_attention_simple_f32_d32");
        assert_eq!(AttentionKernel::grid(6, 130), (6, 3, 1));
    }

    #[test]
    fn params_are_laid_out_as_the_c_struct() {
        // Four operands of five i64, then six 4-byte fields: 184 bytes, 8-aligned.
        assert_eq!(std::mem::size_of::<AttnOperand>(), 40);
        assert_eq!(std::mem::size_of::<AttnParams>(), 184);
        assert_eq!(std::mem::offset_of!(AttnParams, heads), 160);
        assert_eq!(std::mem::offset_of!(AttnParams, causal), 180);
    }

    #[test]
    fn head_views_are_read_in_place() {
        // q of GPT-2's QKV output [B, T, 3C] viewed [B, H, T, D]: strides [T*3C, D, 3C, 1].
        let (t, c, d) = (1024, 768, 64);
        assert!(mma_reads(256, c, &[t * 3 * c, d], 3 * c, 1, d));
        assert!(!mma_reads(256, 4, &[t * 3 * c, d], 3 * c, 1, d));
        assert!(!mma_reads(256, c, &[t * 3 * c, d], 1, 3 * c, d));
        assert!(mma_writes(256, 2, &[t * c, d], c, 1, d) && !mma_writes(256, 1, &[t * c, d], c, 1, d));
        let op = AttnOperand::new(c, &[t * 3 * c, d], 3 * c, 1).unwrap();
        assert_eq!(op, AttnOperand { offset: 768, outer: 2359296, inner: 64, row: 2304, col: 1 });
        assert!(AttnOperand::new(0, &[1, 2, 3], 4, 1).is_none());
    }
}
