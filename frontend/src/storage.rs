//! Where a computed tensor's elements live: host memory or a CUDA device.

use coil_ir::{Result, TensorMeta};
use coil_runtime::cuda::{CudaBuffer, CudaDevice};
use coil_runtime::{Buffer, Device};
use std::sync::Arc;

/// A computed tensor's elements.
#[derive(Clone)]
pub enum Storage {
    Host(Arc<Buffer>),
    Cuda(Arc<CudaBuffer>),
}

impl Storage {
    pub fn device(&self) -> Device {
        match self {
            Storage::Host(_) => Device::Cpu,
            Storage::Cuda(b) => Device::Cuda(b.device_ordinal()),
        }
    }

    pub fn meta(&self) -> TensorMeta {
        match self {
            Storage::Host(b) => b.meta(),
            Storage::Cuda(b) => b.meta.clone(),
        }
    }

    /// The elements in host memory (a copy from the device for CUDA storage).
    pub fn to_host(&self) -> Result<Arc<Buffer>> {
        match self {
            Storage::Host(b) => Ok(b.clone()),
            Storage::Cuda(b) => Ok(Arc::new(b.to_host()?)),
        }
    }

    /// The elements on `device`: shared when already there, else copied.
    pub fn to_device(&self, device: Device) -> Result<Storage> {
        match (self, device) {
            (Storage::Host(_), Device::Cpu) => Ok(self.clone()),
            (Storage::Cuda(b), Device::Cuda(n)) if b.device_ordinal() == n => Ok(self.clone()),
            (_, Device::Cpu) => Ok(Storage::Host(self.to_host()?)),
            (_, Device::Cuda(n)) => {
                let host = self.to_host()?;
                Ok(Storage::Cuda(Arc::new(CudaBuffer::from_host(&CudaDevice::get(n)?, &host)?)))
            }
        }
    }
}
