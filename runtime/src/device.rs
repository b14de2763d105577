//! Devices: where tensors live and graphs run.

use std::fmt;

/// A device. Only the CPU exists so far; CUDA comes with the GPU backend.
///
/// ```
/// use coil_runtime::Device;
/// assert_eq!(Device::default(), Device::Cpu);
/// assert_eq!(Device::Cpu.to_string(), "cpu");
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Device {
    #[default]
    Cpu,
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
        }
    }
}
