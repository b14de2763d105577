//! The convolution template's call end to end: a graph keeping each form whole, lowered and
//! run on the CPU backend (the host path) and on CUDA (cuDNN), against the reference
//! interpreter of its decomposition. Operand views are channels-last where the test says so, and
//! so is the result where a permute to channels-last follows the call (it writes that buffer).

use super::super::tests::{assert_close, gpu, randoms, TempDir};
use crate::cuda::CudaCompiledGraph;
use crate::{interpret, Buffer, HostData};
use coil_codegen::cuda::{CudaModule, Language};
use coil_ir::config::{self, Config, CudnnApi};
use coil_ir::loops::{ExternCall, LoopKind};
use coil_ir::op::{ConvForm, ConvGeometry};
use coil_ir::{DType, Graph, Op, TensorMeta};
use std::sync::Arc;

/// `(graph, inputs)`: one form of a convolution on inputs stored as `stored` shapes, each read
/// through `perms` (a channels-last input is stored `[N, *spatial, C]` and permuted).
struct Case {
    name: &'static str,
    geometry: ConvGeometry,
    form: ConvForm,
    stored: [Vec<usize>; 2],
    perms: [Option<Vec<usize>>; 2],
    /// The permute to channels-last after the convolution, the graph's output then.
    out_perm: Option<Vec<usize>>,
}

fn geometry(stride: Vec<usize>, padding: Vec<usize>, dilation: Vec<usize>, groups: usize) -> ConvGeometry {
    ConvGeometry { stride, padding, dilation, groups }
}

fn cases() -> Vec<Case> {
    let g2 = geometry(vec![2, 1], vec![1, 2], vec![1, 2], 2);
    let g1 = geometry(vec![2], vec![1], vec![1], 1);
    let g3 = geometry(vec![1, 2, 1], vec![1, 0, 1], vec![1, 1, 2], 1);
    let nhwc = Some(vec![0, 3, 1, 2]);
    vec![
        Case {
            name: "conv2d channels-last, groups, dilation",
            geometry: g2.clone(),
            form: ConvForm::Forward,
            stored: [vec![2, 9, 8, 4], vec![6, 2, 3, 3]],
            perms: [nhwc.clone(), None],
            out_perm: None,
        },
        Case {
            name: "conv2d data gradient",
            geometry: g2.clone(),
            form: ConvForm::BackwardData { size: vec![9, 8] },
            stored: [vec![2, 6, 5, 8], vec![6, 2, 3, 3]],
            perms: [None, None],
            out_perm: None,
        },
        Case {
            name: "conv2d weight gradient, channels-last",
            geometry: g2,
            form: ConvForm::BackwardWeight { kernel: vec![3, 3] },
            stored: [vec![2, 9, 8, 4], vec![2, 5, 8, 6]],
            perms: [nhwc.clone(), nhwc.clone()],
            out_perm: None,
        },
        Case {
            name: "conv1d",
            geometry: g1,
            form: ConvForm::Forward,
            stored: [vec![2, 3, 11], vec![4, 3, 3]],
            perms: [None, None],
            out_perm: None,
        },
        Case {
            name: "conv3d",
            geometry: g3,
            form: ConvForm::Forward,
            stored: [vec![1, 3, 4, 6, 5], vec![2, 3, 3, 2, 2]],
            perms: [None, None],
            out_perm: None,
        },
        Case {
            name: "conv2d channels-last in and out",
            geometry: geometry(vec![2, 2], vec![1, 1], vec![1, 1], 1),
            form: ConvForm::Forward,
            stored: [vec![2, 9, 8, 4], vec![6, 4, 3, 3]],
            perms: [nhwc.clone(), None],
            out_perm: Some(vec![0, 2, 3, 1]),
        },
        Case {
            name: "conv2d data gradient, channels-last in and out",
            geometry: geometry(vec![2, 1], vec![1, 2], vec![1, 2], 2),
            form: ConvForm::BackwardData { size: vec![9, 8] },
            stored: [vec![2, 5, 8, 6], vec![6, 2, 3, 3]],
            perms: [nhwc.clone(), None],
            out_perm: Some(vec![0, 2, 3, 1]),
        },
        Case {
            name: "conv2d 7x7 stem, 3 channels, channels-last in and out",
            geometry: geometry(vec![2, 2], vec![3, 3], vec![1, 1], 1),
            form: ConvForm::Forward,
            stored: [vec![2, 16, 16, 3], vec![8, 7, 7, 3]],
            perms: [nhwc.clone(), nhwc.clone()],
            out_perm: Some(vec![0, 2, 3, 1]),
        },
        Case {
            name: "conv2d weight gradient, channels-last in and out",
            geometry: geometry(vec![1, 1], vec![1, 1], vec![1, 1], 1),
            form: ConvForm::BackwardWeight { kernel: vec![3, 3] },
            stored: [vec![2, 7, 6, 5], vec![2, 7, 6, 8]],
            perms: [nhwc.clone(), nhwc],
            out_perm: Some(vec![0, 2, 3, 1]),
        },
    ]
}

/// The graph of `case` in `dtype`.
fn graph(case: &Case, dtype: DType) -> Graph {
    let mut g = Graph::new();
    let mut operands = Vec::new();
    for (shape, perm) in case.stored.iter().zip(&case.perms) {
        let x = g.input(TensorMeta::new(shape.clone(), dtype));
        operands.push(match perm {
            Some(perm) => g.push(Op::Permute { perm: perm.clone() }, &[x], None).unwrap(),
            None => x,
        });
    }
    let op = Op::Conv { geometry: case.geometry.clone(), form: case.form.clone() };
    let mut y = g.push(op, &operands, None).unwrap();
    if let Some(perm) = &case.out_perm {
        y = g.push(Op::Permute { perm: perm.clone() }, &[y], None).unwrap();
    }
    g.outputs.push(y);
    g
}

fn inputs(case: &Case, dtype: DType) -> Vec<Buffer> {
    case.stored
        .iter()
        .enumerate()
        .map(|(k, shape)| {
            let n = shape.iter().product();
            Buffer::new(shape.clone(), HostData::from_f64_slice(dtype, &randoms(k as u64 + 7, n))).unwrap()
        })
        .collect()
}

/// The program keeping the convolution whole: one extern call, reading the inputs in place.
fn program(g: &Graph) -> (coil_ir::loops::LoopProgram, coil_ir::kernel::Schedule) {
    let options = coil_passes::DecomposeOptions { conv_template: true, ..Default::default() };
    let primitive = coil_passes::decompose_with(g, &options).unwrap();
    let program = coil_passes::lower(&primitive).unwrap();
    assert_eq!(program.nodes.len(), 1, "{program:?}");
    assert!(matches!(&program.nodes[0].kind, LoopKind::Extern { call: ExternCall::Conv(_), .. }));
    let schedule = coil_passes::schedule(&program);
    (program, schedule)
}

fn reference(g: &Graph, args: &[Buffer]) -> Vec<f64> {
    let refs: Vec<&Buffer> = args.iter().collect();
    interpret(&coil_passes::decompose(g).unwrap(), &refs).unwrap().remove(0).data.to_f64_vec()
}

#[test]
fn convolution_calls_run_on_the_cpu_backend() {
    let dir = TempDir::new("conv_cpu");
    for case in cases() {
        let g = graph(&case, DType::F32);
        let args = inputs(&case, DType::F32);
        let (program, schedule) = program(&g);
        // The lowering's decision: a permute to channels-last after the call is written by it.
        let LoopKind::Extern { call: ExternCall::Conv(call), .. } = &program.nodes[0].kind else { unreachable!() };
        if let [_, c, h, w] = call.out[..] {
            let want = if case.out_perm.is_some() { [c * h * w, 1, w * c, c] } else { [c * h * w, h * w, w, 1] };
            assert_eq!(call.out_strides, want, "{}", case.name);
        }
        let cg = crate::cpu::CompiledGraph::new_in(program, schedule, vec![None], "", &dir.0).unwrap();
        let refs: Vec<&Buffer> = args.iter().collect();
        let got = cg.run(&refs).unwrap().remove(0).data.to_f64_vec();
        assert_close(&got, &reference(&g, &args), 1e-5, case.name);
    }
}

/// Every case in f32, bf16 and f16 through cuDNN's `api` (or, without cuDNN, the host path)
/// against the reference. The graphs are compiled under a configuration naming `api`.
fn run_through_cudnn(api: CudnnApi) -> Option<Arc<crate::CudaDevice>> {
    let dev = gpu()?;
    if !super::available() {
        eprintln!("NOTE: cuDNN not found: the calls take the host path");
    }
    let dir = TempDir::new(&format!("conv_gpu_{api:?}"));
    let module = CudaModule { source: String::new(), kernels: vec![], language: Language::CudaC };
    let config = Config { cudnn_api: api, ..(*config::current()).clone() };
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for case in cases() {
            let g = graph(&case, dtype);
            let args = inputs(&case, dtype);
            let (program, schedule) = program(&g);
            let cg = config::with_config(config.clone(), || {
                CudaCompiledGraph::new_in(
                    dev.clone(),
                    program,
                    schedule,
                    vec![None],
                    std::slice::from_ref(&module),
                    &dir.0,
                )
            })
            .unwrap();
            let refs: Vec<&Buffer> = args.iter().collect();
            let got = cg.run_host(&refs).unwrap().remove(0).data.to_f64_vec();
            // f32 without TF32 (either API) is as close as a different summation order.
            let tol = if dtype == DType::F32 { 1e-5 } else { 2e-2 };
            assert_close(&got, &reference(&g, &args), tol, &format!("{} {dtype} {api:?}", case.name));
        }
    }
    Some(dev)
}

/// The legacy API (`cudnnGetConvolution*Algorithm_v7`'s choice) against the reference.
#[test]
fn convolution_calls_run_through_cudnn_legacy_api() {
    run_through_cudnn(CudnnApi::Legacy);
}

/// The graph API (heuristics mode A) against the reference, and every case planned by it:
/// no call shape fell back to the legacy API.
#[test]
fn convolution_calls_run_through_cudnn_graph_api() {
    let Some(dev) = run_through_cudnn(CudnnApi::Graph) else { return };
    if super::available() {
        let fallbacks = super::graph_fallbacks(&dev);
        assert!(fallbacks.is_empty(), "graph API fallbacks:\n{}", fallbacks.join("\n"));
    }
}
