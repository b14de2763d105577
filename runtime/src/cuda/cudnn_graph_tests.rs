//! The graph API's descriptors as data and its choice of engine config, on the host.

use super::*;
use coil_ir::loops::BufferId;
use coil_ir::op::ConvGeometry;

fn view(shape: Vec<usize>, strides: Vec<usize>) -> TensorView {
    TensorView { buffer: BufferId(0), offset: 0, shape, strides }
}

/// A 1-d convolution: x `[2, 4, 11]`, w `[6, 2, 3]` (two groups), stride 2, padding 1,
/// dilation 2.
fn conv1d(form: ConvForm) -> ConvCall {
    ConvCall {
        geometry: ConvGeometry { stride: vec![2], padding: vec![1], dilation: vec![2], groups: 2 },
        form,
        a: view(vec![2, 4, 11], vec![44, 11, 1]),
        b: view(vec![6, 2, 3], vec![6, 3, 1]),
        out: vec![2, 6, 5],
        out_strides: vec![30, 5, 1],
    }
}

fn ints(v: &[i64]) -> Value {
    Value::Int64(v.to_vec())
}

#[test]
fn tensor_attributes_are_int64_dims_and_strides_with_a_unit_height_for_1d() {
    let bf16 = sys::cudnnDataType_t::CUDNN_DATA_BFLOAT16;
    // A channels-last 1-d activation [N, C, W] with strides [W*C, 1, C].
    let attrs = tensor_attrs(7, bf16, &[2, 4, 11], &[44, 1, 4], 8);
    assert_eq!(
        attrs,
        vec![
            (Attr::CUDNN_ATTR_TENSOR_DATA_TYPE, Value::DataType(bf16)),
            (Attr::CUDNN_ATTR_TENSOR_DIMENSIONS, ints(&[2, 4, 1, 11])),
            (Attr::CUDNN_ATTR_TENSOR_STRIDES, ints(&[44, 1, 44, 4])),
            (Attr::CUDNN_ATTR_TENSOR_UNIQUE_ID, ints(&[7])),
            (Attr::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, ints(&[8])),
        ]
    );
    // 2-d and 3-d operands keep their dims.
    let attrs = tensor_attrs(1, bf16, &[64, 3, 224, 224], &[150528, 1, 672, 3], 16);
    assert_eq!(attrs[1].1, ints(&[64, 3, 224, 224]));
    assert_eq!(attrs[2].1, ints(&[150528, 1, 672, 3]));
    assert_eq!(tensor_attrs(1, bf16, &[1, 2, 3, 4, 5], &[120, 60, 20, 5, 1], 16)[1].1, ints(&[1, 2, 3, 4, 5]));
}

#[test]
fn convolution_attributes_follow_the_geometry_and_dtype() {
    let call = conv1d(ConvForm::Forward);
    let attrs = conv_attrs(&call, DType::BF16);
    let float = sys::cudnnDataType_t::CUDNN_DATA_FLOAT;
    let cross = sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION;
    assert_eq!(
        attrs,
        vec![
            (Attr::CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, ints(&[2])),
            (Attr::CUDNN_ATTR_CONVOLUTION_COMP_TYPE, Value::DataType(float)),
            (Attr::CUDNN_ATTR_CONVOLUTION_CONV_MODE, Value::ConvMode(cross)),
            (Attr::CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, ints(&[0, 1])),
            (Attr::CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, ints(&[0, 1])),
            (Attr::CUDNN_ATTR_CONVOLUTION_DILATIONS, ints(&[1, 2])),
            (Attr::CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, ints(&[1, 2])),
        ]
    );
    // f16 and f32 accumulate in float, f64 in double.
    assert_eq!(conv_attrs(&call, DType::F16)[1].1, Value::DataType(float));
    assert_eq!(conv_attrs(&call, DType::F64)[1].1, Value::DataType(sys::cudnnDataType_t::CUDNN_DATA_DOUBLE));
    // A 2-d geometry has two spatial dims, no unit dim.
    let g = ConvGeometry { stride: vec![2, 2], padding: vec![3, 3], dilation: vec![1, 1], groups: 1 };
    let stem = ConvCall { geometry: g, ..call };
    let attrs = conv_attrs(&stem, DType::BF16);
    assert_eq!((attrs[0].1.clone(), attrs[3].1.clone()), (ints(&[2]), ints(&[3, 3])));
    assert_eq!(scale(DType::BF16, 1.0), Value::Float(1.0));
    assert_eq!(scale(DType::F64, 0.0), Value::Double(0.0));
}

#[test]
fn each_form_fills_its_operation_with_the_operands_in_call_order() {
    let forward = op_roles(&ConvForm::Forward);
    assert_eq!(forward.kind, Kind::CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
    assert_eq!(forward.operands[2], Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y);
    let data = op_roles(&ConvForm::BackwardData { size: vec![9] });
    assert_eq!(data.kind, Kind::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR);
    // The data gradient's first operand is dy, its result dx.
    assert_eq!(
        data.operands,
        [
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
        ]
    );
    assert_eq!(data.beta, Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA);
    let filter = op_roles(&ConvForm::BackwardWeight { kernel: vec![3] });
    assert_eq!(filter.kind, Kind::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR);
    assert_eq!(
        filter.operands,
        [
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
        ]
    );
    assert_eq!(filter.conv, Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC);
}

#[test]
fn values_name_their_backend_type_and_element_count() {
    let dims = ints(&[2, 3, 4, 5]);
    let (ty, n, p) = dims.typed();
    assert_eq!((ty, n), (Type::CUDNN_TYPE_INT64, 4));
    let Value::Int64(v) = &dims else { unreachable!() };
    assert_eq!(p, v.as_ptr() as *const c_void, "the elements themselves, not a copy");
    assert_eq!(Value::Float(1.0).typed().0, Type::CUDNN_TYPE_FLOAT);
    assert_eq!(Value::Double(1.0).typed().0, Type::CUDNN_TYPE_DOUBLE);
    let dt = Value::DataType(sys::cudnnDataType_t::CUDNN_DATA_HALF);
    assert_eq!(dt.typed().0, Type::CUDNN_TYPE_DATA_TYPE);
    let mode = Value::HeurMode(sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A);
    assert_eq!((mode.typed().0, mode.typed().1), (Type::CUDNN_TYPE_HEUR_MODE, 1));
    let descs = Value::Descriptors(vec![std::ptr::null_mut(); 3]);
    assert_eq!((descs.typed().0, descs.typed().1), (Type::CUDNN_TYPE_BACKEND_DESCRIPTOR, 3));
    let ptrs = Value::Pointers(vec![std::ptr::null_mut(); 3]);
    assert_eq!((ptrs.typed().0, ptrs.typed().1), (Type::CUDNN_TYPE_VOID_PTR, 3));
    assert_eq!(Value::Handle(std::ptr::null_mut()).typed().0, Type::CUDNN_TYPE_HANDLE);
    // Enums are passed as the C enums they mirror: 32 bits.
    assert_eq!(std::mem::size_of::<sys::cudnnDataType_t>(), 4);
    assert_eq!(std::mem::size_of::<sys::cudnnBackendHeurMode_t>(), 4);
    assert_eq!(std::mem::size_of::<sys::cudnnConvolutionMode_t>(), 4);
}

#[test]
fn alignment_is_the_largest_power_of_two_dividing_the_address_up_to_16() {
    assert_eq!(alignment(0x7f00_0000_0000), 16);
    assert_eq!(alignment(0x1000 + 2), 2);
    assert_eq!(alignment(0x1000 + 6), 2);
    assert_eq!(alignment(0x1000 + 4), 4);
    assert_eq!(alignment(0x1000 + 8), 8);
    assert_eq!(alignment(0x1000 + 48), 16);
    assert_eq!(alignment(0x1001), 1);
}

#[test]
fn engines_that_change_the_numerics_are_not_allowed() {
    let tc = Note::CUDNN_NUMERICAL_NOTE_TENSOR_CORE as u32;
    // Tensor cores: fine for f16 / bf16 (f32 accumulation), TF32 for f32.
    assert!(allowed(&[tc], DType::BF16).is_ok());
    assert!(allowed(&[tc], DType::F16).is_ok());
    assert!(allowed(&[tc], DType::F32).is_err());
    assert!(allowed(&[], DType::F32).is_ok());
    let reduced = Note::CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION as u32;
    assert!(allowed(&[tc, reduced], DType::F16).is_err());
    assert!(allowed(&[Note::CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS as u32], DType::F32).is_err());
    let winograd = Note::CUDNN_NUMERICAL_NOTE_WINOGRAD as u32;
    assert!(allowed(&[winograd], DType::F32).is_ok());
    // Sums in an order that depends on timing (atomics) change the bits from run to run.
    let atomics = Note::CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC as u32;
    assert_eq!(allowed(&[winograd, atomics], DType::F32), Err("nondeterministic"));
}

#[test]
fn the_first_configs_that_build_within_the_workspace_limit_are_kept_in_order() {
    // (name, what building it gives)
    type Config = (&'static str, std::result::Result<usize, &'static str>);
    let configs: Vec<Config> =
        vec![("a", Err("not supported")), ("b", Ok(WORKSPACE_LIMIT + 1)), ("c", Ok(4096)), ("d", Ok(0))];
    fn build((name, r): Config) -> std::result::Result<(&'static str, usize), String> {
        r.map(|ws| (name, ws)).map_err(String::from)
    }
    assert_eq!(fits(configs.clone(), build, 1), Ok(vec![("c", 4096)]));
    // Order decides, not workspace; at most `most`, the others in order.
    assert_eq!(fits(configs[2..].to_vec(), build, 1), Ok(vec![("c", 4096)]));
    assert_eq!(fits(configs.clone(), build, 4), Ok(vec![("c", 4096), ("d", 0)]));
    let why = fits(configs[..2].to_vec(), build, 4).unwrap_err();
    assert_eq!(why.len(), 2);
    assert!(why[0].contains("not supported") && why[1].contains("over the limit"), "{why:?}");
    let none = fits(Vec::<Config>::new(), build, 1).unwrap_err();
    assert!(none[0].contains("no engine config"), "{none:?}");
}
