//! In-place ops (`add_`, `copy_`, `index_copy_`, slice assignment, ...): the functional op written
//! back over the tensor, PyTorch's values and dtype/shape rules, and PyTorch's aliasing: views
//! and other handles of a written tensor read its new values, writes through views reach their
//! base, eager and inside compiled functions, interpreted and compiled.

use coil::{DType, ErrorKind, Tensor};
use std::sync::Mutex;

/// Held by every test: one of them counts the process's compiles.
static ALONE: Mutex<()> = Mutex::new(());

fn alone() -> std::sync::MutexGuard<'static, ()> {
    ALONE.lock().unwrap_or_else(|e| e.into_inner())
}

fn t(v: &[f32], shape: &[usize]) -> Tensor {
    let x = Tensor::from_vec(v.to_vec(), shape).unwrap();
    x.realize().unwrap();
    x
}

#[test]
fn arithmetic_in_place_writes_over_computed_elements() {
    let _alone = alone();
    let mut x = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let old = x.clone();
    let pending = &x * 1.0; // recorded before the write, not computed
    x.add_(t(&[10.0, 20.0, 30.0], &[3])).unwrap(); // broadcast along rows
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![11.0, 22.0, 33.0, 14.0, 25.0, 36.0]);
    assert_eq!(old.to_vec::<f32>().unwrap(), x.to_vec::<f32>().unwrap(), "the old handle reads the new values");
    assert_eq!(pending.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], "recorded before: old values");
    x.mul_(2.0).unwrap();
    x.sub_(1).unwrap();
    x.div_(t(&[1.0, 2.0, 4.0], &[3])).unwrap();
    x.clamp_max_(30.0).unwrap();
    x.clamp_min_(10.0).unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![21.0, 21.5, 16.25, 27.0, 24.5, 17.75]);
    x.pow_(0.5).unwrap();
    assert!((x.to_vec::<f32>().unwrap()[0] - 21f32.sqrt()).abs() < 1e-6);
}

#[test]
fn pending_tensors_are_computed_then_written() {
    let _alone = alone();
    let mut x = Tensor::arange(0, 4, 1, DType::F32).unwrap(); // pending: computed first
    let view = x.narrow(0, 2, 2).unwrap();
    x.add_(1.0).unwrap();
    x.mul_(3.0).unwrap();
    assert!(x.is_realized(), "written as PyTorch's eager ops write");
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![3.0, 6.0, 9.0, 12.0]);
    assert_eq!(view.to_vec::<f32>().unwrap(), vec![9.0, 12.0]);
}

#[test]
fn results_cast_to_the_tensors_dtype_where_pytorch_allows() {
    let _alone = alone();
    let mut f = t(&[1.5, 2.5], &[2]);
    f.add_(Tensor::from_vec(vec![1i64, 2], &[2]).unwrap()).unwrap(); // int into float: fine
    assert_eq!((f.dtype(), f.to_vec::<f32>().unwrap()), (DType::F32, vec![2.5, 4.5]));
    let mut h = t(&[1.0, 2.0], &[2]).to_dtype(DType::BF16).unwrap();
    h.mul_(t(&[0.5, 0.25], &[2])).unwrap(); // f32 operand: the result is cast back to bf16
    assert_eq!((h.dtype(), h.to_vec::<f32>().unwrap()), (DType::BF16, vec![0.5, 0.5]));

    let mut i = Tensor::from_vec(vec![1i64, 2], &[2]).unwrap();
    let line = line!() + 1;
    let e = i.add_(0.5).unwrap_err();
    assert_eq!(e.kind, ErrorKind::DType, "{e}");
    assert!(e.to_string().contains("add_") && e.to_string().contains(&format!("inplace_ops.rs:{line}")), "{e}");
    assert!(i.div_(2).is_err(), "true division of an integer tensor in place is an error, as in PyTorch");
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![1, 2], "a refused op leaves the tensor as it was");
    let mut b = Tensor::from_vec(vec![true, false], &[2]).unwrap();
    assert!(b.add_(1).is_err(), "only a bool goes into a bool tensor");
}

#[test]
fn the_other_operand_broadcasts_to_the_tensor_not_the_reverse() {
    let _alone = alone();
    let mut x = t(&[1.0, 2.0, 3.0], &[3]);
    let line = line!() + 1;
    let e = x.add_(t(&[0.0; 6], &[2, 3])).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Shape, "{e}");
    assert!(e.to_string().contains(&format!("inplace_ops.rs:{line}")), "{e}");
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
}

#[test]
fn copies_fills_and_indexed_writes_match_pytorch() {
    let _alone = alone();
    // torch: x = zeros(4, 2); x.copy_(tensor([1, 2])); x.index_copy_(0, tensor([2]), ...)
    let mut x = Tensor::zeros(&[4, 2], DType::F32);
    x.realize().unwrap();
    x.copy_(&Tensor::from_vec(vec![1i64, 2], &[2]).unwrap()).unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0, 2.0]);
    x.index_copy_(0, &Tensor::from_vec(vec![2i64], &[1]).unwrap(), &t(&[7.0, 8.0], &[1, 2])).unwrap();
    x.index_add_(0, &Tensor::from_vec(vec![0i64, 0], &[2]).unwrap(), &t(&[1.0, 1.0, 2.0, 2.0], &[2, 2]), 10.0).unwrap();
    x.index_fill_(1, &Tensor::from_vec(vec![1i64], &[1]).unwrap(), -1.0).unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![31.0, -1.0, 1.0, -1.0, 7.0, -1.0, 1.0, -1.0]);
    x.masked_fill_(&Tensor::from_vec(vec![true, false], &[2]).unwrap(), 0.0).unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![0.0, -1.0, 0.0, -1.0, 0.0, -1.0, 0.0, -1.0]);
    // x[1:4:2, :] = tensor([5., 6.])
    x.slice_assign_(0, Some(1), Some(4), 2, &t(&[5.0, 6.0], &[2])).unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![0.0, -1.0, 5.0, 6.0, 0.0, -1.0, 5.0, 6.0]);
    x.fill_(3).unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![3.0; 8]);
    x.zero_().unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![0.0; 8]);
}

/// A static cache written at a run-time position, step after step, with `index_copy_`: each
/// step's write compiles once and serves every position.
#[test]
fn a_cache_written_at_run_time_positions_compiles_once() {
    // Counts compiles: tier 0's background compiles would land in the count at any time.
    coil::set_eager_tier(false);
    let _alone = alone();
    let mut cache = Tensor::zeros(&[8, 3], DType::F32);
    cache.realize().unwrap();
    let mut after_second = 0;
    for step in 0..8i64 {
        let pos = Tensor::from_vec(vec![step], &[1]).unwrap();
        let row = Tensor::from_vec(vec![step as f32; 3], &[1, 3]).unwrap(); // data, not a constant
        cache.index_copy_(0, &pos, &row).unwrap();
        if step == 1 {
            after_second = coil::compile_count();
        }
    }
    assert_eq!(coil::compile_count(), after_second, "later steps reuse the step's graph");
    let want: Vec<f32> = (0..8).flat_map(|s| [s as f32; 3]).collect();
    assert_eq!(cache.to_vec::<f32>().unwrap(), want);
}

/// Values of a normal-ish distribution, none zero (splitmix64), so that a copy of the wrong
/// element, or no copy, shows.
fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9E3779B97F4A7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
            let u = ((z ^ (z >> 31)) >> 11) as f32 / (1u64 << 53) as f32; // [0, 1)
            (u - 0.5) * 4.0 + if u < 0.5 { -0.25 } else { 0.25 }
        })
        .collect()
}

/// A KV cache written at positions `pos..pos + T` read when the graph runs (`pos` a 0-d
/// tensor), as `CausalSelfAttention::forward_cached` writes it: compiled, the scatter is a
/// generated kernel storing the new values (here `2 * new`, computed in the same kernel) into
/// the cache at the position it reads; it agrees with the interpreter at the first position, a
/// middle one and the last valid one, written into a new tensor (the cache copied first) and
/// over the cache itself (`update_in_place`: the donated cache is written where it is).
#[test]
fn a_cache_written_at_run_time_positions_by_a_generated_kernel_matches_the_interpreter() {
    use coil::Backend;
    let _alone = alone();
    let before = coil::backend();
    let (b, h, cap, d, steps) = (2usize, 3usize, 8usize, 5usize, 3usize);
    let write = |cache: &Tensor, new: &Tensor, pos: &Tensor| -> coil::Result<Tensor> {
        let positions = Tensor::iota(&[steps], 0)?.add(pos)?.reshape(&[1, 1, steps as i64, 1])?;
        cache.scatter(2, &positions.broadcast_to(new.shape())?, &new.mul(2.0)?)
    };
    for pos in [0i64, 2, (cap - steps) as i64] {
        let mut seen = vec![];
        for backend in [Backend::Interpreter, Backend::Compiled] {
            coil::set_backend(backend);
            coil::set_eager_tier(false);
            let cache = t(&noise(b * h * cap * d, 1), &[b, h, cap, d]);
            let new = t(&noise(b * h * steps * d, 2 + pos as u64), &[b, h, steps, d]);
            let p = Tensor::from_vec(vec![pos], &[]).unwrap();
            let copied = write(&cache, &new, &p).unwrap().to_vec::<f32>().unwrap();
            let old = cache.to_vec::<f32>().unwrap();
            let written = write(&cache, &new, &p).unwrap();
            coil::update_in_place(&[(&cache, &written)]).unwrap();
            let in_place = cache.to_vec::<f32>().unwrap();
            // The positions written hold 2 * new; the others the old cache.
            let at = |bh: usize, s: usize, k: usize| (bh * cap + s) * d + k;
            let twice: Vec<f32> = new.to_vec::<f32>().unwrap().iter().map(|v| 2.0 * v).collect();
            for bh in 0..b * h {
                for s in 0..cap {
                    for k in 0..d {
                        let inside = (pos as usize..pos as usize + steps).contains(&s);
                        let want =
                            if inside { twice[(bh * steps + s - pos as usize) * d + k] } else { old[at(bh, s, k)] };
                        assert_eq!(copied[at(bh, s, k)], want, "{backend:?} pos={pos} at [{bh}, {s}, {k}]");
                    }
                }
            }
            assert_eq!(in_place, copied, "{backend:?} pos={pos}: written in place");
            seen.push(copied);
        }
        assert_eq!(seen[0], seen[1], "pos={pos}: compiled and interpreted");
    }
    coil::set_backend(before);
}

/// A cache write whose window reaches outside the cache (past its end, partly or wholly, or
/// before its start) is the scatter's index error and writes nothing: the cache written over
/// in place keeps every old value, on both backends (the compiled kernel checks the window
/// once, before any store; PyTorch's `index_copy_` raises before it writes).
#[test]
fn a_cache_write_out_of_range_leaves_the_cache_as_it_was() {
    use coil::Backend;
    let _alone = alone();
    let before = coil::backend();
    let (b, cap, d, steps) = (2usize, 8usize, 4usize, 3usize);
    for pos in [6i64, 8, -1] {
        for backend in [Backend::Interpreter, Backend::Compiled] {
            coil::set_backend(backend);
            coil::set_eager_tier(false);
            let cache = t(&noise(b * cap * d, 3), &[b, 1, cap, d]);
            let new = t(&noise(b * steps * d, 4), &[b, 1, steps, d]);
            let old = cache.to_vec::<f32>().unwrap();
            let p = Tensor::from_vec(vec![pos], &[]).unwrap();
            let positions =
                Tensor::iota(&[steps], 0).unwrap().add(&p).unwrap().reshape(&[1, 1, steps as i64, 1]).unwrap();
            let written = cache.scatter(2, &positions.broadcast_to(new.shape()).unwrap(), &new.exp().unwrap()).unwrap();
            let e = coil::update_in_place(&[(&cache, &written)]).unwrap_err().to_string();
            let first = if pos < 0 { pos } else { pos.max(cap as i64) };
            assert!(
                e.contains(&format!("index {first} is out of bounds for dim 2 with size {cap}")),
                "{backend:?}: {e}"
            );
            assert_eq!(cache.to_vec::<f32>().unwrap(), old, "{backend:?} pos={pos}: nothing written");
        }
    }
    coil::set_backend(before);
}

/// PyTorch's aliasing, run eagerly and inside a compiled function, on both backends: the same
/// program as this torch code gives the same values.
/// ```python
/// x = a.clone()                  # [3, 4]
/// before = x.sum()
/// rows, col, tr = x[1:3], x[:, 1], x.t()
/// x.add_(1)                      # views see it
/// x[0].mul_(b)                   # a write through a temporary view reaches x and its views
/// tr[2:4, 1:3].fill_(-1)          # a view of a view of a transpose
/// flat = x.view(12); flat[::5].zero_()
/// return x, rows, col, tr.contiguous(), before
/// ```
#[test]
fn views_and_bases_see_each_others_writes_eager_and_compiled_on_both_backends() {
    let _alone = alone();
    fn program(a: &Tensor, b: &Tensor) -> coil::Result<Vec<Tensor>> {
        let mut x = a.clone();
        let before = x.sum_all()?;
        let (rows, col, tr) = (x.narrow(0, 1, 2)?, x.select(1, 1)?, x.t()?);
        x.add_(1.0)?;
        x.select(0, 0)?.mul_(b)?;
        tr.narrow(0, 2, 2)?.narrow(1, 1, 2)?.fill_(-1.0)?;
        x.view(&[12])?.slice(0, None, None, 5)?.zero_()?;
        Ok(vec![x, rows, col, tr.contiguous(), before])
    }
    let a0: Vec<f32> = (0..12).map(|i| i as f32 * 0.5 - 2.0).collect();
    let b0 = vec![2.0f32, -1.0, 0.5, 3.0];
    // The torch program above, by hand.
    let mut x: Vec<f32> = a0.iter().map(|v| v + 1.0).collect();
    for j in 0..4 {
        x[j] *= b0[j];
    }
    for (i, j) in [(1, 2), (1, 3), (2, 2), (2, 3)] {
        x[i * 4 + j] = -1.0;
    }
    for k in [0, 5, 10] {
        x[k] = 0.0;
    }
    let tr: Vec<f32> = (0..12).map(|k| x[(k % 3) * 4 + k / 3]).collect();
    let want = vec![x.clone(), x[4..].to_vec(), vec![x[1], x[5], x[9]], tr, vec![a0.iter().sum()]];
    for backend in [coil::Backend::Interpreter, coil::Backend::Compiled] {
        coil::set_backend(backend);
        coil::set_eager_tier(false);
        let (a, b) = (t(&a0, &[3, 4]), t(&b0, &[4]));
        let eager = program(&a, &b).unwrap();
        let f = coil::compile(|args: &[Tensor]| program(&args[0], &args[1]));
        let (a2, b2) = (t(&a0, &[3, 4]), t(&b0, &[4]));
        let compiled = f.call(&[&a2, &b2]).unwrap();
        for (how, outs) in [("eager", &eager), ("compiled", &compiled)] {
            for (k, (got, want)) in outs.iter().zip(&want).enumerate() {
                assert_eq!(&got.to_vec::<f32>().unwrap(), want, "{backend:?} {how}: output {k}");
            }
        }
        assert_eq!(a.to_vec::<f32>().unwrap(), x, "{backend:?}: eager writes reach the input's handle");
        assert_eq!(a2.to_vec::<f32>().unwrap(), x, "{backend:?}: the compiled call writes its argument back");
    }
    coil::set_backend(coil::Backend::Compiled);
    coil::set_eager_tier(false);
}
