//! A cache of freed host allocations, so that a run's outputs and temporaries reuse the memory
//! of earlier runs' instead of asking the system for fresh pages each time.
//!
//! A freshly allocated buffer costs a page fault per 4 KiB on first touch, and a zeroed one a
//! zero-fill besides: 58 us for a 3.4 MB output on the build machine, more than a third of an
//! RMSNorm over it. PyTorch's CUDA allocator caches for the same reason; coil's GPU path has
//! its own ([`crate::cuda`]), and this is the host's.
//!
//! A dropped [`crate::Buffer`] of at least [`MIN_BYTES`] gives its elements here
//! ([`give`]); a run asking for an output of the same dtype and a length from half the
//! allocation's capacity to all of it takes them back ([`take`]), with whatever values they
//! held (new elements zero): every element of an output is written by the run before anyone
//! reads it. New outputs get a power-of-two capacity ([`capacity_for`]), so that programs run
//! on growing shapes reuse memory too. At most [`MAX_BYTES`] are kept; past that, freed memory
//! goes back to the system as before.
//!
//! ```
//! use coil_runtime::Buffer;
//! let a = Buffer::from_vec(vec![1.0f32; 1 << 16], vec![1 << 16]);
//! drop(a); // cached, not freed
//! let b = coil_runtime::buffer::HostData::for_output(coil_ir::DType::F32, 1 << 16).unwrap();
//! assert_eq!(b.len(), 1 << 16); // the same memory, values unspecified
//! ```

use crate::buffer::HostData;
use coil_ir::DType;
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

/// Smallest allocation worth caching: below this the system allocator reuses memory itself.
pub const MIN_BYTES: usize = 64 << 10;

/// Most bytes the cache holds; a freed buffer that would exceed it is freed.
pub const MAX_BYTES: usize = 512 << 20;

/// Cached allocations by dtype and capacity (elements), and their total size.
#[derive(Default)]
struct Pool {
    free: HashMap<DType, BTreeMap<usize, Vec<HostData>>>,
    bytes: usize,
}

static POOL: Mutex<Option<Pool>> = Mutex::new(None);

fn capacity(data: &HostData) -> usize {
    crate::with_host_data!(data, v => v.capacity())
}

fn bytes_of(data: &HostData) -> usize {
    capacity(data) * data.dtype().size_bytes()
}

/// The capacity a new output of `len` elements is allocated with: the next power of two
/// when it is large enough to be cached. A pass over growing shapes (each output a little
/// larger than the last) then finds the last one's memory in the cache (with `len` up to that
/// capacity, its pages already mapped) instead of faulting in fresh pages: PyTorch's outputs
/// reuse freed memory the same way through the system allocator. The capacity beyond the
/// elements written costs address space, not memory.
pub fn capacity_for(dtype: DType, len: usize) -> usize {
    if len.saturating_mul(dtype.size_bytes()) < MIN_BYTES {
        len
    } else {
        len.checked_next_power_of_two().unwrap_or(len)
    }
}

/// Keeps `data` for a later [`take`] of its dtype and a length it can hold, if it is large
/// enough and the cache has room; otherwise drops it.
pub(crate) fn give(data: HostData) {
    let bytes = bytes_of(&data);
    if bytes < MIN_BYTES {
        return;
    }
    let Ok(mut guard) = POOL.lock() else { return };
    let pool = guard.get_or_insert_with(Pool::default);
    if pool.bytes + bytes > MAX_BYTES {
        return;
    }
    pool.bytes += bytes;
    pool.free.entry(data.dtype()).or_default().entry(capacity(&data)).or_default().push(data);
}

/// A cached allocation of `dtype` holding `len` elements, if one was given back: the smallest
/// with a capacity of `len` to twice that, cut or extended to `len` elements (extended with
/// zeros: the run writes every element anyway).
pub(crate) fn take(dtype: DType, len: usize) -> Option<HostData> {
    let mut guard = POOL.lock().ok()?;
    let pool = guard.as_mut()?;
    let by_capacity = pool.free.get_mut(&dtype)?;
    let (&cap, list) = by_capacity.range_mut(len..=len.saturating_mul(2)).next()?;
    let mut data = list.pop()?;
    if list.is_empty() {
        by_capacity.remove(&cap);
    }
    pool.bytes -= bytes_of(&data);
    drop(guard);
    crate::with_host_data!(&mut data, v => v.resize(len, bytemuck::Zeroable::zeroed()));
    Some(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freed_buffer_is_taken_back_once_and_small_ones_are_not_kept() {
        // A dtype no other test caches: the cache is shared by the process, and a cached
        // buffer serves a range of lengths.
        let len = MIN_BYTES + 12_345;
        give(HostData::I8(vec![5; len]));
        let back = take(DType::I8, len).expect("cached");
        assert_eq!(back, HostData::I8(vec![5; len]));
        assert!(take(DType::I8, len).is_none(), "taken once");
        give(back);
        assert!(take(DType::Bool, len).is_none(), "by dtype");
        assert!(take(DType::I8, len).is_some());
        give(HostData::U8(vec![1; 100]));
        assert!(take(DType::U8, 100).is_none(), "too small to keep");
    }

    #[test]
    fn a_freed_buffer_serves_lengths_up_to_its_capacity_and_not_much_smaller() {
        // Lengths no other test uses (the cache is shared by the process); i16 is used nowhere.
        let len = (MIN_BYTES / 2) + 777;
        let cap = capacity_for(DType::I16, len);
        assert!(cap.is_power_of_two() && cap >= len, "{cap}");
        let mut v = Vec::with_capacity(cap);
        v.resize(len, 7i16);
        give(HostData::I16(v));
        // longer than it was: the new elements are zeros, the old keep their values
        let HostData::I16(back) = take(DType::I16, len + 10).expect("fits its capacity") else { panic!() };
        assert_eq!((back.len(), back[0], back[len + 9]), (len + 10, 7, 0));
        give(HostData::I16(back));
        assert!(take(DType::I16, cap + 1).is_none(), "beyond its capacity");
        assert!(take(DType::I16, cap / 2 - 1).is_none(), "less than half of it");
        let HostData::I16(back) = take(DType::I16, cap / 2).expect("half of it") else { panic!() };
        assert_eq!(back.len(), cap / 2);
    }
}
