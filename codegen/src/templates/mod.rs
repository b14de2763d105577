//! The template layer: hand-written CUDA kernels for what the compiler does not derive from
//! loops (attention forward and backward), Inductor's `kernel/` templates. Each template is
//! its CUDA C source (`.cu` files next to this module, compiled by NVRTC at run time, no
//! headers), the variants it instantiates and the shapes and dtypes each serves (`choose`),
//! the layout of its parameter struct, and its launch rule (grid, block, shared memory). The
//! runtime only compiles a variant's [`source`](attention::AttentionKernel::source) and
//! launches it by these rules; it holds no kernel source.
//!
//! * [`attention`]: the FlashAttention-2-style forward (`ExternCall::Attention`), with the row
//!   logsumexp a backward reads and an optional mask (key tiles it drops are skipped), and its
//!   split-KV (flash-decoding) variants for few query rows against many keys, chosen by
//!   [`attention::ForwardLaunch::choose`].
//! * [`attention_backward`]: its backward (`ExternCall::AttentionBackward`): dQ, dK, dV from
//!   the saved logsumexp, the probabilities recomputed, never stored.
//! * [`gemm_cpu`]: the CPU's matrix product (`ExternCall::Bmm` on f32, f16, bf16): C compiled by
//!   the system compiler, packed operands and AVX-512 micro-kernels (`vdpbf16ps` for bf16).
//! * [`sort`]: argsort along a dim (`Op::Argsort`, the base of `sort`, `topk` and sampling):
//!   a bitonic sort of tiles in shared memory, then merge passes for lines longer than a tile.
//!
//! Both have a tensor-core variant (f16 / bf16 on sm_80 and newer: `mma.sync.m16n8k16`,
//! `ldmatrix`, `cp.async`, f32 accumulators) and a simple one (f32, or any dtype before
//! sm_80; one thread per row, any strides). With `COIL_ATTENTION_EMULATED` defined, the sources
//! leave their warp-level PTX helpers to the includer: the runtime's test
//! `cuda::attention::emulation` runs them on the host with those instructions emulated.

pub mod attention;
pub mod attention_backward;
pub mod gemm_cpu;
pub mod sort;
