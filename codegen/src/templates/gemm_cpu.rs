//! The CPU matrix product template (`gemm_cpu.c`): packed operands, cache blocking and
//! AVX-512 or AVX2 micro-kernels, for `ExternCall::Bmm` on f32, f16 and bf16 (the runtime's
//! `coil_runtime::cpu::gemm_packed` runs [`source`], built with the crate or once per process
//! by the system C compiler, on its thread pool).
//!
//! Operands are packed into panels read with unit stride, whatever their strides: A in panels
//! of [`Layout::tile`]`.0` rows (MR), B in panels of `.1` columns (NR), each panel
//! `[k / group][rows][group]` 32-bit words, zero-padded to whole panels and groups:
//!
//! * [`Layout::Bf16Pairs`] (bf16 where the CPU has AVX512-BF16): words are pairs of bf16 along
//!   k, multiplied and summed into f32 by `vdpbf16ps` (oneDNN's instruction for PyTorch's bf16
//!   products without AMX): 2 k per instruction. Its inputs' subnormals count as zero, as
//!   oneDNN's do;
//! * [`Layout::Bf16Amx`] (bf16 where the compiler targets AMX-TILE and AMX-BF16 and the CPU and
//!   kernel grant the tile data: Sapphire Rapids and later): AMX tiles (`tdpbf16ps`, 32 k per
//!   instruction), A in panels of 16 rows (a whole tile's) as rows of k contiguous bf16 (an A
//!   read in place is such panels as it lies), B packed as [`Layout::Bf16Pairs`] packs it (a
//!   panel's 16 pairs of k by 16 columns are a B tile); two A panels pass each B panel together.
//!   The same f32 sums of exact products as `vdpbf16ps`, summed in another order; PyTorch's
//!   oneDNN uses AMX there too;
//! * [`Layout::F32`] (f32, f16, and bf16 without AVX512-BF16): words are floats, f16 and bf16
//!   widened exactly while packing; `vfmadd` over k on 512-bit vectors;
//! * [`Layout::F32Avx2`] (every float type on a CPU without AVX-512, or a build capped at AVX2,
//!   [`IsaCap::Avx2`]): the same words in narrower panels, `vfmadd` on 256-bit vectors.
//!
//! An A whose rows already hold k contiguous words of the layout (f32, or bf16 pairs with an
//! even k) is not packed: the micro-kernels read its whole panels in place
//! ([`ComputeArgs::a`]); only a last panel of fewer than MR rows is packed.
//!
//! A micro-kernel keeps an MR x NR tile of f32 sums in registers. After the last block of k
//! the tile gets the bias, the activation (the prelude's `coil_gelu_tanh_f32`, the function a
//! generated kernel computes) and is rounded once to the output type: a bf16 product is
//! accumulated in f32 and rounded once, as PyTorch's. When k is split into blocks
//! ([`Blocking::kc`]), the sums of earlier blocks wait in an f32 scratch.
//!
//! The runtime packs A first where it is packed (in parallel, [`PackArgs`]), then runs tiles in
//! parallel ([`ComputeArgs`]): each task packs its B panels a block at a time into its own
//! workspace (`nc` panels of `kc`, kept in L2) and passes blocks of `mc` A panels over it (or
//! reads B packed whole before, [`ComputeArgs::pb`], when tasks share B's panels). The
//! runtime picks the orientation, `a @ b` or `b^T a^T` into a transposed output
//! ([`ComputeArgs::transposed`]), that packs least and pads tiles least.
//!
//! One build holds one instruction set's kernels: AVX-512 (F, BW, VL) where the compiler
//! targets it, else AVX2 with FMA and F16C ([`FEATURES_KERNEL`] says which layouts a build
//! serves on the CPU running it). Without either the library serves nothing and the runtime
//! multiplies with the `gemm` crate instead.

use crate::c::prelude;
use coil_ir::DType;
use std::ffi::c_void;

/// The C of the template (it needs the prelude and the tile sizes before it: [`source`]).
pub const SOURCE: &str = include_str!("gemm_cpu.c");

/// `coil_gemm_features`: writes the bits of the [`Layout`]s this build and CPU serve
/// ([`Layout::feature_bit`]) to the `int64_t` at `args[0]`.
pub const FEATURES_KERNEL: &str = "coil_gemm_features";

/// `coil_gemm_pack`: packs panels of one operand ([`PackArgs`] at `args[0]`).
pub const PACK_KERNEL: &str = "coil_gemm_pack";

/// `coil_gemm_compute`: a range of output tiles ([`ComputeArgs`] at `args[0]`).
pub const COMPUTE_KERNEL: &str = "coil_gemm_compute";

/// How packed operands hold their elements, and so which micro-kernel multiplies them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// One f32 per word; f32 FMA.
    F32,
    /// Two bf16 of consecutive k per word; `vdpbf16ps`.
    Bf16Pairs,
    /// One f32 per word, in the AVX2 kernels' panels; f32 FMA on 256-bit vectors.
    F32Avx2,
    /// bf16 for AMX tiles: B as [`Layout::Bf16Pairs`], A's panels as rows of k contiguous bf16
    /// (k rounded up to even); `tdpbf16ps`.
    Bf16Amx,
}

impl Layout {
    /// Every layout.
    pub const ALL: [Layout; 4] = [Layout::F32, Layout::Bf16Pairs, Layout::F32Avx2, Layout::Bf16Amx];

    /// Elements of k per word.
    pub fn group(self) -> usize {
        match self {
            Layout::F32 | Layout::F32Avx2 => 1,
            Layout::Bf16Pairs | Layout::Bf16Amx => 2,
        }
    }

    /// The micro-kernel's tile: (MR rows of A, NR columns of B). NR is a multiple of the f32
    /// lanes of a vector ([`Layout::lanes`]) and MR at most that many (a transposed store
    /// transposes one vector's rows); MR x NR / lanes accumulators, the NR / lanes vectors of B
    /// and a broadcast of A fill most of the vector registers (32 with AVX-512, 16 with AVX2).
    /// The AMX layout's tile is an AMX tile's 16 rows by two B tiles' columns.
    ///
    /// ```
    /// use coil_codegen::templates::gemm_cpu::Layout;
    /// for layout in Layout::ALL {
    ///     let (mr, nr) = layout.tile();
    ///     assert!(nr % layout.lanes() == 0 && mr <= layout.lanes());
    /// }
    /// ```
    pub fn tile(self) -> (usize, usize) {
        match self {
            Layout::F32 => (12, 32),
            Layout::Bf16Pairs => (12, 32),
            Layout::F32Avx2 => (6, 16),
            Layout::Bf16Amx => (16, 32),
        }
    }

    /// f32 lanes of the micro-kernel's vectors: 16 (AVX-512) or 8 (AVX2).
    pub fn lanes(self) -> usize {
        match self {
            Layout::F32 | Layout::Bf16Pairs | Layout::Bf16Amx => 16,
            Layout::F32Avx2 => 8,
        }
    }

    /// Bytes of one element in a panel.
    pub fn element_bytes(self) -> usize {
        4 / self.group()
    }

    /// Its bit in [`FEATURES_KERNEL`]'s answer.
    pub fn feature_bit(self) -> i64 {
        match self {
            Layout::F32 => 1,
            Layout::Bf16Pairs => 2,
            Layout::F32Avx2 => 4,
            Layout::Bf16Amx => 8,
        }
    }

    /// Its code in [`PackArgs::layout`] and [`ComputeArgs::layout`].
    pub fn code(self) -> i64 {
        match self {
            Layout::F32 => 0,
            Layout::Bf16Pairs => 1,
            Layout::F32Avx2 => 2,
            Layout::Bf16Amx => 3,
        }
    }

    /// 32-bit words of `rows x k` packed in panels of `panel` rows: whole panels of whole
    /// groups (with [`Layout::Bf16Amx`], A's panels too: `panel` rows of k rounded up to even).
    ///
    /// ```
    /// use coil_codegen::templates::gemm_cpu::Layout;
    /// assert_eq!(Layout::Bf16Pairs.packed_words(13, 5, 12), 2 * 12 * 3);
    /// assert_eq!(Layout::F32.packed_words(12, 5, 12), 12 * 5);
    /// ```
    pub fn packed_words(self, rows: usize, k: usize, panel: usize) -> usize {
        rows.div_ceil(panel) * panel * k.div_ceil(self.group())
    }
}

/// The template's code for an operand or output element type (f32, f16, bf16); `None` for
/// others.
pub fn dtype_code(dtype: DType) -> Option<i64> {
    match dtype {
        DType::F32 => Some(0),
        DType::F16 => Some(1),
        DType::BF16 => Some(2),
        _ => None,
    }
}

/// [`ComputeArgs::act`] without an activation.
pub const ACT_NONE: i64 = 0;
/// [`ComputeArgs::act`] for the tanh GELU.
pub const ACT_GELU_TANH: i64 = 1;

/// The most a build of the template may use of the instructions the compiler targets (the
/// system compiler builds for the machine it runs on, `-march=native`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IsaCap {
    /// Everything the compiler targets: AVX-512 kernels where it targets AVX-512 F, BW and VL,
    /// else AVX2 ones.
    Native,
    /// AVX2, FMA and F16C at most: the AVX-512 extensions are switched off for the whole
    /// translation unit (`#pragma GCC target("no-avx512f")`, which gcc honours; other compilers
    /// still pick the AVX2 kernels), so that a machine with AVX-512 builds and runs what a CPU
    /// without it (most laptops' since Alder Lake) does.
    Avx2,
}

/// The translation unit for `cap`: the C prelude (conversions, GELU), the tile sizes,
/// [`SOURCE`].
///
/// ```
/// use coil_codegen::templates::gemm_cpu::{source, IsaCap};
/// assert!(source(IsaCap::Avx2).starts_with("#pragma GCC target(\"no-avx512f\")"));
/// assert!(!source(IsaCap::Native).contains("#define COIL_GEMM_CAP_AVX2"));
/// ```
pub fn source(cap: IsaCap) -> String {
    let (mr_f32, nr_f32) = Layout::F32.tile();
    let (mr_pairs, nr_pairs) = Layout::Bf16Pairs.tile();
    let (mr_avx2, nr_avx2) = Layout::F32Avx2.tile();
    let (mr_amx, nr_amx) = Layout::Bf16Amx.tile();
    // before the prelude, so that every header and the prelude see the capped target
    let cap = match cap {
        IsaCap::Native => "",
        IsaCap::Avx2 => "#pragma GCC target(\"no-avx512f\")\n#define COIL_GEMM_CAP_AVX2 1\n",
    };
    format!(
        "{cap}{}\n#define COIL_GEMM_MR_F32 {mr_f32}\n#define COIL_GEMM_NR_F32 {nr_f32}\n\
         #define COIL_GEMM_MR_BF16 {mr_pairs}\n#define COIL_GEMM_NR_BF16 {nr_pairs}\n\
         #define COIL_GEMM_MR_AMX {mr_amx}\n#define COIL_GEMM_NR_AMX {nr_amx}\n\
         #define COIL_GEMM_MR_F32_AVX2 {mr_avx2}\n#define COIL_GEMM_NR_F32_AVX2 {nr_avx2}\n{SOURCE}",
        prelude()
    )
}

/// The arguments of [`PACK_KERNEL`] (`coil_gemm_pack_args`): panels `[lo, hi)` of a
/// `rows x k` matrix read at `src` through element strides, packed from `dst` on.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PackArgs {
    /// The matrix's first element.
    pub src: *const c_void,
    /// Elements between rows (A: along m; B: along n).
    pub rs: i64,
    /// Elements along k.
    pub ks: i64,
    /// Rows of the matrix (A: m; B: n).
    pub rows: i64,
    /// Elements of k.
    pub k: i64,
    /// [`dtype_code`] of `src`.
    pub dtype: i64,
    /// [`Layout::code`].
    pub layout: i64,
    /// Rows per panel.
    pub panel: i64,
    /// The first panel packed.
    pub lo: i64,
    /// One past the last panel packed.
    pub hi: i64,
    /// Where panel `lo` goes; panel `p` at word `(p - lo) * panel * groups`.
    pub dst: *mut c_void,
    /// 0: the matrix is A (rows along m); 1: B (rows along n). Only [`Layout::Bf16Amx`] packs
    /// them differently.
    pub operand: i64,
}

/// The arguments of [`COMPUTE_KERNEL`] (`coil_gemm_compute_args`): the tiles of A panels
/// `[i0, i1)` by B panels `[j0, j1)` of one product.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ComputeArgs {
    /// [`Layout::code`].
    pub layout: i64,
    /// A packed in panels of MR rows, all of k, from panel `pa_first` on.
    pub pa: *const c_void,
    /// The first panel in `pa` (with `a`, the last one, a part panel; else 0).
    pub pa_first: i64,
    /// Or A read in place, or null: A's first element, when it is of the layout's element type
    /// (f32, or bf16 for [`Layout::Bf16Pairs`] with an even k) with k contiguous. Its whole
    /// panels are read here; a last panel of fewer than MR rows is read packed from `pa`.
    pub a: *const c_void,
    /// `a`'s element stride between rows.
    pub a_rs: i64,
    /// B, read through element strides along n and along k.
    pub b: *const c_void,
    /// B's element stride along n.
    pub b_ns: i64,
    /// B's element stride along k.
    pub b_ks: i64,
    /// [`dtype_code`] of `b`.
    pub b_dtype: i64,
    /// B packed whole in panels of NR columns, all of k (as A is packed), or null: the tiles
    /// then pack the B panels they read, a block of `kc` at a time, into `bws`.
    pub pb: *const c_void,
    /// Room for `nc` packed B panels of `kc` ([`Blocking::workspace_words`]), 64-byte aligned.
    pub bws: *mut c_void,
    /// Rows of the product.
    pub m: i64,
    /// Columns of the product.
    pub n: i64,
    /// The contracted dim.
    pub k: i64,
    /// Elements of k per block ([`Blocking::kc`]).
    pub kc: i64,
    /// B panels packed at once ([`Blocking::nc`]).
    pub nc: i64,
    /// A panels that pass one B block in a row ([`Blocking::mc`]).
    pub mc: i64,
    /// The first A panel of the tiles.
    pub i0: i64,
    /// One past the last A panel of the tiles.
    pub i1: i64,
    /// The first B panel of the tiles.
    pub j0: i64,
    /// One past the last B panel of the tiles.
    pub j1: i64,
    /// `n` floats added to every row (`m`, one per row, when `transposed`), or null.
    pub bias: *const f32,
    /// [`ACT_NONE`] or [`ACT_GELU_TANH`].
    pub act: i64,
    /// The `m x n` output, row stride `ldo` elements, of [`dtype_code`] `out_dtype`.
    pub out: *mut c_void,
    /// `out`'s row stride, in elements.
    pub ldo: i64,
    /// [`dtype_code`] of `out`.
    pub out_dtype: i64,
    /// With several blocks of k: f32 partial sums of whole tiles (`ceil(m / MR) * MR` rows),
    /// row stride `ldacc` (at least `ceil(n / NR) * NR`); else null.
    pub acc: *mut f32,
    /// `acc`'s row stride, in elements.
    pub ldacc: i64,
    /// Nonzero: `out` holds the `n x m` transpose of the product (row stride `ldo`), and the
    /// bias has `m` values, one per row of the product (the runtime multiplies `b^T a^T` so
    /// that the larger operand is B: see `coil_runtime::cpu::gemm_packed`).
    pub transposed: i64,
}

/// Cache blocking of one product: `kc` elements of k per block (a multiple of the group), `nc`
/// B panels packed at once and `mc` A panels passing over them, sized for an L2 of 1 MiB or
/// more (every AVX-512 core since Skylake-SP; AVX2 cores with less, such as Zen 2's 512 KiB,
/// use the same blocking, untuned) with `kc` covering all of k up to a few thousand: one block
/// of k means no partial sums to store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocking {
    /// Elements of k per block, a multiple of the layout's group.
    pub kc: usize,
    /// B panels packed at once, kept in L2 while the A panels pass.
    pub nc: usize,
    /// A panels that pass one B block in a row (they stay in L2 too).
    pub mc: usize,
}

/// Most elements of k per block, in bytes of a panel row (`kc * element_bytes`).
const KC_BYTES: usize = 8192;
/// Bytes of packed B a task keeps in L2 at once.
const B_BLOCK_BYTES: usize = 384 << 10;
/// Bytes of packed A that pass one B block before the next A block (also in L2).
const A_BLOCK_BYTES: usize = 384 << 10;
/// AMX: the most bytes of all of A and a B block kept in L2 together (every AMX core so far,
/// Sapphire Rapids on, has 2 MiB of L2).
const AMX_L2_BYTES: usize = 5 << 18;
/// AMX: bytes of a B block when A does not fit in L2 beside it (A then streams in from L3 once
/// per B block, so the blocks are made few).
const AMX_B_BLOCK_BYTES: usize = 1 << 20;

impl Blocking {
    /// The blocking for `k` (any `m`, `n`): k in near-equal blocks of at most
    /// `KC_BYTES` / element bytes.
    ///
    /// ```
    /// use coil_codegen::templates::gemm_cpu::{Blocking, Layout};
    /// let b = Blocking::choose(Layout::Bf16Pairs, 896);
    /// assert_eq!(b.kc, 896);
    /// let long = Blocking::choose(Layout::F32, 4097);
    /// assert!(long.kc < 4097 && long.kc * 3 >= 4097);
    /// ```
    pub fn choose(layout: Layout, k: usize) -> Blocking {
        let (mr, nr) = layout.tile();
        let group = layout.group();
        let bytes = layout.element_bytes();
        let kp = k.div_ceil(group) * group;
        let max = (KC_BYTES / bytes).max(group);
        let blocks = kp.div_ceil(max).max(1);
        // AMX: blocks of whole tile steps (32 k) but the last, so that only the last has a
        // part step (its A panels then pass one at a time)
        let align = if layout == Layout::Bf16Amx && blocks > 1 { 32 } else { group };
        let kc = (kp.div_ceil(blocks).div_ceil(align) * align).max(group);
        let nc = (B_BLOCK_BYTES / (kc * nr * bytes)).max(1);
        let mc = (A_BLOCK_BYTES / (kc * mr * bytes)).max(1);
        // AMX: A panels pass in pairs
        let mc = if layout == Layout::Bf16Amx { (mc & !1).max(2) } else { mc };
        Blocking { kc, nc, mc }
    }

    /// The blocking for `m x k` by `k x n` ([`Blocking::choose`] for `k`), with
    /// [`Layout::Bf16Amx`]'s B blocks made larger where all of A and a B block do not fit in
    /// L2 together (A then comes from L3 once per B block: at 410 x 3648 x 896, 4 B panels a
    /// block ran 1.3x as fast as 1 on one core, while at 410 x 896 x 3648, whose A stays in L2, a
    /// block larger than the default was slower).
    ///
    /// ```
    /// use coil_codegen::templates::gemm_cpu::{Blocking, Layout};
    /// let small_a = Blocking::choose_for(Layout::Bf16Amx, 410, 896);
    /// assert_eq!(small_a, Blocking::choose(Layout::Bf16Amx, 896));
    /// let large_a = Blocking::choose_for(Layout::Bf16Amx, 410, 3648);
    /// assert!(large_a.nc > Blocking::choose(Layout::Bf16Amx, 3648).nc);
    /// ```
    pub fn choose_for(layout: Layout, m: usize, k: usize) -> Blocking {
        let mut blocking = Blocking::choose(layout, k);
        if layout == Layout::Bf16Amx {
            let (mr, nr) = layout.tile();
            let bytes = layout.element_bytes();
            let a_bytes = m.div_ceil(mr) * mr * blocking.kc * bytes;
            if a_bytes + blocking.nc * blocking.kc * nr * bytes > AMX_L2_BYTES {
                blocking.nc = blocking.nc.max(AMX_B_BLOCK_BYTES / (blocking.kc * nr * bytes));
            }
        }
        blocking
    }

    /// Blocks of k for `k` elements (at least 1: with k = 0 one block writes the bias).
    pub fn k_blocks(&self, layout: Layout, k: usize) -> usize {
        let kp = k.div_ceil(layout.group()) * layout.group();
        kp.div_ceil(self.kc).max(1)
    }

    /// 32-bit words of a task's B workspace ([`ComputeArgs::bws`]).
    pub fn workspace_words(&self, layout: Layout) -> usize {
        self.nc * layout.tile().1 * self.kc / layout.group()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_of_k_cover_k_in_whole_groups() {
        for layout in Layout::ALL {
            for k in [0, 1, 2, 3, 191, 896, 2047, 2048, 2049, 3648, 4096, 10000] {
                let b = Blocking::choose(layout, k);
                assert_eq!(b.kc % layout.group(), 0, "{layout:?} k={k}");
                assert!(b.kc * b.k_blocks(layout, k) >= k, "{layout:?} k={k}");
                // near-equal blocks: the last one is not a sliver
                assert!(b.kc * (b.k_blocks(layout, k) - 1) < k.max(1), "{layout:?} k={k}");
                assert!(b.kc * layout.element_bytes() <= KC_BYTES.max(4));
                assert!(b.nc >= 1 && b.mc >= 1);
            }
        }
    }

    #[test]
    fn the_source_defines_the_tiles_and_every_entry_point() {
        for cap in [IsaCap::Native, IsaCap::Avx2] {
            let s = source(cap);
            assert!(s.contains(&format!("#define COIL_GEMM_NR_BF16 {}", Layout::Bf16Pairs.tile().1)));
            assert!(s.contains(&format!("#define COIL_GEMM_MR_F32_AVX2 {}", Layout::F32Avx2.tile().0)));
            for name in [FEATURES_KERNEL, PACK_KERNEL, COMPUTE_KERNEL] {
                assert!(s.contains(&format!("void {name}(char *const *args, int64_t *status)")), "{name}");
            }
        }
    }
}
