//! `coil-runtime`: where graphs run.
//!
//! It owns:
//! * [`Buffer`]: a tensor's elements in host memory, typed by dtype ([`HostData`]);
//! * [`Device`]: where tensors live and graphs run;
//! * [`interpret`]: the reference interpreter, which runs a primitive graph op by op on the CPU.
//!   It is the oracle every compiled path is tested against, so it favours clarity over speed.

pub mod buffer;
pub mod device;
pub mod interp;

pub use buffer::{Buffer, Element, HostData};
pub use device::Device;
pub use interp::interpret;
