//! Bad input gives a clear error that names the op, the operands and the user's line; never a
//! panic from inside the library.

use coil::{DType, ErrorKind, Tensor};

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
