//! A cache of freed host allocations, so that a run's outputs and temporaries reuse the memory
//! of earlier runs' instead of asking the system for fresh pages each time.
//!
//! A freshly allocated buffer costs a page fault per 4 KiB on first touch, and a zeroed one a
//! zero-fill besides: 58 us for a 3.4 MB output on the build machine, more than a third of an
//! RMSNorm over it. PyTorch's CUDA allocator caches for the same reason; coil's GPU path has
//! its own ([`crate::cuda`]), and this is the host's.
//!
//! A dropped [`crate::Buffer`] of at least [`MIN_BYTES`] gives its elements here
//! (`give`); a run asking for an output of the same dtype and a length from half the
//! allocation's capacity to all of it takes them back (`take`), with whatever values they
//! held (new elements zero): every element of an output is written by the run before anyone
//! reads it. New outputs get a power-of-two capacity ([`capacity_for`]), so that programs run
//! on growing shapes reuse memory too. At most [`MAX_BYTES`] are kept: a freed buffer that
//! would exceed it sends the least recently freed ones back to the system to make room, so the
//! cache holds what the program freed last, the memory its next run asks for. (Keeping the
//! first buffers instead let one stale allocation, such as a float64 copy made once, hold the
//! whole cache: every later large output was fresh memory, faulted in page by page on each
//! run.)
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
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

/// Smallest allocation worth caching: below this the system allocator reuses memory itself.
pub const MIN_BYTES: usize = 64 << 10;

/// Most bytes the cache holds: a freed buffer that would exceed it sends the least recently
/// freed ones back to the system (one larger than this is not kept).
pub const MAX_BYTES: usize = 512 << 20;

/// Cached allocations: each under the number of its [`give`] (later ones larger), and indexed
/// by dtype and capacity (elements) for [`take`]; their total size.
#[derive(Default)]
struct Pool {
    by_age: BTreeMap<u64, HostData>,
    /// Per dtype, (capacity, age) of each cached allocation, the most recent first among
    /// equal capacities (its memory the likeliest to be in cache still).
    by_capacity: HashMap<DType, BTreeSet<(usize, Reverse<u64>)>>,
    /// The number the next [`give`] gets.
    next_age: u64,
    bytes: usize,
}

impl Pool {
    /// [`give`] on this cache; returns the allocations it let go (`data` itself when it is
    /// not kept), to be dropped outside the lock.
    fn give(&mut self, data: HostData) -> Vec<HostData> {
        let bytes = bytes_of(&data);
        if !(MIN_BYTES..=MAX_BYTES).contains(&bytes) {
            return vec![data];
        }
        let mut evicted = Vec::new();
        while self.bytes + bytes > MAX_BYTES {
            match self.remove_oldest() {
                Some(old) => evicted.push(old),
                None => break,
            }
        }
        let age = self.next_age;
        self.next_age += 1;
        self.bytes += bytes;
        self.by_capacity.entry(data.dtype()).or_default().insert((capacity(&data), Reverse(age)));
        self.by_age.insert(age, data);
        evicted
    }

    /// [`take`] on this cache, before the length is adjusted.
    fn take(&mut self, dtype: DType, len: usize) -> Option<HostData> {
        let lowest = (len, Reverse(u64::MAX));
        let highest = (len.saturating_mul(2), Reverse(0));
        let &(cap, Reverse(age)) = self.by_capacity.get(&dtype)?.range(lowest..=highest).next()?;
        self.remove(dtype, cap, age)
    }

    /// Removes the allocation given as `age`, of `dtype` and `capacity`.
    fn remove(&mut self, dtype: DType, capacity: usize, age: u64) -> Option<HostData> {
        let data = self.by_age.remove(&age)?;
        if let Some(set) = self.by_capacity.get_mut(&dtype) {
            set.remove(&(capacity, Reverse(age)));
        }
        self.bytes -= bytes_of(&data);
        Some(data)
    }

    /// Removes and returns the least recently given allocation.
    fn remove_oldest(&mut self) -> Option<HostData> {
        let (&age, data) = self.by_age.first_key_value()?;
        let (dtype, capacity) = (data.dtype(), capacity(data));
        self.remove(dtype, capacity, age)
    }
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

/// Keeps `data` for a later [`take`] of its dtype and a length it can hold, if it is at least
/// [`MIN_BYTES`] and at most [`MAX_BYTES`]; the least recently given allocations go back to
/// the system where the cache would otherwise exceed [`MAX_BYTES`].
pub(crate) fn give(data: HostData) {
    let Ok(mut guard) = POOL.lock() else { return };
    let released = guard.get_or_insert_with(Pool::default).give(data);
    // (memory going back to the system is unmapped after the lock is released)
    drop(guard);
    drop(released);
}

/// A cached allocation of `dtype` holding `len` elements, if one was given back: the smallest
/// with a capacity of `len` to twice that (the most recently given among equals), cut or
/// extended to `len` elements (extended with zeros: the run writes every element anyway).
pub(crate) fn take(dtype: DType, len: usize) -> Option<HostData> {
    let mut data = POOL.lock().ok()?.as_mut()?.take(dtype, len)?;
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

    /// An allocation of `elements` capacity, its pages never touched (costs no memory).
    fn unused<T>(elements: usize) -> Vec<T> {
        Vec::with_capacity(elements)
    }

    #[test]
    fn a_full_cache_lets_its_least_recently_freed_allocations_go() {
        // A cache of its own (the process's is shared by the tests running beside this one).
        let mut pool = Pool::default();
        let quarter = MAX_BYTES / 4;
        // A stale float64 allocation the size of the whole cache, then float32 outputs freed
        // run after run: each evicts what is older, and the float32 memory stays cached.
        assert!(pool.give(HostData::F64(unused(MAX_BYTES / 8))).is_empty());
        let evicted = pool.give(HostData::F32(unused(quarter / 4)));
        assert_eq!(evicted.iter().map(|d| (d.dtype(), bytes_of(d))).collect::<Vec<_>>(), [(DType::F64, MAX_BYTES)]);
        for _ in 0..10 {
            let out = pool.take(DType::F32, quarter / 4).expect("the last run's output");
            assert!(pool.give(out).is_empty());
        }
        // Only as many as needed go, oldest first.
        assert!(pool.give(HostData::I32(unused(quarter / 4))).is_empty());
        assert!(pool.give(HostData::U8(unused(quarter))).is_empty());
        assert_eq!(pool.bytes, 3 * quarter);
        let evicted = pool.give(HostData::I64(unused(quarter / 8)));
        assert!(evicted.is_empty() && pool.bytes == MAX_BYTES);
        let evicted = pool.give(HostData::I16(unused(quarter)));
        assert_eq!(evicted.iter().map(|d| d.dtype()).collect::<Vec<_>>(), [DType::F32, DType::I32]);
        assert!(pool.take(DType::F32, quarter / 4).is_none() && pool.take(DType::U8, quarter).is_some());
        // Larger than the whole cache: not kept, and nothing else goes for it.
        let evicted = pool.give(HostData::U8(unused(MAX_BYTES + 1)));
        assert_eq!(evicted.iter().map(bytes_of).collect::<Vec<_>>(), [MAX_BYTES + 1]);
        assert_eq!(pool.bytes, MAX_BYTES - quarter);
    }

    #[test]
    fn among_equal_capacities_the_most_recently_freed_is_taken() {
        let mut pool = Pool::default();
        let len = MIN_BYTES;
        for marker in 1..=3u8 {
            let mut v = unused::<u8>(len);
            v.push(marker);
            pool.give(HostData::U8(v));
        }
        let markers: Vec<u8> = (0..3)
            .map(|_| match pool.take(DType::U8, len) {
                Some(HostData::U8(v)) => v[0],
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(markers, [3, 2, 1]);
        assert!(pool.take(DType::U8, len).is_none() && pool.bytes == 0);
    }
}
