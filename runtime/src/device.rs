//! Devices: where tensors live and graphs run.

use std::fmt;

/// A device: the CPU, or the CUDA GPU of an ordinal.
///
/// The default is the first GPU when one is usable ([`crate::cuda_available`]), else the CPU:
///
/// ```
/// use coil_runtime::{cuda_available, Device};
/// let expected = if cuda_available() { Device::Cuda(0) } else { Device::Cpu };
/// assert_eq!(Device::default(), expected);
/// assert_eq!(Device::Cpu.to_string(), "cpu");
/// assert_eq!(Device::Cuda(1).to_string(), "cuda:1");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Device {
    /// The host CPU: generated C, compiled at run time by the system C compiler.
    Cpu,
    /// The CUDA device of this ordinal (`cuda:0` is the first GPU).
    Cuda(usize),
}

impl Default for Device {
    /// `Cuda(0)` when a GPU is usable, else `Cpu` (the check is cached, so this is cheap).
    fn default() -> Device {
        if crate::cuda::cuda_available() {
            Device::Cuda(0)
        } else {
            Device::Cpu
        }
    }
}

impl Device {
    /// True for a CUDA device.
    pub fn is_cuda(self) -> bool {
        matches!(self, Device::Cuda(_))
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

impl std::str::FromStr for Device {
    type Err = String;

    /// `cpu`, `cuda` (the first GPU) or `cuda:N`, as PyTorch spells devices.
    ///
    /// ```
    /// use coil_runtime::Device;
    /// assert_eq!("cuda:1".parse::<Device>(), Ok(Device::Cuda(1)));
    /// assert_eq!("cpu".parse::<Device>(), Ok(Device::Cpu));
    /// assert!("gpu".parse::<Device>().is_err());
    /// ```
    fn from_str(s: &str) -> Result<Device, String> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| format!("unknown device '{s}' (cpu, cuda or cuda:N)")),
        }
    }
}
