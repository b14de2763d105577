//! The large blocks of the caching allocator: carved out of driver segments, best fit, split
//! to the byte count asked for, merged with free neighbours when freed (PyTorch's large pool).
//!
//! The driver maps device memory in 2 MiB pages, so a block of its own for a 2.4 MB weight
//! would hold 4 MiB: a model's parameters, gradients and optimizer states lose tens of
//! megabytes each that way. Blocks above [`LARGE`] bytes come instead from segments of
//! [`segment_bytes`] (20 MiB, or the request rounded up to 2 MiB), and sit next to each other.
//!
//! Plain bookkeeping over addresses (tested without a GPU); the allocator
//! ([`super::memory`]) asks the driver for segments and owns the counters.

use cudarc::driver::sys::CUdeviceptr;
use std::collections::{BTreeMap, BTreeSet};

/// Requests above this many bytes take large blocks (smaller ones have size classes).
pub const LARGE: usize = 1 << 20;

/// The driver's page: segments are multiples of it.
const PAGE: usize = 2 << 20;

/// The segment made for a request of `bytes` that no free block serves: 20 MiB for requests
/// under 10 MiB (room for more blocks), else the request rounded up to whole pages.
pub fn segment_bytes(bytes: usize) -> usize {
    if bytes < 10 << 20 {
        20 << 20
    } else {
        bytes.div_ceil(PAGE).saturating_mul(PAGE)
    }
}

/// One block: its bytes, the segment it lies in, whether it is free.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Block {
    bytes: usize,
    segment: CUdeviceptr,
    free: bool,
}

/// The segments of one device and the blocks they are cut into.
#[derive(Debug, Default)]
pub(crate) struct Segments {
    /// Every block, free or handed out, by address.
    blocks: BTreeMap<CUdeviceptr, Block>,
    /// The free blocks by `(bytes, address)`: the first at or above a size is the best fit.
    free: BTreeSet<(usize, CUdeviceptr)>,
    /// Each segment's bytes, by base address.
    segments: BTreeMap<CUdeviceptr, usize>,
}

impl Segments {
    /// A block of exactly `bytes` cut from the smallest free block that holds it (the rest
    /// stays free); `None` when no free block is large enough.
    pub(crate) fn take(&mut self, bytes: usize) -> Option<CUdeviceptr> {
        let &(size, ptr) = self.free.range((bytes, 0)..).next()?;
        self.free.remove(&(size, ptr));
        let block = self.blocks.get_mut(&ptr).expect("a free block is a block");
        block.free = false;
        block.bytes = bytes;
        if size > bytes {
            let rest = Block { bytes: size - bytes, segment: block.segment, free: true };
            self.blocks.insert(ptr + bytes as u64, rest);
            self.free.insert((rest.bytes, ptr + bytes as u64));
        }
        Some(ptr)
    }

    /// A new segment of `bytes` at `base`, all free.
    pub(crate) fn add_segment(&mut self, base: CUdeviceptr, bytes: usize) {
        self.segments.insert(base, bytes);
        self.blocks.insert(base, Block { bytes, segment: base, free: true });
        self.free.insert((bytes, base));
    }

    /// Frees the block at `ptr` (handed out by [`Segments::take`]), merged with the free
    /// blocks right before and after it in its segment. Returns its bytes.
    pub(crate) fn give(&mut self, ptr: CUdeviceptr) -> usize {
        let block = *self.blocks.get(&ptr).expect("a block of the segments");
        assert!(!block.free, "block {ptr:#x} freed twice");
        let (mut start, mut bytes) = (ptr, block.bytes);
        let end = ptr + bytes as u64;
        if let Some(&next) = self.blocks.get(&end).filter(|b| b.free && b.segment == block.segment) {
            self.free.remove(&(next.bytes, end));
            self.blocks.remove(&end);
            bytes += next.bytes;
        }
        let before = self.blocks.range(..ptr).next_back().map(|(&p, &b)| (p, b));
        if let Some((p, prev)) =
            before.filter(|(p, b)| b.free && b.segment == block.segment && *p + b.bytes as u64 == ptr)
        {
            self.free.remove(&(prev.bytes, p));
            self.blocks.remove(&ptr);
            start = p;
            bytes += prev.bytes;
        }
        self.blocks.insert(start, Block { bytes, segment: block.segment, free: true });
        self.free.insert((bytes, start));
        block.bytes
    }

    /// Removes the segments with nothing handed out: their base addresses and bytes, for the
    /// driver to free.
    pub(crate) fn drain_free_segments(&mut self) -> Vec<(CUdeviceptr, usize)> {
        let whole: Vec<(CUdeviceptr, usize)> = (self.segments.iter())
            .filter(|&(base, bytes)| self.blocks.get(base).is_some_and(|b| b.free && b.bytes == *bytes))
            .map(|(&base, &bytes)| (base, bytes))
            .collect();
        for &(base, bytes) in &whole {
            self.segments.remove(&base);
            self.blocks.remove(&base);
            self.free.remove(&(bytes, base));
        }
        whole
    }

    /// Bytes in free blocks.
    pub(crate) fn free_bytes(&self) -> usize {
        self.free.iter().map(|&(bytes, _)| bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: usize = 1 << 20;

    #[test]
    fn segments_hold_several_blocks_and_merge_them_back() {
        let mut s = Segments::default();
        assert_eq!(s.take(3 * MB), None);
        assert_eq!(segment_bytes(3 * MB), 20 * MB);
        assert_eq!(segment_bytes(11 * MB + 1), 12 * MB);
        s.add_segment(0x1000_0000, 20 * MB);
        let a = s.take(3 * MB).unwrap();
        let b = s.take(2 * MB + 512).unwrap();
        let c = s.take(5 * MB).unwrap();
        assert_eq!((a, b, c), (0x1000_0000, a + 3 * MB as u64, b + (2 * MB + 512) as u64));
        assert_eq!(s.free_bytes(), 20 * MB - 10 * MB - 512);
        // Freeing the middle block leaves three free pieces until its neighbours go too.
        assert_eq!(s.give(b), 2 * MB + 512);
        assert_eq!(s.take(2 * MB), Some(b), "best fit: the hole, not the segment's tail");
        s.give(b);
        s.give(a);
        assert_eq!(s.take(5 * MB + 512), Some(a), "a and b merged");
        s.give(a);
        assert!(s.drain_free_segments().is_empty(), "c is still handed out");
        s.give(c);
        assert_eq!(s.drain_free_segments(), vec![(0x1000_0000, 20 * MB)]);
        assert_eq!(s.free_bytes(), 0);
        assert_eq!(s.take(MB + 512), None);
    }

    #[test]
    fn blocks_of_different_segments_do_not_merge() {
        let mut s = Segments::default();
        s.add_segment(0x1000_0000, 2 * MB);
        s.add_segment(0x1000_0000 + 2 * MB as u64, 2 * MB);
        let a = s.take(2 * MB).unwrap();
        let b = s.take(2 * MB).unwrap();
        s.give(a);
        s.give(b);
        assert_eq!(s.take(4 * MB), None, "adjacent segments stay apart (each is freed on its own)");
        assert_eq!(s.drain_free_segments().len(), 2);
    }
}
