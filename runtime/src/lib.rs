//! `coil-runtime`: where graphs run.
//!
//! It owns:
//! * [`Buffer`]: a tensor's elements in host memory, typed by dtype ([`HostData`]);
//! * [`Device`]: where tensors live and graphs run;
//! * [`interpret`]: the reference interpreter, which runs a primitive graph op by op on the CPU.
//!   It is the oracle every compiled path is tested against, so it favours clarity over speed;
//! * [`cpu`]: the CPU backend that runs compiled graphs ([`CompiledGraph`]): the system C
//!   compiler and its on-disk cache of shared objects, kernel loading, matrix products through
//!   the `gemm` crate, and fallback ops through the interpreter. Without a C compiler
//!   ([`c_compiler`] is `None`) callers run graphs with the interpreter instead.

pub mod buffer;
pub mod cpu;
pub mod device;
pub mod interp;

pub use buffer::{Buffer, Element, HostData};
pub use cpu::{c_compiler, CCompiler, CompiledGraph};
pub use device::Device;
pub use interp::interpret;
