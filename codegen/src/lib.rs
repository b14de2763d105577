//! `coil-codegen`: turns fused kernels into block-level kernel IR, and kernel IR into source
//! code: C for the CPU; PTX or CUDA C for NVIDIA GPUs.
//!
//! * [`tile`]: [`build_kernel`] turns one [`coil_ir::kernel::FusedKernel`] of the scheduler
//!   into a [`coil_ir::kernel::TileKernel`], the Triton-style block program of `.tile` dumps.
//! * [`c`]: [`emit_c`] turns tile kernels into one C translation unit (OpenMP loops, and a
//!   prelude of helpers that reproduce the reference interpreter's semantics); the runtime
//!   compiles it with the system `cc` and calls each kernel as
//!   `void NAME(char *const *args, int64_t *status)`.
//! * [`cuda`]: each tile kernel with its launch plan ([`cuda::launch`]) as a GPU translation
//!   unit ([`CudaModule`]): PTX where [`cuda::ptx`] covers the kernel (assembled by the
//!   driver), else CUDA C for NVRTC ([`emit_cuda`]); [`cuda::emit_for_device`] picks.
//! * [`templates`]: the hand-written CUDA kernels (attention forward and backward): their
//!   source, the shapes and dtypes each serves, and their launch rules.
//!
//! The contracts between these steps and their neighbours are in `docs/compiler.md`.

#![warn(missing_docs)]

pub mod c;
pub mod cuda;
#[cfg(test)]
mod pipeline_tests;
pub mod templates;
#[cfg(test)]
mod testutil;
pub mod tile;

pub use c::{emit_c, emit_kernel, status};
pub use cuda::{emit_cuda, emit_cuda_kernel_source, CudaKernel, CudaModule, Launch};
pub use tile::build_kernel;
