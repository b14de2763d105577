//! The template layer: hand-written kernels for what the compiler does not derive from loops,
//! Inductor's `kernel/` templates. Each template is its source (`.cu` files next to this
//! module, CUDA C compiled by NVRTC at run time, no headers; `.c` for the CPU), the variants it
//! instantiates and the shapes and dtypes each serves, the layout of its parameter struct, and
//! its launch rule (grid, block, shared memory). The runtime only compiles a template's source
//! and launches it by these rules; it holds no kernel source.
//!
//! * [`attention`]: the FlashAttention-2-style forward (`ExternCall::Attention`), with the row
//!   logsumexp a backward reads and an optional mask (key tiles it drops are skipped), and its
//!   split-KV (flash-decoding) variants for few query rows against many keys, chosen by
//!   [`attention::ForwardLaunch::choose`] for the GPU's SM count.
//! * [`attention_backward`]: its backward (`ExternCall::AttentionBackward`): dQ, dK, dV from
//!   the saved logsumexp, the probabilities recomputed, never stored.
//! * [`eager_cpu`]: the tier-0 CPU executor's math, one chunk kernel per float pointwise op,
//!   from the code generator's own expressions (built with the crate, as `gemm_cpu` is).
//! * [`gemm_cpu`]: the CPU's matrix product (`ExternCall::Bmm` on f32, f16, bf16): C compiled by
//!   the system compiler, packed operands and AVX-512 micro-kernels (`vdpbf16ps` for bf16).
//! * [`sort`]: argsort along a dim (`Op::Argsort`, the base of `sort`, `topk` and sampling):
//!   a bitonic sort of tiles in shared memory, then merge passes for lines longer than a tile.
//! * [`fallback`]: `scatter` / `scatter_add` and `cumsum` on the GPU (ops without generated
//!   kernels); [`scatter`]: its float reductions, each destination's sources combined in the
//!   index's order by one thread (grouped by the [`sort`] template), the same bits every run.
//! * [`gather`]: strided views gathered into contiguous buffers (operands cuBLASLt or the
//!   attention kernels cannot read in place).
//! * [`activation`]: `gelu_tanh` after a matrix product whose epilogue cuBLASLt could not take.
//!
//! The templates that read or write f16 / bf16 share one definition of the conversions
//! ([`HALF_SOURCE`], `half.cuh`), put before their own source. The attention kernels have a
//! tensor-core variant (f16 / bf16 on sm_80 and newer: `mma.sync.m16n8k16`, `ldmatrix`,
//! `cp.async`, f32 accumulators) and a simple one (f32, or any dtype before sm_80; one thread
//! per row, any strides). With `COIL_EMULATED` defined, the sources leave their PTX helpers to
//! the includer: the runtime's tests `cuda::attention::emulation`, `cuda::sort_emulation` and
//! `cuda::scatter_emulation` run them on the host with those instructions emulated, in threads
//! of an emulated block ([`BLOCK_EMULATION`]).

pub mod activation;
pub mod attention;
pub mod attention_backward;
pub mod eager_cpu;
pub mod fallback;
pub mod gather;
pub mod gemm_cpu;
pub mod scatter;
pub mod sort;

use coil_ir::target::GpuTarget;

/// The 16-bit float types of the CUDA templates and their conversions to and from f32 (round to
/// nearest even): what every template with f16 / bf16 data starts with.
pub const HALF_SOURCE: &str = include_str!("half.cuh");

/// A CUDA thread block on the host, in C++, for the host emulation tests of the templates: the
/// CUDA keywords, the thread and block indices (a `std::thread` per CUDA thread) and a real
/// block barrier for `__syncthreads`. A test puts it first in its translation unit.
pub const BLOCK_EMULATION: &str = include_str!("block_emulation.h");

/// A CUDA C module of one empty kernel, `coil_warm_up`: the runtime compiles it once to load
/// and initialise NVRTC early.
pub const WARM_UP_SOURCE: &str = "extern \"C\" __global__ void coil_warm_up() {}\n";

/// Threads per block of the grid-stride templates ([`gather`], [`fallback`], [`activation`], the
/// [`sort`] template's merge).
pub const GRID_STRIDE_BLOCK: u32 = 256;

/// Most blocks per SM a grid-stride launch starts; each thread's loop covers the rest.
pub const GRID_STRIDE_BLOCKS_PER_SM: usize = 32;

/// `(grid, block)` of a grid-stride template kernel over `n` items on `target`: blocks of
/// [`GRID_STRIDE_BLOCK`] threads, enough for every item but at most
/// [`GRID_STRIDE_BLOCKS_PER_SM`] per SM, at least one.
///
/// ```
/// use coil_codegen::templates::grid_stride_launch;
/// use coil_ir::target::GpuTarget;
/// assert_eq!(grid_stride_launch(1000, &GpuTarget::h100()), (4, 256));
/// assert_eq!(grid_stride_launch(1 << 30, &GpuTarget::h100()), (132 * 32, 256));
/// assert_eq!(grid_stride_launch(1 << 30, &GpuTarget::a100()), (108 * 32, 256));
/// ```
pub fn grid_stride_launch(n: usize, target: &GpuTarget) -> (u32, u32) {
    let most = target.sm_count as usize * GRID_STRIDE_BLOCKS_PER_SM;
    let grid = n.div_ceil(GRID_STRIDE_BLOCK as usize).min(most).max(1);
    (grid as u32, GRID_STRIDE_BLOCK)
}

/// `source` with only the kernels `names` of its instantiation lists: a line that instantiates
/// a kernel macro (a `#define` whose body declares a `__global__` function), e.g.
/// `COIL_SCATTER(coil_scatter_4, ...)`, stays only when its first argument is one of `names`.
/// Everything else stays: helper macros and their instantiations, kernels defined directly.
/// NVRTC then compiles the kernels a program launches, not every variant of the template
/// (the fallback template's 51 variants took 12.7 s of one thread in a cold start on the
/// H100 machine).
///
/// ```
/// use coil_codegen::templates::kernel_unit;
/// let source = "#define K(NAME, T) \\\nextern \"C\" __global__ void NAME(T *p) { *p = 0; }\n\
///               #define H(NAME) __device__ int NAME() { return 1; }\n\
///               H(helper)\nK(k_f32, float)\nK(k_f64, double)\n";
/// let unit = kernel_unit(source, &["k_f64"]);
/// assert!(unit.contains("K(k_f64, double)") && !unit.contains("K(k_f32, float)"));
/// assert!(unit.contains("H(helper)"));
/// ```
pub fn kernel_unit(source: &str, names: &[&str]) -> String {
    let mut kernel_macros: Vec<&str> = Vec::new();
    let mut lines = source.lines().peekable();
    let mut out = String::with_capacity(source.len());
    while let Some(line) = lines.next() {
        if let Some(rest) = line.trim_start().strip_prefix("#define ") {
            // The whole definition: its lines continue while they end with a backslash.
            let mut body = line.to_string();
            let mut last = line;
            out.push_str(line);
            out.push('\n');
            while last.trim_end().ends_with('\\') {
                let Some(next) = lines.next() else { break };
                body.push_str(next);
                out.push_str(next);
                out.push('\n');
                last = next;
            }
            if let Some((name, _)) = rest.split_once('(') {
                if body.contains("__global__") {
                    kernel_macros.push(name.trim());
                }
            }
            continue;
        }
        let instantiated = kernel_macros.iter().find_map(|m| {
            let args = line.strip_prefix(m)?.strip_prefix('(')?;
            args.split([',', ')']).next().map(str::trim)
        });
        if instantiated.is_none_or(|kernel| names.contains(&kernel)) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::tests::syntax_check;

    /// The grid-stride templates' CUDA C is valid C++ for the host compiler (with the CUDA
    /// atomics they call declared), on sm_80 and later and before (where the bf16 rounding is
    /// integer arithmetic).
    #[test]
    fn grid_stride_templates_pass_the_host_syntax_check() {
        let atomics = "float atomicAdd(float *, float); double atomicAdd(double *, double); \
                       int atomicAdd(int *, int); \
                       unsigned long long atomicAdd(unsigned long long *, unsigned long long); \
                       unsigned atomicCAS(unsigned *, unsigned, unsigned); \
                       unsigned long long atomicCAS(unsigned long long *, unsigned long long, unsigned long long); \
                       int atomicMax(int *, int); long long atomicMax(long long *, long long); \
                       int atomicMin(int *, int); long long atomicMin(long long *, long long); \
                       double __longlong_as_double(long long); long long __double_as_longlong(double);\n";
        for arch in ["", "#define __CUDA_ARCH__ 900\n"] {
            for source in [gather::SOURCE, fallback::SOURCE, activation::SOURCE] {
                syntax_check(&format!("{arch}{atomics}{source}"));
            }
        }
    }

    #[test]
    fn templates_with_half_types_define_the_conversions_once() {
        for source in [fallback::SOURCE, activation::SOURCE, attention::COMMON_SOURCE] {
            assert!(source.starts_with(HALF_SOURCE));
            assert_eq!(source.matches("cvt.rn.f16.f32 %0, %1;").count(), 1);
        }
    }

    /// Each variant of the fallback and scatter templates compiles alone: its unit has its
    /// instantiation and no other kernel macro's, and keeps the helpers every variant needs.
    #[test]
    fn a_kernel_unit_instantiates_only_its_kernels() {
        let variants: Vec<&str> = fallback::SOURCE
            .lines()
            .filter(|l| {
                l.starts_with("COIL_SCATTER(")
                    || l.starts_with("COIL_SORTED_SCATTER(")
                    || l.starts_with("COIL_ROWS_SCATTER(")
                    || l.starts_with("COIL_CUMSUM(")
            })
            .map(|l| l.split(['(', ',']).nth(1).unwrap().trim())
            .collect();
        assert_eq!(variants.len(), 49, "{variants:?}");
        for &name in &variants {
            let unit = kernel_unit(fallback::SOURCE, &[name]);
            let kept: Vec<&str> = variants.iter().copied().filter(|v| unit.contains(&format!("({v},"))).collect();
            assert_eq!(kept, [name]);
            assert!(unit.contains("COIL_RMW_MUL(coil_prod_i32, unsigned)"));
            assert!(unit.contains("coil_scatter_row_keys") && unit.starts_with(HALF_SOURCE));
        }
        let f32_tiles = kernel_unit(sort::SOURCE, &[sort::tile_kernel(coil_ir::DType::F32)]);
        assert!(f32_tiles.contains("(coil_sort_tile_f32,") && !f32_tiles.contains("(coil_sort_tile_f64,"));
        assert!(f32_tiles.contains(sort::MERGE_KERNEL));
    }
}
