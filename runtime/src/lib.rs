//! `coil-runtime`: where graphs run.
//!
//! It owns:
//! * [`Buffer`]: a tensor's elements in host memory, typed by dtype ([`HostData`]);
//! * [`Device`]: where tensors live and graphs run (the CPU, or a CUDA GPU when one is usable);
//! * [`interpret`]: the reference interpreter, which runs a primitive graph op by op on the CPU.
//!   It is the oracle every compiled path is tested against, so it favours clarity over speed;
//! * [`cpu`]: the CPU backend that runs compiled graphs ([`CompiledGraph`]): the system C
//!   compiler and its on-disk cache of shared objects, kernel loading, matrix products through
//!   the `gemm` crate, the attention template ([`cpu::attention`]), and fallback ops through the
//!   interpreter. Without a C compiler
//!   ([`c_compiler`] is `None`) callers run graphs with the interpreter instead;
//! * [`cuda`]: the GPU backend ([`CudaCompiledGraph`]): devices and their streams
//!   ([`CudaDevice`]), device buffers from a caching allocator ([`CudaBuffer`]), NVRTC
//!   compilation to CUBINs with an on-disk cache, matrix products through cuBLASLt, the
//!   attention template through a built-in flash-attention kernel ([`cuda::attention`]),
//!   fallback ops through the interpreter. The CUDA libraries are loaded at run time: without them (or
//!   without a GPU) everything else works, [`cuda_available`] is false, and the CUDA entry
//!   points return an error saying what was searched.
//! * [`cache_entry`] and [`cache_prune`]: the on-disk cache's verified entries (shared objects,
//!   CUBINs, autotune choices, whole graphs) and its size limit.

#![warn(missing_docs)]

pub mod buffer;
pub mod cache_entry;
pub mod cache_prune;
pub mod cpu;
pub mod cuda;
pub mod device;
pub mod host_pool;
pub mod interp;
mod plan;
#[cfg(test)]
mod test_graphs;
#[doc(hidden)]
pub mod testing;

pub use buffer::{Buffer, Element, HostData};
pub use cpu::{c_compiler, CCompiler, CompiledGraph};
pub use cuda::{cuda_available, CudaBuffer, CudaCompiledGraph, CudaDevice};
pub use device::Device;
pub use interp::{interpret, interpret_with};
pub use plan::{NodeOrigin, RunOrigin, RunOutput};
