//! Bad input gives a clear error that names the op, the operands and the user's line; never a
//! panic from inside the library.

use coil::{Backend, DType, ErrorKind, Tensor};

fn f32s(shape: &[usize]) -> Tensor {
    Tensor::ones(shape, DType::F32)
}

/// `file:line` of the line before the call site of this macro.
macro_rules! here {
    () => {
        format!("{}:{}", file!(), line!() - 1)
    };
}

#[test]
fn matmul_error_names_op_shapes_and_line() {
    let (a, b) = (f32s(&[2, 3]), f32s(&[4, 5]));
    let e = a.matmul(&b).unwrap_err();
    let at = here!();
    assert_eq!(e.kind, ErrorKind::Shape);
    assert_eq!(e.op.as_deref(), Some("matmul"));
    let msg = e.to_string();
    assert!(msg.contains("f32[2, 3]") && msg.contains("f32[4, 5]"), "{msg}");
    assert!(msg.contains(&at), "{msg} should point at {at}");
}

#[test]
fn broadcast_error_in_method() {
    let e = f32s(&[2, 3]).add(f32s(&[4])).unwrap_err();
    let at = here!();
    assert!(e.to_string().starts_with(&format!("shape error in add at {at}")), "{e}");
}

#[test]
fn operator_panics_with_the_same_message_at_the_caller() {
    let (a, b) = (f32s(&[2, 3]), f32s(&[4]));
    let payload = std::panic::catch_unwind(|| &a + &b).unwrap_err();
    let at = here!();
    let msg = payload.downcast_ref::<String>().expect("a String panic message");
    assert!(msg.starts_with("shape error in add at"), "{msg}");
    assert!(msg.contains(&at), "{msg} should point at {at}");
}

#[test]
fn dtype_errors() {
    let i = Tensor::ones(&[3], DType::I64);
    assert_eq!(i.softmax(0).unwrap_err().kind, ErrorKind::DType);
    assert_eq!(i.mean(&[], false).unwrap_err().kind, ErrorKind::DType);
    let b = Tensor::ones(&[3], DType::Bool);
    assert_eq!(b.neg().unwrap_err().kind, ErrorKind::DType);
    assert_eq!(coil::where_(&f32s(&[3]), 1.0, 0.0).unwrap_err().kind, ErrorKind::DType);
}

#[test]
fn bad_arguments_are_errors() {
    let x = f32s(&[2, 3]);
    assert!(x.reshape(&[5, -1]).is_err());
    assert!(x.reshape(&[-1, -1]).is_err());
    assert!(x.permute(&[0, 0]).is_err());
    assert!(x.sum(&[2], false).is_err());
    assert!(x.softmax(-3).is_err());
    assert!(x.expand(&[4, 4]).is_err());
    assert!(x.narrow(1, 2, 5).is_err());
    assert!(x.select(0, 2).is_err());
    assert!(x.chunk(0, 0).is_err());
    assert!(coil::cat(&[&x, &f32s(&[2, 4])], 0).is_err());
    assert!(coil::cat(&[], 0).is_err());
    assert!(Tensor::from_vec(vec![1.0f32; 5], &[2, 3]).is_err());
    assert!(Tensor::arange(0.0, 5.0, 0.0, DType::F32).is_err());
    assert!(x.dropout(1.5, true).is_err());
    assert!(x.item::<f32>().is_err());
}

#[test]
fn data_errors_surface_when_values_are_computed() {
    // An index out of range can only be seen when the graph runs: realizing reports it.
    let x = f32s(&[4, 3]);
    let idx = Tensor::from_vec(vec![0i64, 7], &[2]).unwrap();
    let y = x.index_select(0, &idx).unwrap();
    let e = y.to_vec::<f32>().unwrap_err();
    assert!(e.to_string().contains("out of bounds"), "{e}");
    let ints = Tensor::from_vec(vec![1i64, 2], &[2]).unwrap();
    assert!(ints.floor_divide(0).unwrap().to_vec::<i64>().is_err());
}

// ---- data errors: the same on every backend, outside and inside a compiled function ----

fn index(values: &[i64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(values.to_vec(), shape).unwrap()
}

/// The error's text without the ` (kernel …)` that the compiled path adds to the op.
fn without_kernel(e: &coil::Error) -> String {
    let s = e.to_string();
    match s.find(" (kernel ") {
        Some(start) => {
            let end = start + s[start..].find(')').expect("closed") + 1;
            format!("{}{}", &s[..start], &s[end..])
        }
        None => s,
    }
}

/// `make` records an op whose data is wrong (at the line `at`); computing it fails. The error
/// names `op`, its `operands` and `at`, word for word the same on the interpreter and compiled
/// (but for the kernel the compiled path names too), outside and inside `coil::compile`, and
/// not the line that asked for the values.
fn assert_data_error<F: Fn() -> coil::Result<Tensor> + Clone>(op: &str, operands: &str, at: &str, make: F) {
    let before = coil::backend();
    let mut seen: Vec<(Backend, &str, coil::Error)> = vec![];
    for backend in [Backend::Interpreter, Backend::Compiled] {
        coil::set_backend(backend);
        coil::set_eager_tier(false);
        seen.push((backend, "realize", make().unwrap().realize().unwrap_err()));
        let body = {
            let make = make.clone();
            move |_: &[Tensor]| Ok(vec![make()?])
        };
        let f = coil::compile(body);
        for _ in 0..3 {
            seen.push((backend, "compiled function", f.call(&[]).unwrap_err()));
        }
    }
    coil::set_backend(before);
    let reference = without_kernel(&seen[0].2);
    for (backend, how, e) in &seen {
        let msg = e.to_string();
        let what = format!("{backend:?} {how}: {msg}");
        assert_eq!(e.kind, ErrorKind::Value, "{what}");
        assert!(msg.starts_with(&format!("value error in {op}")), "{what} should name {op}");
        assert!(msg.contains(&format!("; operands: {operands}")), "{what} should list {operands}");
        assert!(msg.contains(&format!(" at {at}: ")), "{what} should point at {at}");
        assert_eq!(without_kernel(e), reference, "{backend:?} {how}");
    }
}

#[test]
fn index_errors_name_the_op_operands_and_line_on_every_backend() {
    let (w, idx) = (f32s(&[5, 3]), index(&[0, 7], &[2]));
    let embedding = || coil::embedding(&idx, &w)?.exp();
    let at = here!();
    assert_data_error("index_select", "f32[5, 3], i64[2]", &at, embedding);
    let index_select = || w.index_select(0, &idx)?.exp();
    let at = here!();
    assert_data_error("index_select", "f32[5, 3], i64[2]", &at, index_select);

    let (x, idx, src) = (f32s(&[2, 3]), index(&[0, 5], &[2, 1]), f32s(&[2, 1]));
    let gather = || x.gather(1, &idx)?.exp();
    let at = here!();
    assert_data_error("gather", "f32[2, 3], i64[2, 1]", &at, gather);
    let scatter = || x.scatter(1, &idx, &src)?.exp();
    let at = here!();
    assert_data_error("scatter", "f32[2, 3], i64[2, 1], f32[2, 1]", &at, scatter);
    let scatter_add = || x.scatter_add(1, &idx, &src)?.exp();
    let at = here!();
    assert_data_error("scatter_add", "f32[2, 3], i64[2, 1], f32[2, 1]", &at, scatter_add);
    let scatter_reduce = || x.scatter_reduce(1, &idx, &src, coil::ScatterReduce::Amax, true)?.exp();
    let at = here!();
    assert_data_error("scatter_amax", "f32[2, 3], i64[2, 1], f32[2, 1]", &at, scatter_reduce);
}

/// A KV cache written at `pos..pos + T` (compiled: a generated kernel storing at the position
/// it reads when it runs) past the cache's end, or before its start, is the scatter's index
/// error, as the interpreter reports it.
#[test]
fn a_cache_write_out_of_range_names_the_scatter_and_its_line_on_every_backend() {
    let (cache, new) = (f32s(&[1, 2, 8, 4]), f32s(&[1, 2, 3, 4]));
    let positions = |pos: &Tensor| Tensor::iota(&[3], 0)?.add(pos)?.reshape(&[1, 1, 3, 1])?.broadcast_to(&[1, 2, 3, 4]);
    let operands = "f32[1, 2, 8, 4], i64[1, 2, 3, 4], f32[1, 2, 3, 4]";
    for (pos, first_bad) in [(6i64, 8i64), (-1, -1), (8, 8)] {
        let p = index(&[pos], &[]);
        let write = || cache.scatter(2, &positions(&p)?, &new)?.exp();
        let at = here!();
        assert_data_error("scatter", operands, &at, write);
        let e = write().unwrap().realize().unwrap_err().to_string();
        assert!(e.contains(&format!("index {first_bad} is out of bounds for dim 2 with size 8")), "{e}");
    }
}

#[test]
fn integer_errors_name_the_op_operands_and_line_on_every_backend() {
    let (a, b) = (index(&[5, 3], &[2]), index(&[2, 0], &[2]));
    let floor_divide = || a.floor_divide(&b)?.add(1);
    let at = here!();
    assert_data_error("floor_divide", "i64[2], i64[2]", &at, floor_divide);
    let trunc_divide = || a.trunc_divide(&b)?.add(1);
    let at = here!();
    assert_data_error("trunc_divide", "i64[2], i64[2]", &at, trunc_divide);
    let remainder = || a.remainder(&b)?.add(1);
    let at = here!();
    assert_data_error("remainder", "i64[2], i64[2]", &at, remainder);
    let negative = index(&[2, -1], &[2]);
    let pow = || a.pow(&negative)?.add(1);
    let at = here!();
    assert_data_error("pow", "i64[2], i64[2]", &at, pow);
}

#[test]
fn captures_of_one_compiled_graph_each_report_their_own_line() {
    // One compiled graph serves both captures (the same structure); each error points at the
    // line that recorded its own capture's op.
    let before = coil::backend();
    coil::set_backend(Backend::Compiled);
    coil::set_eager_tier(false);
    let (w, idx) = (f32s(&[5, 3]), index(&[0, 7], &[2]));
    let first = w.index_select(0, &idx).unwrap().exp().unwrap();
    let first_at = here!();
    let second = w.index_select(0, &idx).unwrap().exp().unwrap();
    let second_at = here!();
    let e = first.realize().unwrap_err();
    assert!(e.to_string().contains(&first_at), "{e} should point at {first_at}");
    let compiled = coil::compile_count();
    let e = second.realize().unwrap_err();
    assert!(e.to_string().contains(&second_at), "{e} should point at {second_at}");
    assert_eq!(coil::compile_count(), compiled, "the second capture reuses the compiled graph");
    // So too inside two compiled functions of the same structure.
    let f = coil::compile(|_: &[Tensor]| Ok(vec![w.index_select(0, &idx)?.exp()?]));
    let f_at = here!();
    let g = coil::compile(|_: &[Tensor]| Ok(vec![w.index_select(0, &idx)?.exp()?]));
    let g_at = here!();
    for _ in 0..2 {
        let e = f.call(&[]).unwrap_err();
        assert!(e.to_string().contains(&f_at), "{e} should point at {f_at}");
        let e = g.call(&[]).unwrap_err();
        assert!(e.to_string().contains(&g_at), "{e} should point at {g_at}");
    }
    coil::set_backend(before);
}
