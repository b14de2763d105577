//! The attention backward template (`ExternCall::AttentionBackward` on CUDA): FlashAttention-2's
//! backward, the probabilities recomputed from the logsumexp the forward saved, so the
//! `[*batch, L, S]` scores and probabilities never exist in memory.
//!
//! One launch; the grid's y dim holds two kinds of blocks, each of one batch index:
//!
//! * **dK, dV blocks** (the first [`key blocks`](backward_grid)): 64 keys each, walking the
//!   query blocks that see them (causal: from the diagonal block on). Per query block: `S^T =
//!   K Q^T`, `P^T = exp2(S^T scale log2(e) - lse log2(e))` (0 where masked), `dV += P^T dO`,
//!   `dP^T = V dO^T`, `dS^T = P^T (dP^T - delta)`, `dK += dS^T Q`; dK is scaled at the end.
//! * **dQ blocks**: 64 query rows each, walking the key blocks they see (causal: up to the
//!   diagonal block): `S`, `P`, `dP = dO V^T`, `dS`, `dQ += dS K`, scaled at the end.
//!
//! An explicit mask (bool, or added to the scores; [`AttnBwdParams::mask`]) is read per element
//! by the forward's routine (`coil_mask_at`): `S` gets its term and `P` is 0 where it drops the
//! key, so a row that keeps no key (logsumexp `-inf`) has zero gradients, as PyTorch's. The
//! tensor-core blocks skip the products of a 64 x 64 tile the mask drops whole (a block-wide
//! vote, as the forward's), so a padding mask's keys cost their tiles' loads only.
//!
//! No block writes what another writes, so there are no atomics and results repeat exactly; the
//! price is that `S` and `dP` are computed twice (7 products of `L x S x D` where FlashAttention-2
//! with atomic dQ has 5). `delta = rowsum(dO * O)` (f32, `[*batch, L]`) is computed before by a
//! kernel of its own ([`AttentionDeltaKernel`]: one warp per query row, the output and its
//! gradient read through their strides), as FlashAttention's preprocessing kernel does, into a
//! temporary the backward reads.
//!
//! * **f16 / bf16 on sm_80 and newer** ([`AttentionBackwardKernel::Mma`],
//!   `coil_attention_bwd_mma_*`): 4 warps, each 16 keys (or rows) of the block; all five
//!   products on tensor cores (`mma.sync.m16n8k16`, f32 accumulators) with operands from four
//!   64-row shared tiles (`cp.async` in, `ldmatrix` out; K, V and Q, dO) and P / dS turned
//!   into A fragments in registers (rounded to the dtype, as FlashAttention does). The tiles
//!   take `4 * 64 * (DP + 8) * 2` bytes of dynamic shared memory plus 512 bytes of statistics
//!   ([`AttentionBackwardKernel::shared_bytes`]: 37.4 KB at head dim 64, 70.1 KB at 128; the
//!   launch allows more than 48 KB). Operands: 16-byte aligned rows with unit column stride
//!   (else gathered), gradients written as 4-byte aligned pairs (else the simple kernel runs).
//! * **f32, and any dtype before sm_80** ([`AttentionBackwardKernel::Simple`],
//!   `coil_attention_bwd_simple_*`): one thread per key (dK, dV blocks) or query row (dQ
//!   blocks), the rows it walks staged 16 at a time in shared memory as f32, any strides.
//!
//! Entry points (all variants):
//!
//! ```text
//! extern "C" __global__ void coil_attention_bwd_{mma,simple}_{bf16,f16,f32}_d{16,32,..,128}{,_masked}(
//!     const T *q, const T *k, const T *v, const T *dout, const float *lse, const float *delta,
//!     T *dq, T *dk, T *dv /* each null when not wanted */, const void *mask /* or null */,
//!     CoilAttnBwdParams p)
//! grid (batch indices, key blocks + query blocks), block 128 (mma) or 64 (simple) threads,
//! dynamic shared memory `shared_bytes()` (mma) or none (simple).
//!
//! extern "C" __global__ void coil_attention_delta_{bf16,f16,f32}(
//!     const T *o, const T *dout, float *delta, CoilAttnDeltaParams p)
//! grid (ceil(rows / 4)), block 128 threads (a warp per row), no shared memory.
//! ```

use super::attention::{choose_kind, element_kind, AttnOperand, BLOCK_ROWS, COMMON_SOURCE};
use coil_ir::target::GpuTarget;
use coil_ir::{DType, Error, Result};

/// The backward kernels.
pub const BACKWARD_SOURCE: &str = include_str!("attention_backward.cu");

/// The kernel argument `CoilAttnBwdParams`, laid out as the C struct.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AttnBwdParams {
    /// The queries.
    pub q: AttnOperand,
    /// The keys.
    pub k: AttnOperand,
    /// The values.
    pub v: AttnOperand,
    /// The output's gradient.
    pub dout: AttnOperand,
    /// The queries' gradient (all zeros when not wanted).
    pub dq: AttnOperand,
    /// The keys' gradient (all zeros when not wanted).
    pub dk: AttnOperand,
    /// The values' gradient (all zeros when not wanted).
    pub dv: AttnOperand,
    /// Inner batch dim's size: block `x` is batch index `(x / heads, x % heads)`.
    pub heads: i32,
    /// Query rows.
    pub l: i32,
    /// Keys.
    pub s: i32,
    /// Head dim.
    pub d: i32,
    /// The factor on `q . k`.
    pub scale: f32,
    /// `scale * log2(e)`.
    pub scale_log2: f32,
    /// 1 for causal attention.
    pub causal: i32,
    /// Blocks of the grid's y dim computing dK and dV (the rest compute dQ).
    pub key_blocks: i32,
    /// The explicit mask: element `(b, h, row, key)` (its `col` stride is the key's); broadcast
    /// dims have stride 0 (all zeros without a mask).
    pub mask: AttnOperand,
    /// The mask's kind (`MaskKind::code`): 0 none, 1 bool, 2 added.
    pub mask_kind: i32,
    /// The forward's dropout, regenerated (threshold 0: none).
    pub drop: super::attention::AttnDropout,
}

/// The kernel argument `CoilAttnDeltaParams` of [`AttentionDeltaKernel`], laid out as the C
/// struct.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AttnDeltaParams {
    /// The attention's output.
    pub o: AttnOperand,
    /// The output's gradient.
    pub dout: AttnOperand,
    /// Query rows of every batch index (batch indices times `l`): `delta`'s length.
    pub rows: i64,
    /// Inner batch dim's size: batch index `x` is `(x / heads, x % heads)`.
    pub heads: i32,
    /// Query rows per batch index.
    pub l: i32,
    /// Head dim.
    pub d: i32,
}

/// The kernel computing the backward's `delta = rowsum(dO * O)` in f32 (`[*batch, l]`
/// row-major) before the backward kernel: one warp per query row, any strides, f32 / f16 /
/// bf16 operands.
///
/// ```
/// use coil_codegen::templates::attention_backward::AttentionDeltaKernel;
/// use coil_ir::DType;
/// let delta = AttentionDeltaKernel::choose(DType::BF16).unwrap();
/// assert_eq!(delta.name(), "coil_attention_delta_bf16");
/// assert_eq!(AttentionDeltaKernel::grid(12 * 1024), (3072, 1, 1));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionDeltaKernel {
    /// The operands' dtype.
    pub dtype: DType,
}

impl AttentionDeltaKernel {
    /// Query rows per block (a warp each).
    pub const ROWS_PER_BLOCK: usize = 4;

    /// The kernel for operands of `dtype`; an error for what it does not read.
    pub fn choose(dtype: DType) -> Result<AttentionDeltaKernel> {
        match dtype {
            DType::F16 | DType::BF16 | DType::F32 => Ok(AttentionDeltaKernel { dtype }),
            _ => Err(Error::unsupported(format!("attention backward of {dtype} values on CUDA"))),
        }
    }

    /// The entry point's name, e.g. `coil_attention_delta_bf16`.
    pub fn name(self) -> String {
        format!("coil_attention_delta_{}", self.dtype)
    }

    /// The kernel's whole translation unit.
    pub fn source(self) -> String {
        let entry = format!("COIL_ATTENTION_DELTA({}, {})\n", self.name(), element_kind(self.dtype));
        format!("{COMMON_SOURCE}\n{BACKWARD_SOURCE}\n{entry}")
    }

    /// Threads per block.
    pub fn block(self) -> u32 {
        (32 * Self::ROWS_PER_BLOCK) as u32
    }

    /// The grid for `rows` query rows (of every batch index).
    pub fn grid(rows: usize) -> (u32, u32, u32) {
        (rows.div_ceil(Self::ROWS_PER_BLOCK) as u32, 1, 1)
    }
}

/// Which backward kernel runs a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionBackwardKernel {
    /// The tensor-core kernel (f16 / bf16 on sm_80+): `bf16` or f16, head dim padded to `dp`.
    Mma {
        /// bf16 operands (else f16).
        bf16: bool,
        /// The head dim padded to a multiple of 16.
        dp: usize,
    },
    /// The one-row-per-thread kernel: `dtype` f32, f16 or bf16, head dim padded to `dp`.
    Simple {
        /// The operands' dtype.
        dtype: DType,
        /// The head dim padded to a multiple of 16.
        dp: usize,
    },
}

impl AttentionBackwardKernel {
    /// The kernel for `dtype` and head dim `d` on `target` (the forward's rule); an error for
    /// what no kernel runs.
    pub fn choose(dtype: DType, d: usize, target: &GpuTarget) -> Result<AttentionBackwardKernel> {
        Ok(match choose_kind("attention backward", dtype, d, target)? {
            (Some(bf16), dp) => AttentionBackwardKernel::Mma { bf16, dp },
            (None, dp) => AttentionBackwardKernel::Simple { dtype, dp },
        })
    }

    /// The entry point's name, e.g. `coil_attention_bwd_mma_bf16_d64`.
    pub fn name(self) -> String {
        match self {
            AttentionBackwardKernel::Mma { bf16, dp } => {
                format!("coil_attention_bwd_mma_{}_d{dp}", if bf16 { "bf16" } else { "f16" })
            }
            AttentionBackwardKernel::Simple { dtype, dp } => format!("coil_attention_bwd_simple_{dtype}_d{dp}"),
        }
    }

    /// The variant's whole translation unit.
    pub fn source(self) -> String {
        let entry = match self {
            AttentionBackwardKernel::Mma { bf16, dp } => format!(
                "COIL_ATTENTION_BWD_MMA({name}, {dp}, {bf16}, false)\nCOIL_ATTENTION_BWD_MMA({name}_masked, {dp}, {bf16}, true)\n",
                name = self.name()
            ),
            AttentionBackwardKernel::Simple { dtype, dp } => {
                format!("COIL_ATTENTION_BWD_SIMPLE({}, {dp}, {})\n", self.name(), element_kind(dtype))
            }
        };
        format!("{COMMON_SOURCE}\n{BACKWARD_SOURCE}\n{entry}")
    }

    /// The entry point for a call with (`masked`) or without an explicit mask: the tensor-core
    /// kernel has one of each (`<name>_masked`), so that a maskless call runs code without the
    /// mask's (as the forward's row-block kernel); the simple kernel reads the mask's kind.
    pub fn entry(self, masked: bool) -> String {
        match self {
            AttentionBackwardKernel::Mma { .. } if masked => format!("{}_masked", self.name()),
            _ => self.name(),
        }
    }

    /// The simple variant of the same dtype and head dim.
    pub fn simple(self, dtype: DType) -> AttentionBackwardKernel {
        match self {
            AttentionBackwardKernel::Mma { dp, .. } | AttentionBackwardKernel::Simple { dp, .. } => {
                AttentionBackwardKernel::Simple { dtype, dp }
            }
        }
    }

    /// Threads per block.
    pub fn block(self) -> u32 {
        match self {
            AttentionBackwardKernel::Mma { .. } => 128,
            AttentionBackwardKernel::Simple { .. } => 64,
        }
    }

    /// Bytes of dynamic shared memory per block: four 64-row tiles of `dp + 8` half elements
    /// (K, V, Q, dO) and two rows of 64 f32 statistics for the tensor-core kernel; none for the
    /// simple one (static).
    pub fn shared_bytes(self) -> u32 {
        match self {
            AttentionBackwardKernel::Mma { dp, .. } => (4 * BLOCK_ROWS * (dp + 8) * 2 + 2 * BLOCK_ROWS * 4) as u32,
            AttentionBackwardKernel::Simple { .. } => 0,
        }
    }
}

/// The grid for `batch` batch indices, `l` query rows and `s` keys, with dQ and (dK or dV)
/// wanted or not: `(grid, key blocks)`, one block per (batch index, block of 64 keys) for dK and
/// dV, then one per (batch index, block of 64 query rows) for dQ.
pub fn backward_grid(batch: usize, l: usize, s: usize, dq: bool, dkv: bool) -> ((u32, u32, u32), u32) {
    let key_blocks = if dkv { s.div_ceil(BLOCK_ROWS) } else { 0 };
    let query_blocks = if dq { l.div_ceil(BLOCK_ROWS) } else { 0 };
    ((batch as u32, (key_blocks + query_blocks) as u32, 1), key_blocks as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_by_dtype_head_dim_and_architecture() {
        let mma = AttentionBackwardKernel::choose(DType::BF16, 64, &GpuTarget::h100()).unwrap();
        assert_eq!(mma, AttentionBackwardKernel::Mma { bf16: true, dp: 64 });
        assert_eq!(mma.name(), "coil_attention_bwd_mma_bf16_d64");
        assert!(mma.source().ends_with(
            "COIL_ATTENTION_BWD_MMA(coil_attention_bwd_mma_bf16_d64, 64, true, false)\n\
             COIL_ATTENTION_BWD_MMA(coil_attention_bwd_mma_bf16_d64_masked, 64, true, true)\n"
        ));
        assert_eq!((mma.entry(false), mma.entry(true)), (mma.name(), "coil_attention_bwd_mma_bf16_d64_masked".into()));
        assert_eq!(mma.shared_bytes(), 4 * 64 * 72 * 2 + 512);
        let simple = AttentionBackwardKernel::choose(DType::F32, 40, &GpuTarget::h100()).unwrap();
        assert_eq!(simple, AttentionBackwardKernel::Simple { dtype: DType::F32, dp: 48 });
        assert_eq!(simple.name(), "coil_attention_bwd_simple_f32_d48");
        assert_eq!(simple.entry(true), simple.name());
        assert_eq!(simple.shared_bytes(), 0);
        assert!(AttentionBackwardKernel::choose(DType::F64, 64, &GpuTarget::h100()).is_err());
        assert_eq!(backward_grid(12, 130, 70, true, true), ((12, 5, 1), 2));
        assert_eq!(backward_grid(12, 130, 70, false, true), ((12, 2, 1), 2));
        assert_eq!(backward_grid(12, 130, 70, true, false), ((12, 3, 1), 0));
    }

    #[test]
    fn params_are_laid_out_as_the_c_struct() {
        // Seven operands of five i64, then eight 4-byte fields (312 bytes), the mask's operand
        // and its kind (356 bytes, padded to 360), then the dropout.
        assert_eq!(std::mem::size_of::<AttnBwdParams>(), 384);
        assert_eq!(std::mem::offset_of!(AttnBwdParams, drop), 360);
        assert_eq!(std::mem::offset_of!(AttnBwdParams, heads), 280);
        assert_eq!(std::mem::offset_of!(AttnBwdParams, scale), 296);
        assert_eq!(std::mem::offset_of!(AttnBwdParams, key_blocks), 308);
        assert_eq!(std::mem::offset_of!(AttnBwdParams, mask), 312);
        assert_eq!(std::mem::offset_of!(AttnBwdParams, mask_kind), 352);
        // Two operands, an i64, three 4-byte fields: 100 bytes, padded to 104.
        assert_eq!(std::mem::size_of::<AttnDeltaParams>(), 104);
        assert_eq!(std::mem::offset_of!(AttnDeltaParams, rows), 80);
        assert_eq!(std::mem::offset_of!(AttnDeltaParams, heads), 88);
        assert_eq!(std::mem::offset_of!(AttnDeltaParams, d), 96);
    }

    #[test]
    fn the_delta_kernel_by_dtype() {
        let delta = AttentionDeltaKernel::choose(DType::F16).unwrap();
        assert_eq!(delta.name(), "coil_attention_delta_f16");
        assert!(delta.source().ends_with("COIL_ATTENTION_DELTA(coil_attention_delta_f16, 1)\n"));
        assert_eq!(delta.block(), 128);
        assert_eq!(AttentionDeltaKernel::grid(9), (3, 1, 1));
        assert!(AttentionDeltaKernel::choose(DType::F64).is_err());
    }
}
