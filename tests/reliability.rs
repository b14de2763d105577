//! Regression tests for what the API fuzzer (`tests/fuzz`) and issue 24 found: inputs that
//! crashed, panicked inside coil or gave a wrong answer. Each now gives the same error or the
//! same values on the interpreter and compiled, and never unwinds or aborts.

use coil::{Backend, CrossEntropyOptions, DType, ErrorKind, Result, Tensor};

/// Runs `f` on the interpreter, then compiled (the CPU).
fn on_both<T>(f: impl Fn() -> T) -> [T; 2] {
    let before = coil::backend();
    coil::set_backend(Backend::Interpreter);
    let interpreted = f();
    coil::set_backend(Backend::Compiled);
    coil::set_eager_tier(false);
    let compiled = f();
    coil::set_backend(before);
    [interpreted, compiled]
}

fn index(values: &[i64]) -> Tensor {
    Tensor::from_vec(values.to_vec(), &[values.len()]).unwrap()
}

/// `file:line` of the line before the call site of this macro.
macro_rules! here {
    () => {
        format!("{}:{}", file!(), line!() - 1)
    };
}

/// The error names `op` and the line before the `here!()` the caller passes.
#[track_caller]
fn assert_error_at(e: &coil::Error, kind: ErrorKind, op: &str, at: &str) {
    assert_eq!(e.kind, kind, "{e}");
    assert_eq!(e.op.as_deref(), Some(op), "{e}");
    assert!(e.to_string().contains(at), "{e} should point at {at}");
}

#[test]
fn index_select_of_a_0d_tensor_takes_exactly_one_index() {
    // Was accepted: the interpreter panicked on the empty index and the compiled kernel
    // segfaulted; three indices gave a 0-d result from the compiled backend. PyTorch refuses
    // both ("Index to scalar can have only 1 value").
    let x = Tensor::scalar(1.5f32);
    let e = x.index_select(0, &index(&[])).unwrap_err();
    assert_error_at(&e, ErrorKind::Shape, "index_select", &here!());
    let e = x.index_select(0, &index(&[0, 0, 0])).unwrap_err();
    assert_error_at(&e, ErrorKind::Shape, "index_select", &here!());
    // One index, 1-D or 0-d, selects the element.
    for r in on_both(|| x.index_select(0, &index(&[0]))?.to_vec::<f32>()) {
        assert_eq!(r.unwrap(), vec![1.5]);
    }
    for r in on_both(|| x.index_select(-1, &Tensor::scalar(0i64))?.to_vec::<f32>()) {
        assert_eq!(r.unwrap(), vec![1.5]);
    }
}

#[test]
fn cross_entropy_of_0d_logits_is_an_error() {
    // Was a subtraction overflow (`rank() - 1`) in shape inference.
    let logits = Tensor::scalar(1.5f32);
    let weight = Tensor::ones(&[1], DType::F32);
    let target = Tensor::scalar(0i64);
    let e = logits.cross_entropy_weighted(&target, &weight, CrossEntropyOptions::default()).unwrap_err();
    assert_error_at(&e, ErrorKind::Shape, "cross_entropy", &here!());
    let e = logits.cross_entropy(&target, CrossEntropyOptions::default()).unwrap_err();
    assert_error_at(&e, ErrorKind::Shape, "cross_entropy", &here!());
}

#[test]
fn linear_with_a_bias_and_no_output_features_is_empty() {
    // The compiled backend panicked in the lowering ("index `t1` needs a positive extent, got
    // 0") looking for a bias epilogue on an empty sum.
    let x = Tensor::ones(&[2, 3], DType::F32);
    let (w, b) = (Tensor::ones(&[0, 3], DType::F32), Tensor::ones(&[0], DType::F32));
    for r in on_both(|| {
        let y = x.linear(&w, Some(&b))?;
        Ok::<_, coil::Error>((y.shape().to_vec(), y.to_vec::<f32>()?))
    }) {
        assert_eq!(r.unwrap(), (vec![2, 0], vec![]));
    }
    // An empty batch with a bias, then a comparison (found by the fuzzer, seed 1423).
    let x = Tensor::ones(&[0, 3, 1], DType::F16);
    let (w, b) = (Tensor::ones(&[0, 1], DType::F16), Tensor::ones(&[0], DType::F16));
    for r in on_both(|| x.linear(&w, Some(&b))?.le(0.5)?.triu(-1)?.to_vec::<bool>()) {
        assert_eq!(r.unwrap(), Vec::<bool>::new());
    }
}

#[test]
fn relu_of_bool_is_refused_when_recorded() {
    // Was accepted, then failed at realize with "decomposition of relu produced i64".
    let e = Tensor::ones(&[2], DType::Bool).relu().unwrap_err();
    assert_error_at(&e, ErrorKind::DType, "relu", &here!());
    for r in on_both(|| Tensor::from_vec(vec![3i32, -2], &[2])?.relu()?.to_vec::<i32>()) {
        assert_eq!(r.unwrap(), vec![3, 0]);
    }
}

#[test]
fn zeros_of_a_shape_whose_size_overflows_is_an_error_at_its_line() {
    // Was accepted (and its element count overflowed wherever it was computed).
    let x = Tensor::zeros(&[usize::MAX, 2], DType::F32);
    let at = here!();
    for e in [x.sum_all().unwrap_err(), x.realize().unwrap_err(), x.to_vec::<f32>().unwrap_err()] {
        assert_error_at(&e, ErrorKind::Shape, "full", &at);
    }
    assert!(Tensor::ones(&[1 << 62, 4], DType::F32).realize().is_err());
    // A shape with no elements but strides that overflow cannot exist either (as in PyTorch).
    assert!(Tensor::zeros(&[0, 1 << 62, 4], DType::F32).realize().is_err());
    let e = Tensor::randn(&[usize::MAX, 2], DType::F32).unwrap_err();
    assert_error_at(&e, ErrorKind::Shape, "randn", &here!());
    assert!(Tensor::iota(&[1 << 62, 4], 0).is_err());
    assert!(Tensor::eye(1 << 40, Some(1 << 40), DType::F32).is_err());
}

#[test]
fn repeat_whose_size_overflows_is_an_error() {
    // Wrapped to [18446744073709551614, 2].
    let x = Tensor::ones(&[1, 2], DType::F32);
    let e = x.repeat(&[usize::MAX, 1]).unwrap_err();
    assert_error_at(&e, ErrorKind::Shape, "repeat", &here!());
    let e = x.repeat(&[1 << 62, 4]).unwrap_err();
    assert_error_at(&e, ErrorKind::Shape, "repeat", &here!());
}

#[test]
fn from_vec_with_a_shape_whose_size_wraps_is_an_error() {
    // The element count wrapped to 0, so no values were accepted as filling the shape.
    let e = Tensor::from_vec(Vec::<f32>::new(), &[2, usize::MAX / 2 + 1]).unwrap_err();
    assert_error_at(&e, ErrorKind::Shape, "from_vec", &here!());
}

#[test]
fn views_and_pads_whose_sizes_overflow_are_errors() {
    let x = Tensor::ones(&[1, 2], DType::F32);
    let e = x.expand(&[i64::MAX, 1 << 40, 2]).unwrap_err();
    assert_error_at(&e, ErrorKind::Shape, "expand", &here!());
    assert!(x.reshape(&[i64::MAX, 2, -1]).is_err());
    assert!(x.pad(&[i64::MAX, i64::MAX], 0.0).is_err());
    assert!(x.narrow(1, 0, usize::MAX).is_err());
    assert_eq!(x.slice(1, Some(0), None, i64::MAX).unwrap().shape(), &[1, 1]);
}

#[test]
fn an_allocation_the_host_cannot_make_is_an_error_naming_the_op() {
    // An expand to 2^42 elements then a sum: the interpreter materializes the view (32 TiB of
    // f64) and aborted the process on the allocation.
    coil::set_backend(Backend::Interpreter);
    let y = Tensor::ones(&[1], DType::F32).expand(&[1 << 42]).unwrap().sum_all().unwrap();
    let e = y.to_vec::<f32>().unwrap_err();
    assert_eq!(e.kind, ErrorKind::Runtime, "{e}");
    assert!(e.to_string().contains("out of memory"), "{e}");
    assert_eq!(e.op.as_deref(), Some("expand"), "{e}");
    // Compiled, an output of 2^42 f32 elements (16 TiB) cannot be allocated either.
    coil::set_backend(Backend::Compiled);
    coil::set_eager_tier(false);
    let y = Tensor::ones(&[1], DType::F32).expand(&[1 << 42]).unwrap().add(1.0).unwrap();
    let e = y.realize().unwrap_err();
    assert!(e.to_string().contains("out of memory"), "{e}");
}

#[test]
fn every_result_of_an_op_has_a_shape_that_can_exist() -> Result<()> {
    // Broadcasting two valid shapes can give one that cannot exist.
    let a = Tensor::zeros(&[1 << 40, 1], DType::F32);
    let b = Tensor::zeros(&[1 << 40], DType::F32);
    let e = a.add(&b).unwrap_err();
    assert_error_at(&e, ErrorKind::Shape, "add", &here!());
    // Concatenation and padding check their sums too.
    let big = Tensor::zeros(&[1 << 62], DType::F32);
    assert!(coil::cat(&[&big, &big], 0).is_err());
    assert!(big.pad(&[1 << 62, 0], 0.0).is_err());
    Ok(())
}

#[test]
fn indexing_with_no_elements_to_compute_still_checks_its_indices() {
    // The compiled backend returned an empty result without looking at the indices (the
    // interpreter and PyTorch refuse an index out of bounds even then). Found by the fuzzer,
    // seeds 3937, 4962, 6590.
    let x = Tensor::zeros(&[2, 0, 0], DType::F32);
    for r in on_both(|| x.index_select(1, &index(&[0, 0, 0]))?.to_vec::<f32>()) {
        let e = r.unwrap_err();
        assert!(e.to_string().contains("out of bounds"), "{e}");
    }
    let x = Tensor::zeros(&[4, 3, 0], DType::F32);
    for r in on_both(|| x.index_select(0, &index(&[5, 1]))?.exp()?.to_vec::<f32>()) {
        assert_eq!(r.unwrap_err().kind, ErrorKind::Value);
    }
    let x = Tensor::zeros(&[1, 0], DType::F64);
    let idx = Tensor::from_vec(vec![0i64], &[1, 1]).unwrap();
    for r in on_both(|| x.gather(1, &idx)?.to_vec::<f64>()) {
        assert_eq!(r.unwrap_err().kind, ErrorKind::Value);
    }
    let x = Tensor::zeros(&[2, 0], DType::F32);
    let (idx, src) = (Tensor::from_vec(vec![7i64], &[1, 1]).unwrap(), Tensor::zeros(&[1, 1], DType::F32));
    for r in on_both(|| x.scatter_add(1, &idx, &src)?.to_vec::<f32>()) {
        assert_eq!(r.unwrap_err().kind, ErrorKind::Value);
    }
    // An op with elements whose only reader has none still reports its bad indices, and
    // integer divisions by zero (seeds 16333, 21860).
    let x = Tensor::zeros(&[0, 1, 3], DType::I16);
    let empty = Tensor::zeros(&[3, 0, 3], DType::I64);
    for r in on_both(|| x.index_select(0, &index(&[0, 0, 0]))?.gather(-1, &empty)?.to_vec::<i16>()) {
        assert_eq!(r.unwrap_err().kind, ErrorKind::Value);
    }
    let ints = Tensor::from_vec(vec![1i64, 2], &[2, 1]).unwrap();
    for r in on_both(|| ints.floor_divide(0)?.expand(&[2, 0])?.to_vec::<i64>()) {
        assert_eq!(r.unwrap_err().kind, ErrorKind::Value);
    }
    // Nor when only part of the result is read: a slice, or rows picked by another index
    // (seed 35651: the compiled backend computed only the selected element).
    let x = Tensor::from_vec(vec![-0.75f32, -3.75], &[2]).unwrap();
    for r in on_both(|| x.gather(0, &index(&[1, 1, 2]))?.select(0, 1)?.gelu(true)?.to_vec::<f32>()) {
        assert_eq!(r.unwrap_err().kind, ErrorKind::Value);
    }
    for r in on_both(|| x.gather(0, &index(&[1, 1, 2]))?.exp()?.index_select(0, &index(&[0]))?.to_vec::<f32>()) {
        assert_eq!(r.unwrap_err().kind, ErrorKind::Value);
    }
    let ints = Tensor::from_vec(vec![4i64, 2, 0], &[3]).unwrap();
    for r in on_both(|| Tensor::full(&[3], 8i64, DType::I64).floor_divide(&ints)?.narrow(0, 0, 2)?.to_vec::<i64>()) {
        assert_eq!(r.unwrap_err().kind, ErrorKind::Value);
    }
    // In bounds, the empty result is fine.
    let x = Tensor::zeros(&[4, 3, 0], DType::F32);
    for r in on_both(|| x.index_select(0, &index(&[3, 1]))?.to_vec::<f32>()) {
        assert_eq!(r.unwrap(), Vec::<f32>::new());
    }
}

#[test]
fn linear_refuses_a_bias_that_does_not_expand_to_its_output() {
    // A bias of 2 features on 1 output feature was accepted, and the decomposition then made
    // a result of another shape ("produced f32[1, 2] where the captured graph has f32[1, 1]").
    // Found by the fuzzer, seed 41455. PyTorch refuses it.
    let x = Tensor::ones(&[3, 4], DType::F32);
    let e = x.linear(&Tensor::ones(&[1, 4], DType::F32), Some(&Tensor::ones(&[2], DType::F32))).unwrap_err();
    assert_error_at(&e, ErrorKind::Shape, "linear", &here!());
    // A bias that expands is fine: one value, or a row per output row.
    let w = Tensor::ones(&[2, 4], DType::F32);
    for bias in [Tensor::ones(&[1], DType::F32), Tensor::ones(&[3, 2], DType::F32)] {
        for r in on_both(|| x.linear(&w, Some(&bias))?.to_vec::<f32>()) {
            assert_eq!(r.unwrap(), vec![5.0; 6]);
        }
    }
}

#[test]
fn a_value_recomputed_in_two_kernels_is_the_same_value() {
    // Softmax along a middle dim runs as two kernels that both compute gelu(x) * y: the C
    // compiler contracted `x * y - max` into a fused multiply-add in one of them, so `x - max`
    // was the product's rounding error (1e31 near the largest f32) instead of 0, and the
    // softmax gave inf where it is 1. Found by the fuzzer, seed 41079.
    let mut x = vec![1.0f32; 2 * 3 * 2 * 7];
    for (b, v) in [-1.5e-45f32, 4.53125, 1e38].into_iter().enumerate() {
        x[((3 + b) * 2) * 7 + 1] = v; // [1, b, 0, 1]
    }
    let x = Tensor::from_vec(x, &[2, 3, 2, 7]).unwrap();
    let mut y = vec![1.0f32; 14];
    y[1] = 2.109375;
    let y = Tensor::from_vec(y, &[2, 7]).unwrap();
    for r in on_both(|| x.gelu(false)?.mul(&y)?.softmax(1)?.to_vec::<f32>()) {
        let v = r.unwrap();
        assert_eq!(v[((3 + 2) * 2) * 7 + 1], 1.0);
        assert!(v.iter().all(|p| (0.0..=1.0).contains(p)), "{v:?}");
    }
}

#[test]
fn splitting_into_more_pieces_than_the_host_can_hold_is_an_error() {
    // `split(1)` of a dim of 2^42 aborted the process allocating the pieces' sizes. Found by
    // the fuzzer, seed 61990.
    let x = Tensor::zeros(&[1 << 42, 2], DType::F32);
    let e = x.split(1, 0).unwrap_err();
    assert_error_at(&e, ErrorKind::Runtime, "split", &here!());
    assert!(e.to_string().contains("out of memory"), "{e}");
    let e = Tensor::zeros(&[0], DType::F32).chunk(usize::MAX, 0).unwrap_err();
    assert_error_at(&e, ErrorKind::Runtime, "chunk", &here!());
    let e = Tensor::zeros(&[3], DType::F32).split_sizes(&[usize::MAX, 4], 0).unwrap_err();
    assert_error_at(&e, ErrorKind::Shape, "split_with_sizes", &here!());
}

#[test]
fn ops_pytorch_has_no_bool_kernel_for_are_refused_when_recorded() {
    // Accepted before (PyTorch: "abs_cpu" not implemented for 'Bool', "argmax(): does not
    // support bool input", "div_floor_cpu" not implemented for 'Bool').
    let b = Tensor::from_vec(vec![true, false], &[2]).unwrap();
    for (op, r) in [
        ("abs", b.abs()),
        ("floor", b.floor()),
        ("ceil", b.ceil()),
        ("round", b.round()),
        ("trunc", b.trunc()),
        ("floor_divide", b.floor_divide(&b)),
        ("trunc_divide", b.trunc_divide(&b)),
        ("remainder", b.remainder(&b)),
        ("argmax", b.argmax(None, false)),
        ("argmin", b.argmin(Some(0), false)),
    ] {
        let e = r.unwrap_err();
        assert_eq!((e.kind, e.op.as_deref()), (ErrorKind::DType, Some(op)), "{e}");
    }
    // What PyTorch allows on bool stays allowed: the max along a dim (with its argmax), a
    // division by an integer, the sign.
    let (values, indices) = b.max_dim(0, false).unwrap();
    assert_eq!((values.item::<bool>().unwrap(), indices.item::<i64>().unwrap()), (true, 0));
    assert_eq!(b.floor_divide(2).unwrap().to_vec::<i64>().unwrap(), vec![0, 0]);
    assert_eq!(b.sign().unwrap().to_vec::<bool>().unwrap(), vec![true, false]);
}

#[test]
fn dropping_a_long_chain_of_tensors_does_not_overflow_the_stack() {
    // A loop that feeds each step's result to the next keeps every step's tensor alive through
    // its sources; dropping the last one dropped the chain recursively (a stack overflow at
    // about a thousand decode steps). The test thread's stack is 2 MiB.
    let mut x = Tensor::from_vec(vec![1.0f32], &[1]).unwrap();
    for _ in 0..200_000 {
        x = x.add(1.0).unwrap();
    }
    drop(x);
}
