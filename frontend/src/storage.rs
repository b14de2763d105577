//! Where a computed tensor's elements live: host memory or a CUDA device, and which version of
//! them a tensor holds.
//!
//! An allocation can be written in place ([`crate::update_in_place`]: an optimizer step writes
//! new parameters over the old ones). Every handle to an allocation shares one version counter;
//! an in-place write bumps it and returns a handle of the new version. A tensor that still holds
//! the old version stands for the *updated* tensor, as every Python reference to a tensor does
//! after PyTorch's in-place ops: [`crate::Tensor`]'s reads and ops take the current elements
//! (`Storage::latest`, through [`crate::alias`]). What cannot be served is a pending
//! computation recorded before the write that reads the old elements (they are gone): its
//! storage read is an error naming what happened ([`Storage::check_current`], PyTorch's
//! "modified by an inplace operation"), never a silent read of the new values.
//!
//! When an update did not write over its target (the compiler wrote a new buffer, or something
//! pending still reads the old elements), the old allocation records where the tensor *moved*
//! (`Storage::moved_keeping`): its old handles find the current elements there, and what still
//! reads the old ones reads them.
//!
//! The allocation also remembers whether its current elements *descend* from an older version
//! by in-place updates (the same tensor, updated: a parameter after an optimizer step, a key/value
//! cache after a step wrote it) or were *replaced* (a buffer consumed without being written, or
//! reused for another tensor): a replayed compiled function ([`crate::dynamo::CompiledFn::replay`])
//! binds a captured tensor to its allocation's current elements only in the first case.

use crate::tensor::TensorNode;
use coil_ir::{Error, ErrorKind, Result, TensorMeta};
use coil_runtime::cuda::{CudaBuffer, CudaDevice};
use coil_runtime::{Buffer, Device};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// A computed tensor's elements, at one version of their allocation.
#[derive(Clone)]
pub struct Storage {
    data: Data,
    /// The allocation's version, shared by every handle to it.
    version: Arc<Version>,
    /// The version this handle holds.
    seen: u64,
}

/// An allocation's version counter.
struct Version {
    current: AtomicU64,
    /// The first version whose elements the current ones descend from by in-place updates (a
    /// consumed or reused allocation starts a new lineage).
    lineage: AtomicU64,
    /// The latest new lineage, and where the tensor went then (`None`: the allocation was
    /// reused for another tensor).
    moved: Mutex<Option<Move>>,
    /// Pending computations recorded outside compiled functions that read these elements
    /// (directly, or through views): an update that would write over them while one of them
    /// is still pending writes a new buffer instead ([`Storage::moved_keeping`]).
    readers: Mutex<Vec<Weak<TensorNode>>>,
}

/// An allocation's lineage break ([`Storage::replaced`], [`Storage::moved_keeping`]).
struct Move {
    /// The lineage before the break: handles from it on held the tensor that moved.
    after: u64,
    /// Where that tensor's elements are now.
    to: Option<Storage>,
}

impl Version {
    fn new() -> Arc<Version> {
        Arc::new(Version {
            current: AtomicU64::new(0),
            lineage: AtomicU64::new(0),
            moved: Mutex::new(None),
            readers: Mutex::new(Vec::new()),
        })
    }
}

/// The allocation itself.
#[derive(Clone)]
enum Data {
    Host(Arc<Buffer>),
    Cuda(Arc<CudaBuffer>),
}

impl Storage {
    /// Host elements, as a fresh allocation.
    pub fn host(buffer: Arc<Buffer>) -> Storage {
        Storage::fresh(Data::Host(buffer))
    }

    /// Device elements, as a fresh allocation.
    pub fn cuda(buffer: Arc<CudaBuffer>) -> Storage {
        Storage::fresh(Data::Cuda(buffer))
    }

    fn fresh(data: Data) -> Storage {
        Storage { data, version: Version::new(), seen: 0 }
    }

    /// The device holding the elements.
    pub fn device(&self) -> Device {
        match &self.data {
            Data::Host(_) => Device::Cpu,
            Data::Cuda(b) => Device::Cuda(b.device_ordinal()),
        }
    }

    /// The elements' shape and dtype.
    pub fn meta(&self) -> TensorMeta {
        match &self.data {
            Data::Host(b) => b.meta(),
            Data::Cuda(b) => b.meta.clone(),
        }
    }

    /// The device buffer, if the elements are on a CUDA device (whatever their version).
    pub(crate) fn cuda_buffer(&self) -> Option<&Arc<CudaBuffer>> {
        match &self.data {
            Data::Cuda(b) => Some(b),
            Data::Host(_) => None,
        }
    }

    /// An address that identifies the allocation (equal for every handle to it).
    pub(crate) fn addr(&self) -> usize {
        match &self.data {
            Data::Host(b) => Arc::as_ptr(b) as *const u8 as usize,
            Data::Cuda(b) => Arc::as_ptr(b) as *const u8 as usize,
        }
    }

    /// Whether this handle holds the allocation's current elements (no in-place write since).
    pub fn is_current(&self) -> bool {
        self.version.current.load(Ordering::Acquire) == self.seen
    }

    /// An error unless this handle holds the current elements.
    pub fn check_current(&self) -> Result<()> {
        if self.is_current() {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::Value,
            format!(
                "a {} tensor's elements were overwritten in place (an in-place op, update_in_place, an optimizer \
                 step) after a pending computation that reads them was recorded (version {} of its buffer, now {}): \
                 compute it before the write (realize), or record it after",
                self.meta(),
                self.seen,
                self.version.current.load(Ordering::Acquire)
            ),
        ))
    }

    /// Marks the allocation as overwritten and returns a handle to the new elements: every
    /// other handle (the old tensor, its `detach`ed aliases) is stale from now on.
    pub(crate) fn overwritten(&self) -> Storage {
        let seen = self.version.current.fetch_add(1, Ordering::AcqRel) + 1;
        crate::alias::bump();
        Storage { data: self.data.clone(), version: self.version.clone(), seen }
    }

    /// [`Storage::overwritten`] for an allocation whose new elements are not an update of this
    /// handle's tensor (consumed without being written, or reused for another tensor): it starts
    /// a new lineage, so [`Storage::descendant`] of an older handle finds nothing.
    pub(crate) fn replaced(&self) -> Storage {
        let mut moved = self.version.moved.lock().unwrap_or_else(|e| e.into_inner());
        let after = self.version.lineage.load(Ordering::Acquire);
        let new = self.overwritten();
        self.version.lineage.fetch_max(new.seen, Ordering::AcqRel);
        *moved = Some(Move { after, to: None });
        new
    }

    /// Marks an allocation whose tensor's new value went to `to` (an update that wrote a new
    /// buffer) while these elements, its old value, stay as they are: pending computations
    /// recorded before the update still read them, and the tensor's handles follow it to `to`
    /// ([`Storage::latest`]); a replay no longer binds the tensor here ([`Storage::descendant`]).
    pub(crate) fn moved_keeping(&self, to: &Storage) {
        let mut moved = self.version.moved.lock().unwrap_or_else(|e| e.into_inner());
        let after = self.version.lineage.load(Ordering::Acquire);
        let beyond = self.version.current.load(Ordering::Acquire) + 1;
        self.version.lineage.fetch_max(beyond, Ordering::AcqRel);
        *moved = Some(Move { after, to: Some(to.clone()) });
        crate::alias::bump();
    }

    /// Whether this handle holds the tensor's current elements: no write over them, and the
    /// tensor did not move since.
    pub(crate) fn is_latest(&self) -> bool {
        self.is_current() && self.version.lineage.load(Ordering::Acquire) <= self.seen
    }

    /// Records `node`, a pending computation, as a reader of these elements.
    pub(crate) fn add_reader(&self, node: &Arc<TensorNode>) {
        let mut readers = self.version.readers.lock().unwrap_or_else(|e| e.into_inner());
        let n = readers.len();
        if n >= 16 && n.is_power_of_two() {
            readers.retain(|r| r.upgrade().is_some_and(|t| t.storage.get().is_none()));
        }
        readers.push(Arc::downgrade(node));
    }

    /// Whether a pending computation that reads these elements is still alive, other than
    /// those `inside` says are part of the computation about to write them.
    pub(crate) fn read_elsewhere(&self, inside: impl Fn(&Arc<TensorNode>) -> bool) -> bool {
        let mut readers = self.version.readers.lock().unwrap_or_else(|e| e.into_inner());
        readers.retain(|r| r.upgrade().is_some_and(|t| t.storage.get().is_none()));
        readers.iter().filter_map(Weak::upgrade).any(|t| !inside(&t))
    }

    /// The current elements of the tensor this handle holds: this allocation's, updated in
    /// place since (or not at all), or those of the buffer the tensor moved to
    /// ([`Storage::moved_keeping`]); `None` when the allocation was reused for another tensor.
    pub(crate) fn latest(&self) -> Option<Storage> {
        let lineage = self.version.lineage.load(Ordering::Acquire);
        if lineage <= self.seen {
            return self.descendant();
        }
        let moved = self.version.moved.lock().unwrap_or_else(|e| e.into_inner());
        match &*moved {
            // Only one break since this handle: the one that moved its tensor.
            Some(Move { after, to: Some(to) })
                if *after <= self.seen && lineage == self.version.lineage.load(Ordering::Acquire) =>
            {
                let to = to.clone();
                drop(moved);
                to.latest()
            }
            _ => None,
        }
    }

    /// A handle to the allocation's current elements when they are this handle's tensor's,
    /// updated in place since (or not at all); `None` when the allocation was consumed or
    /// reused since ([`Storage::replaced`]).
    pub(crate) fn descendant(&self) -> Option<Storage> {
        let current = self.version.current.load(Ordering::Acquire);
        if self.version.lineage.load(Ordering::Acquire) > self.seen {
            return None;
        }
        Some(Storage { data: self.data.clone(), version: self.version.clone(), seen: current })
    }

    /// [`Storage::descendant`]'s check without making the handle: `None` when the allocation
    /// was consumed or reused since this handle took it, else whether `handle` is the handle
    /// `descendant` would make (this allocation's counter, at its current version), so that a
    /// caller holding it can keep it.
    pub(crate) fn descendant_held_by(&self, handle: &Storage) -> Option<bool> {
        let current = self.version.current.load(Ordering::Acquire);
        if self.version.lineage.load(Ordering::Acquire) > self.seen {
            return None;
        }
        Some(Arc::ptr_eq(&handle.version, &self.version) && handle.seen == current)
    }

    /// Whether `other` is the same handle: the same allocation's counter (so the same
    /// elements), at the same version.
    pub(crate) fn same_handle(&self, other: &Storage) -> bool {
        Arc::ptr_eq(&self.version, &other.version) && self.seen == other.seen
    }

    /// The elements in host memory (a copy from the device for CUDA storage); an error when
    /// they were overwritten in place since this handle took them.
    pub fn to_host(&self) -> Result<Arc<Buffer>> {
        self.check_current()?;
        match &self.data {
            Data::Host(b) => Ok(b.clone()),
            Data::Cuda(b) => Ok(Arc::new(b.to_host()?)),
        }
    }

    /// The elements on `device`: shared when already there, else copied.
    pub fn to_device(&self, device: Device) -> Result<Storage> {
        self.check_current()?;
        match (&self.data, device) {
            (Data::Host(_), Device::Cpu) => Ok(self.clone()),
            (Data::Cuda(b), Device::Cuda(n)) if b.device_ordinal() == n => Ok(self.clone()),
            (_, Device::Cpu) => Ok(Storage::host(self.to_host()?)),
            (_, Device::Cuda(n)) => {
                let host = self.to_host()?;
                Ok(Storage::cuda(Arc::new(CudaBuffer::from_host(&CudaDevice::get(n)?, &host)?)))
            }
        }
    }
}
