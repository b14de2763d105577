//! Strided views for the tier-0 executor: a view op (reshape, permute, expand, slice) of a
//! stored value is a new [`Layout`] over the same elements, read in place chunk by chunk, never
//! copied (but a reshape that no strides express, which the executor stores first).

/// A view's elements in its base's row-major storage: element `idx` lies at `offset +
/// sum(idx[d] * strides[d])`. The interpreter's layout (its views: `permute`, `expand`,
/// `slice`), with what tier 0 adds below: reshapes as strides, bounds, chunked reads.
pub(super) use crate::interp::Layout;

/// Row-major strides of `shape`.
fn row_major(shape: &[usize]) -> Vec<isize> {
    coil_ir::graph::contiguous_strides(shape).into_iter().map(|s| s as isize).collect()
}

impl Layout {
    /// Whether the elements are consecutive in row-major order (from `offset`).
    pub fn is_contiguous(&self) -> bool {
        let mut want = 1isize;
        for (&n, &s) in self.shape.iter().zip(&self.strides).rev() {
            if n > 1 && s != want {
                return false;
            }
            want *= n as isize;
        }
        true
    }

    /// `reshape(shape)` as strides over the same elements, where some express it (PyTorch's
    /// `computeStride`: each group of old dims that is contiguous in itself splits or merges
    /// freely); `None` where the view must be copied first.
    pub fn reshape(&self, shape: &[usize]) -> Option<Layout> {
        let contiguous = |offset| Some(Layout { shape: shape.to_vec(), strides: row_major(shape), offset });
        if self.numel() <= 1 || self.is_contiguous() {
            return contiguous(self.offset);
        }
        let mut strides = vec![0isize; shape.len()];
        let mut view_d = shape.len() as isize - 1;
        let mut base = *self.strides.last()?;
        let (mut tensor_numel, mut view_numel) = (1isize, 1isize);
        for d in (0..self.shape.len()).rev() {
            tensor_numel *= self.shape[d] as isize;
            let group_ends = d == 0 || (self.shape[d - 1] != 1 && self.strides[d - 1] != tensor_numel * base);
            if group_ends {
                while view_d >= 0 && (view_numel < tensor_numel || shape[view_d as usize] == 1) {
                    strides[view_d as usize] = view_numel * base;
                    view_numel *= shape[view_d as usize] as isize;
                    view_d -= 1;
                }
                if view_numel != tensor_numel {
                    return None;
                }
                if d > 0 {
                    base = self.strides[d - 1];
                    tensor_numel = 1;
                    view_numel = 1;
                }
            }
        }
        (view_d == -1).then(|| Layout { shape: shape.to_vec(), strides, offset: self.offset })
    }

    /// Whether every element lies in a base of `len` elements (checked once per view, so that
    /// reads cannot leave the base whatever the graph says).
    pub fn fits(&self, len: usize) -> bool {
        if self.numel() == 0 {
            return true;
        }
        let (mut lo, mut hi) = (self.offset, self.offset);
        for (&n, &s) in self.shape.iter().zip(&self.strides) {
            let reach = (n as isize - 1) * s;
            if reach < 0 {
                lo += reach;
            } else {
                hi += reach;
            }
        }
        lo >= 0 && (hi as usize) < len
    }

    /// Elements `start .. start + out.len()` of the view (row-major order), converted by `f`,
    /// into `out`. Consecutive runs along the last dim are read in one loop each.
    pub fn read<S: Copy, T: Copy>(&self, src: &[S], start: usize, out: &mut [T], f: impl Fn(S) -> T) {
        let n = out.len();
        if n == 0 {
            return;
        }
        if self.is_contiguous() {
            let first = self.offset as usize + start;
            for (o, &s) in out.iter_mut().zip(&src[first..first + n]) {
                *o = f(s);
            }
            return;
        }
        let nd = self.shape.len();
        let mut heap = Vec::new();
        let mut stack = [0usize; 8];
        let idx: &mut [usize] = if nd <= 8 {
            &mut stack[..nd]
        } else {
            heap.resize(nd, 0);
            &mut heap
        };
        let mut rem = start;
        let mut pos = self.offset;
        for d in (0..nd).rev() {
            idx[d] = rem % self.shape[d];
            rem /= self.shape[d];
            pos += idx[d] as isize * self.strides[d];
        }
        let last = nd - 1;
        let (len, stride) = (self.shape[last], self.strides[last]);
        let mut k = 0;
        while k < n {
            let run = (len - idx[last]).min(n - k);
            if stride == 0 {
                let v = f(src[pos as usize]);
                // (a broadcast row: one read)
                out[k..k + run].fill(v);
            } else if stride == 1 {
                let first = pos as usize;
                for (o, &s) in out[k..k + run].iter_mut().zip(&src[first..first + run]) {
                    *o = f(s);
                }
            } else {
                let mut p = pos;
                for o in &mut out[k..k + run] {
                    *o = f(src[p as usize]);
                    p += stride;
                }
            }
            k += run;
            idx[last] += run;
            pos += run as isize * stride;
            if idx[last] == len {
                pos -= len as isize * stride;
                idx[last] = 0;
                for d in (0..last).rev() {
                    idx[d] += 1;
                    pos += self.strides[d];
                    if idx[d] < self.shape[d] {
                        break;
                    }
                    pos -= self.shape[d] as isize * self.strides[d];
                    idx[d] = 0;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elements(l: &Layout, src: &[i64]) -> Vec<i64> {
        let mut out = vec![0; l.numel()];
        l.read(src, 0, &mut out, |x| x);
        out
    }

    #[test]
    fn views_read_what_the_ops_mean() {
        let src: Vec<i64> = (0..24).collect();
        let base = Layout::contiguous(&[2, 3, 4]);
        let t = base.permute(&[2, 0, 1]);
        assert_eq!(elements(&t, &src)[..6], [0, 4, 8, 12, 16, 20]);
        // a transposed view reshaped: merging dims 1 and 2 of [4, 2, 3] is a stride of 4
        let r = t.reshape(&[4, 6]).expect("contiguous groups merge");
        assert_eq!(elements(&r, &src)[..7], [0, 4, 8, 12, 16, 20, 1]);
        assert_eq!(t.reshape(&[24]), None, "a transposed whole is not a view");
        let s = base.slice(2, 3, 4, -1); // flip the last dim
        assert_eq!(elements(&s, &src)[..5], [3, 2, 1, 0, 7]);
        let e = Layout::contiguous(&[3]).expand(&[2, 3]);
        assert_eq!(elements(&e, &src), [0, 1, 2, 0, 1, 2]);
        let col = Layout::contiguous(&[2, 1]).expand(&[2, 3]);
        assert_eq!(elements(&col, &src), [0, 0, 0, 1, 1, 1]);
        // a chunk starting mid-row
        let mut part = vec![0; 4];
        t.read(&src, 5, &mut part, |x| x);
        assert_eq!(part, [20, 1, 5, 9]);
        assert!(t.fits(24) && !t.fits(23) && s.fits(24));
    }
}
