//! The one indexing mechanism of the interpreter: a strided [`Layout`] maps every position of
//! a shape (visited in row-major order) to a linear offset, `offset + sum(idx[d] * strides[d])`.
//!
//! Every view and every data movement is a layout: a permute permutes strides, an expand gives
//! broadcast dims stride 0, a slice scales a stride by the step and moves the offset, pad and
//! cat write through a sub-layout of their output, reductions and cumsum visit their operand
//! through a permuted layout, and `iota` is the layout whose only non-zero stride is along its
//! dim.

/// Shape, strides (in elements, possibly negative or zero) and starting offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    pub shape: Vec<usize>,
    pub strides: Vec<isize>,
    pub offset: isize,
}

impl Layout {
    /// Row-major layout of a contiguous tensor.
    pub fn contiguous(shape: &[usize]) -> Layout {
        let strides = coil_ir::graph::contiguous_strides(shape).into_iter().map(|s| s as isize).collect();
        Layout { shape: shape.to_vec(), strides, offset: 0 }
    }

    /// A layout over `shape` with the given strides, starting at 0.
    pub fn strided(shape: &[usize], strides: Vec<isize>) -> Layout {
        debug_assert_eq!(shape.len(), strides.len());
        Layout { shape: shape.to_vec(), strides, offset: 0 }
    }

    /// The layout over `shape` whose value at a position is the position's index along `dim`.
    pub fn coordinate(shape: &[usize], dim: usize) -> Layout {
        let strides = (0..shape.len()).map(|d| (d == dim) as isize).collect();
        Layout::strided(shape, strides)
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Dim `d` of the result is dim `perm[d]` of `self`.
    pub fn permute(&self, perm: &[usize]) -> Layout {
        Layout {
            shape: perm.iter().map(|&p| self.shape[p]).collect(),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
            offset: self.offset,
        }
    }

    /// Broadcasts to `shape`: new leading dims and dims of size 1 get stride 0.
    pub fn expand(&self, shape: &[usize]) -> Layout {
        let lead = shape.len() - self.rank();
        let strides = (0..shape.len())
            .map(|d| match d.checked_sub(lead) {
                Some(s) if self.shape[s] != 1 || shape[d] == 1 => self.strides[s],
                _ => 0,
            })
            .collect();
        Layout { shape: shape.to_vec(), strides, offset: self.offset }
    }

    /// Elements `start, start + step, ...` (`len` of them) along `dim`.
    pub fn slice(&self, dim: usize, start: usize, len: usize, step: i64) -> Layout {
        let mut l = self.clone();
        l.offset += start as isize * self.strides[dim];
        l.strides[dim] *= step as isize;
        l.shape[dim] = len;
        l
    }

    /// The same strides over a different shape (e.g. the sub-block an index tensor covers).
    pub fn with_shape(&self, shape: &[usize]) -> Layout {
        Layout { shape: shape.to_vec(), ..self.clone() }
    }

    /// Zeroes the stride of `dim`, so the offsets ignore the position along it.
    pub fn drop_dim(&self, dim: usize) -> Layout {
        let mut l = self.clone();
        l.strides[dim] = 0;
        l
    }

    /// The linear offset of every position, in row-major order of `shape`.
    pub fn offsets(&self) -> Offsets<'_> {
        Offsets { layout: self, idx: vec![0; self.rank()], cur: self.offset, remaining: self.numel() }
    }
}

/// Iterator over the offsets of a [`Layout`]: an odometer over the shape that adds a stride per
/// step (no divisions).
pub(crate) struct Offsets<'a> {
    layout: &'a Layout,
    idx: Vec<usize>,
    cur: isize,
    remaining: usize,
}

impl Iterator for Offsets<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.remaining == 0 {
            return None;
        }
        let out = self.cur;
        self.remaining -= 1;
        if self.remaining > 0 {
            let Layout { shape, strides, .. } = self.layout;
            for d in (0..shape.len()).rev() {
                self.idx[d] += 1;
                self.cur += strides[d];
                if self.idx[d] < shape[d] {
                    break;
                }
                self.cur -= strides[d] * shape[d] as isize;
                self.idx[d] = 0;
            }
        }
        debug_assert!(out >= 0, "negative offset {out}");
        Some(out as usize)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl ExactSizeIterator for Offsets<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    fn offs(l: &Layout) -> Vec<usize> {
        l.offsets().collect()
    }

    #[test]
    fn contiguous_permute_expand_slice() {
        let l = Layout::contiguous(&[2, 3]);
        assert_eq!(offs(&l), vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(offs(&l.permute(&[1, 0])), vec![0, 3, 1, 4, 2, 5]);
        assert_eq!(offs(&Layout::contiguous(&[3]).expand(&[2, 3])), vec![0, 1, 2, 0, 1, 2]);
        assert_eq!(offs(&Layout::contiguous(&[2, 1]).expand(&[2, 3])), vec![0, 0, 0, 1, 1, 1]);
        assert_eq!(offs(&l.slice(1, 2, 3, -1)), vec![2, 1, 0, 5, 4, 3]);
        assert_eq!(offs(&l.slice(1, 0, 2, 2)), vec![0, 2, 3, 5]);
        assert_eq!(offs(&Layout::contiguous(&[])), vec![0]);
        assert_eq!(offs(&Layout::contiguous(&[2, 0, 3])), Vec::<usize>::new());
        assert_eq!(offs(&Layout::coordinate(&[2, 3], 0)), vec![0, 0, 0, 1, 1, 1]);
    }
}
