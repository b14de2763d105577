//! The loop IR and tile IR texts: every variant round-trips, and errors say where.

use crate::dtype::{DType, Scalar};
use crate::graph::TensorMeta;
use crate::kernel::{rindex, xindex, Dims, KernelKind, TileArg, TileKernel, TileOp, TileStmt};
use crate::loops::*;
use crate::op::{BinaryOp, ConvForm, ConvGeometry, Op, RandDist, ReduceOp, UnaryOp};
use crate::sym::Expr;

/// Which variant a scalar op is. No wildcard arm: a new variant does not compile until it has
/// a number here, and then [`every_loop_variant_round_trips`] fails until [`sample_program`]
/// has one (which the parser must read back).
fn scalar_variant(op: &ScalarOp) -> usize {
    match op {
        ScalarOp::Load { .. } => 0,
        ScalarOp::MaskedLoad { .. } => 1,
        ScalarOp::IndirectLoad { .. } => 2,
        ScalarOp::Constant(_) => 3,
        ScalarOp::Index(_) => 4,
        ScalarOp::Rand { .. } => 5,
        ScalarOp::Unary(..) => 6,
        ScalarOp::Binary(..) => 7,
        ScalarOp::Where(..) => 8,
        ScalarOp::Cast(_) => 9,
    }
}
const SCALAR_VARIANTS: usize = 10;

/// As [`scalar_variant`], for loop nodes and extern calls.
fn node_variant(kind: &LoopKind) -> usize {
    match kind {
        LoopKind::Pointwise { .. } => 0,
        LoopKind::Reduction { .. } => 1,
        LoopKind::Extern { call, .. } => match call {
            ExternCall::Bmm { .. } => 2,
            ExternCall::Attention(_) => 3,
            ExternCall::AttentionBackward(_) => 4,
            ExternCall::Fallback { .. } => 5,
            ExternCall::Conv(_) => 6,
        },
    }
}
const NODE_VARIANTS: usize = 7;

fn view(buffer: usize, offset: Expr, strides: &[Expr]) -> StridedOperand {
    let n = strides.len();
    StridedOperand {
        buffer: BufferId(buffer),
        offset,
        batch_strides: strides[..n - 2].to_vec(),
        row_stride: strides[n - 2],
        col_stride: strides[n - 1],
    }
}

/// A dynamic program with every kind of node, scalar op and extern call, buffers out of
/// order (and one no node writes), two random streams and data checks.
fn sample_program() -> LoopProgram {
    let s0 = Expr::size("s0");
    let e = Expr::int;
    let buf = |name: &str, shape: Vec<Expr>, hint: Vec<usize>, dtype| LoopBuffer {
        name: name.into(),
        meta: TensorMeta::new(hint, dtype),
        shape,
    };
    let mut p = LoopProgram {
        symbols: vec![SizeSymbol { symbol: s0, input: 0, dim: 1, hint: 6 }],
        buffers: vec![
            buf("arg0", vec![e(4), s0], vec![4, 6], DType::F32),
            buf("buf1", vec![e(4), s0], vec![4, 6], DType::F32),
            buf("arg1", vec![e(4)], vec![4], DType::I64),
            buf("buf0", vec![e(4), e(1)], vec![4, 1], DType::F32),
            buf("spare", vec![e(3)], vec![3], DType::BF16),
        ],
        inputs: vec![BufferId(0), BufferId(2)],
        ..Default::default()
    };
    let (x, r) = (range_var(0, &e(4)), reduction_var(0, &s0));
    let mut b = Body::default();
    let l = b.push(ScalarOp::Load { buffer: BufferId(0), index: x * s0 + r }, DType::F32);
    b.result = b.push(ScalarOp::Unary(UnaryOp::Exp, l), DType::F32);
    p.nodes.push(LoopNode {
        output: BufferId(3),
        origins: vec!["exp", "sum"],
        kind: LoopKind::Reduction { ranges: vec![e(4), e(1)], reduction_ranges: vec![s0], op: ReduceOp::Sum, body: b },
    });
    let (x0, x1) = (range_var(0, &e(4)), range_var(1, &s0));
    let mut b = Body::default();
    let i = b.push(ScalarOp::Index(x1.floor_div(2) - 1), DType::I64);
    let lim = b.push(ScalarOp::Constant(Scalar::Int(-3)), DType::I64);
    let inside = b.push(ScalarOp::Binary(BinaryOp::Ge, i, lim), DType::Bool);
    let m = b.push(
        ScalarOp::MaskedLoad {
            buffer: BufferId(0),
            index: x0 * s0 + x1,
            mask: inside,
            other: Scalar::Float(f64::NEG_INFINITY),
        },
        DType::F32,
    );
    let k = b.push(ScalarOp::Load { buffer: BufferId(2), index: x0 }, DType::I64);
    let g = b.push(
        ScalarOp::IndirectLoad { buffer: BufferId(0), index: x1.modulo(3), indirect: k, stride: s0, bound: e(4) },
        DType::F32,
    );
    let u = b.push(ScalarOp::Rand { dist: RandDist::Uniform, stream: 0, counter: x0 * s0 + x1 }, DType::F32);
    let n = b.push(ScalarOp::Rand { dist: RandDist::Normal, stream: 1, counter: x1.min(s0 - 1) }, DType::F32);
    let s = b.push(ScalarOp::Load { buffer: BufferId(3), index: x0 }, DType::F32);
    let half = b.push(ScalarOp::Constant(Scalar::Float(0.5)), DType::F32);
    let sum = b.push(ScalarOp::Binary(BinaryOp::Add, m, g), DType::F32);
    let w = b.push(ScalarOp::Where(inside, sum, u), DType::F32);
    let w = b.push(ScalarOp::Binary(BinaryOp::Mul, w, half), DType::F32);
    let w = b.push(ScalarOp::Binary(BinaryOp::Div, w, s), DType::F32);
    let w = b.push(ScalarOp::Binary(BinaryOp::Add, w, n), DType::F32);
    let c = b.push(ScalarOp::Cast(w), DType::BF16);
    b.result = b.push(ScalarOp::Cast(c), DType::F32);
    p.nodes.push(LoopNode {
        output: BufferId(1),
        origins: vec!["where", "gather", "rand", "randn"],
        // Written as a scatter into a copy of arg0 (at positions `k` along dim 1).
        kind: LoopKind::Pointwise {
            ranges: vec![e(4), s0],
            body: b,
            scatter: Some(ScatterStore {
                base: BufferId(0),
                index: x0 * s0,
                offset: k,
                stride: e(1),
                size: e(1),
                bound: s0,
            }),
        },
    });
    // Extern calls, each writing new buffers.
    let add = |p: &mut LoopProgram, names: &[&str], shape: Vec<Expr>, call: ExternCall, inputs: Vec<usize>| {
        let first = p.buffers.len();
        for name in names {
            p.buffers.push(buf(
                name,
                shape.clone(),
                shape.iter().map(|e| e.eval(&p.hints()).unwrap() as usize).collect(),
                DType::F32,
            ));
        }
        let origins = vec![call.kind_name()];
        p.nodes.push(LoopNode {
            output: BufferId(first),
            origins,
            kind: LoopKind::Extern { call, inputs: inputs.into_iter().map(BufferId).collect() },
        });
        first
    };
    let bmm = ExternCall::Bmm {
        a: view(1, e(0), &[s0, e(1)]),
        b: view(0, s0 * 2, &[e(1), s0]),
        bias: Some(BiasOperand { buffer: BufferId(3), offset: e(0), stride: e(1) }),
        activation: Some(Activation::GeluTanh),
        activation_grad: None,
        saved: None,
        batch: vec![],
        m: e(4),
        n: e(4),
        k: s0,
    };
    let mm = add(&mut p, &["buf2"], vec![e(4), e(4)], bmm, vec![1, 0, 3]);
    let attention = ExternCall::Attention(Box::new(AttentionCall {
        q: view(mm, e(0), &[e(16), e(4), e(1)]),
        k: view(mm, e(0), &[e(16), e(4), e(1)]),
        v: view(mm, e(1), &[e(16), e(4), e(1)]),
        out: view(6, e(0), &[e(16), e(1), e(4)]),
        lse: Some(BufferId(7)),
        batch: vec![e(1)],
        l: e(4),
        s: e(4),
        d: e(4),
        causal: true,
        scale: 0.5,
        mask: Some(view(mm, e(2), &[e(0), e(4), e(1)])),
        // Not a call lowering makes (a rule with a mask and `causal`): every field at once.
        mask_rule: Some(full_mask_rule()),
        dropout: Some(crate::op::AttentionDropout { p: 0.1, stream: 1, offset: 96 }),
    }));
    let att = add(&mut p, &["buf3", "buf3_lse"], vec![e(1), e(4), e(4)], attention, vec![mm, mm, mm, mm]);
    let backward = ExternCall::AttentionBackward(Box::new(AttentionBackwardCall {
        q: view(att, e(0), &[e(16), e(4), e(1)]),
        k: view(att, e(0), &[e(16), e(4), e(1)]),
        v: view(att, e(0), &[e(16), e(4), e(1)]),
        grad_out: view(att, e(0), &[e(16), e(4), e(1)]),
        lse: BufferId(att + 1),
        out: view(att, e(0), &[e(16), e(4), e(1)]),
        dq: Some(view(8, e(0), &[e(16), e(4), e(1)])),
        dk: None,
        dv: Some(view(9, e(0), &[e(16), e(1), e(4)])),
        batch: vec![e(1)],
        l: e(4),
        s: e(4),
        d: e(4),
        causal: false,
        scale: 0.125,
        mask: Some(view(mm, e(2), &[e(0), e(4), e(1)])),
        dropout: Some(crate::op::AttentionDropout { p: 0.1, stream: 1, offset: 96 }),
    }));
    add(&mut p, &["buf4", "buf4_dv"], vec![e(1), e(4), e(4)], backward, vec![att, att + 1, mm]);
    let fallback = ExternCall::Fallback { op: Op::Cumsum { dim: 1 } };
    let cumsum = add(&mut p, &["buf5"], vec![e(4), s0], fallback, vec![1]);
    // The gradient of that gelu through another product, reading its input (here buf2).
    let grad = ExternCall::Bmm {
        a: view(1, e(0), &[s0, e(1)]),
        b: view(0, e(0), &[e(1), s0]),
        bias: None,
        activation: None,
        activation_grad: Some(ActivationGrad { activation: Activation::GeluTanh, aux: BufferId(mm) }),
        saved: None,
        batch: vec![],
        m: e(4),
        n: e(4),
        k: s0,
    };
    add(&mut p, &["buf2_grad"], vec![e(4), e(4)], grad, vec![1, 0, mm]);
    let geometry = ConvGeometry { stride: vec![1], padding: vec![1], dilation: vec![1], groups: 1 };
    let tensor = |buffer: usize, shape: Vec<usize>, strides: Vec<usize>, offset| TensorView {
        buffer: BufferId(buffer),
        offset,
        shape,
        strides,
    };
    let conv = ExternCall::Conv(Box::new(ConvCall {
        geometry,
        form: ConvForm::BackwardData { size: vec![4] },
        a: tensor(mm, vec![1, 4, 4], vec![16, 4, 1], 0),
        b: tensor(mm, vec![4, 1, 3], vec![3, 3, 1], 2),
        out: vec![1, 1, 4],
        out_strides: vec![4, 1, 1],
    }));
    add(&mut p, &["buf6"], vec![e(1), e(1), e(4)], conv, vec![mm]);
    // A gelu product that also writes its activation's input (a training graph's forward).
    let saving = ExternCall::Bmm {
        a: view(1, e(0), &[s0, e(1)]),
        b: view(0, e(0), &[e(1), s0]),
        bias: Some(BiasOperand { buffer: BufferId(3), offset: e(0), stride: e(1) }),
        activation: Some(Activation::GeluTanh),
        activation_grad: None,
        saved: Some(BufferId(p.buffers.len() + 1)),
        batch: vec![],
        m: e(4),
        n: e(4),
        k: s0,
    };
    add(&mut p, &["buf7", "buf7_saved"], vec![e(4), e(4)], saving, vec![1, 0, 3]);
    p.outputs = vec![BufferId(cumsum), BufferId(1), BufferId(0)];
    p.data_checks = vec![
        DataCheck { buffer: BufferId(1), code: 1, op: "gather", dim: Some(0), node: Some(7) },
        DataCheck { buffer: BufferId(1), code: 3, op: "div", dim: None, node: None },
    ];
    p
}

#[test]
fn every_loop_variant_round_trips() {
    let p = sample_program();
    let text = p.to_string();
    let parsed = LoopProgram::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(parsed, p, "{text}");
    assert_eq!(parsed.to_string(), text);
    let mut seen = ([false; SCALAR_VARIANTS], [false; NODE_VARIANTS]);
    for node in &p.nodes {
        seen.1[node_variant(&node.kind)] = true;
        if let LoopKind::Pointwise { body, .. } | LoopKind::Reduction { body, .. } = &node.kind {
            body.values.iter().for_each(|v| seen.0[scalar_variant(&v.op)] = true);
        }
    }
    assert!(seen.0.iter().all(|&s| s), "scalar ops without an example: {:?}", seen.0);
    assert!(seen.1.iter().all(|&s| s), "nodes without an example: {:?}", seen.1);
    // The text shows what it must: the buffer order, operand lines, data checks.
    for want in [
        "symbol s0 = arg0.size(1) (hint 6)",
        "random stream 1: seed1, offset1",
        "buffers: arg0, buf1, arg1, buf0, spare: bf16[3], buf2",
        "load(arg0, x1 % 3, indirect=v4, stride=s0, bound=4)",
        "    bias = view(buf0, offset=0, strides=[1])",
        "    lse = buf3_lse",
        "    out_strides = [4, 1, 1]",
        "data_check buf1: code=3 op=div dim=none node=none",
    ] {
        assert!(text.contains(want), "`{want}` in:\n{text}");
    }
    // An instantiated program (sizes bound, bodies keeping the symbols) reads back as the same
    // text; its index variables then have the facts of the constant ranges.
    let at = p.instantiate(&p.hints()).to_string();
    assert_eq!(LoopProgram::parse(&at).unwrap().to_string(), at);
}

/// The error `text` gives: its message must contain `want`.
#[track_caller]
fn loop_fails(text: &str, want: &str) {
    let e = LoopProgram::parse(text).expect_err(text).to_string();
    assert!(e.contains(want), "expected `{want}` in:\n{e}");
}

#[test]
fn loop_errors_name_line_column_and_what_was_expected() {
    let head = "inputs: arg0\n  arg0: f32[4]\n";
    let node = "buf0: f32[4] = pointwise ranges=[4] origins=[exp]\n";
    loop_fails(
        &format!("{head}{node}    v0: f32 = load(arg0, x0)\n    v1: f32 = frob(v0)\n    return v1\noutputs: buf0"),
        "5:15: unknown scalar op `frob`",
    );
    loop_fails(
        &format!("{head}{node}    v0: f32 = exp(v0)\n    return v0\noutputs: buf0"),
        "4:19: `v0` is not defined before this use",
    );
    loop_fails(
        &format!("{head}{node}    v1: f32 = load(arg0, x0)\n    return v1\noutputs: buf0"),
        "4:5: expected `v0`",
    );
    loop_fails(
        &format!("{head}{node}    v0: f32 = load(arg9, x0)\n    return v0\noutputs: buf0"),
        "4:20: buffer `arg9` is not declared",
    );
    loop_fails(
        &format!("{head}{node}    v0: f32 = load(arg0, x0)\n    return v0\noutputs: buf0\nextra"),
        "7:1: expected `data_check` or the end",
    );
    loop_fails(
        &format!("{head}buf0: f32[4] = extern bmm batch=[] m=2 n=2 k=1(arg0, arg0) origins=[bmm]\n    a = view(arg0, offset=0, strides=[1, 1])\noutputs: buf0"),
        "3:23: the `bmm` call needs an operand line `b = ...`",
    );
    loop_fails(
        &format!("{head}buf0: f32[4] = extern bmm +bias batch=[] m=2 n=2 k=1(arg0, arg0) origins=[bmm]\n    a = view(arg0, offset=0, strides=[1, 1])\n    b = view(arg0, offset=0, strides=[2, 1])\noutputs: buf0"),
        "the call's header does not agree with its operand lines",
    );
    let e = LoopProgram::parse(&format!("{head}{node}    v0: f32 = load(arg0, x1)\n    return v0\noutputs: buf0"))
        .unwrap_err();
    assert!(e.to_string().ends_with("\n      v0: f32 = load(arg0, x1)\n                           ^"), "{e}");
}

/// As [`scalar_variant`], for the tile IR's ops and statements.
fn tile_variant(st: &TileStmt) -> usize {
    match st {
        TileStmt::Let { op, .. } => match op {
            TileOp::Load { .. } => 0,
            TileOp::MaskedLoad { .. } => 1,
            TileOp::IndirectLoad { .. } => 2,
            TileOp::Constant(_) => 3,
            TileOp::Index(_) => 4,
            TileOp::Rand { .. } => 5,
            TileOp::Unary(..) => 6,
            TileOp::Binary(..) => 7,
            TileOp::Where(..) => 8,
            TileOp::Cast(_) => 9,
        },
        TileStmt::Store { .. } => 10,
        TileStmt::AccInit { .. } => 11,
        TileStmt::AccUpdate { .. } => 12,
        TileStmt::AccUpdateOnlineSoftmax { .. } => 13,
        TileStmt::ReduceOnlineSoftmax { .. } => 14,
        TileStmt::RLoop(_) => 15,
        TileStmt::Reduce { .. } => 16,
        TileStmt::Window { .. } => 17,
    }
}
const TILE_VARIANTS: usize = 18;

/// A looped reduction with every statement and op, over a dynamic row.
fn sample_kernel() -> TileKernel {
    let (s0, f) = (Expr::size("s0"), DType::F32);
    let (x, r) = (xindex(&Expr::int(4)), rindex(&s0));
    let arg = |name: &str, buffer, dtype, read, written| TileArg {
        name: name.into(),
        buffer: BufferId(buffer),
        dtype,
        read,
        written,
    };
    let args = vec![
        arg("in_ptr0", 0, f, true, false),
        arg("in_ptr1", 2, DType::I64, true, false),
        arg("out_ptr0", 5, f, false, true),
        arg("in_out_ptr0", 3, f, true, true),
    ];
    let let_ = |var, dims, dtype, op| TileStmt::Let { var, dims, dtype, op };
    let pass = vec![
        let_(0, Dims::XR, f, TileOp::Load { arg: 0, index: x * s0 + r }),
        TileStmt::AccUpdateOnlineSoftmax { max_acc: 1, sum_acc: 2, value: 0 },
        TileStmt::AccUpdate { acc: 3, op: ReduceOp::ArgMax, value: 0 },
    ];
    let epilogue = vec![
        let_(0, Dims::XR, f, TileOp::Load { arg: 0, index: x * s0 + r }),
        let_(5, Dims::XR, DType::I64, TileOp::Index(r - 1)),
        let_(6, Dims::XR, DType::I64, TileOp::Constant(Scalar::Int(0))),
        let_(7, Dims::XR, DType::Bool, TileOp::Binary(BinaryOp::Ge, 5, 6)),
        let_(8, Dims::XR, f, TileOp::MaskedLoad { arg: 0, index: x * s0 + r - 1, mask: 7, other: Scalar::Float(0.0) }),
        let_(9, Dims::X, DType::I64, TileOp::Load { arg: 1, index: x }),
        let_(10, Dims::XR, f, TileOp::IndirectLoad { arg: 0, index: r, indirect: 9, stride: s0, bound: Expr::int(4) }),
        let_(11, Dims::XR, f, TileOp::Rand { dist: RandDist::Normal, stream: 2, counter: x * s0 + r }),
        let_(12, Dims::XR, f, TileOp::Where(7, 8, 10)),
        let_(13, Dims::XR, f, TileOp::Unary(UnaryOp::Exp, 12)),
        let_(14, Dims::XR, DType::F16, TileOp::Cast(13)),
        TileStmt::Store { arg: 2, index: x * s0 + r, value: 11, dims: Dims::XR },
    ];
    TileKernel {
        name: "red_fused_everything_0".into(),
        kind: KernelKind::LoopedReduction,
        args,
        xnumel: Expr::int(4),
        rnumel: Some(s0),
        sizes: vec![s0],
        random: vec![2],
        xblock: 1,
        rblock: 1024,
        body: vec![
            TileStmt::AccInit { acc: 1, op: ReduceOp::Max, dtype: f },
            TileStmt::AccInit { acc: 2, op: ReduceOp::Sum, dtype: f },
            TileStmt::AccInit { acc: 3, op: ReduceOp::ArgMax, dtype: DType::I64 },
            TileStmt::RLoop(pass),
            TileStmt::ReduceOnlineSoftmax { max: 1, sum: 2, dtype: f, finite_shift: true },
            TileStmt::Reduce { var: 4, op: ReduceOp::ArgMax, dtype: DType::I64, source: 3 },
            TileStmt::Store { arg: 3, index: x, value: 4, dims: Dims::X },
            TileStmt::Window { arg: 2, offset: 4, stride: s0, size: Expr::int(2), bound: Expr::int(4) },
            TileStmt::RLoop(epilogue),
        ],
    }
}

#[test]
fn every_tile_variant_round_trips() {
    let k = sample_kernel();
    let mut seen = [false; TILE_VARIANTS];
    crate::kernel::flat_stmts(&k.body).into_iter().for_each(|s| seen[tile_variant(s)] = true);
    k.body.iter().for_each(|s| seen[tile_variant(s)] = true);
    assert!(seen.iter().all(|&s| s), "tile statements without an example: {seen:?}");
    let text = k.to_string();
    let parsed = TileKernel::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(parsed, k, "{text}");
    assert_eq!(parsed.to_string(), text);
    // Several kernels in one text; the buffer ids are in the text.
    let two = format!("{text}\n{text}");
    assert_eq!(TileKernel::parse_all(&two).unwrap(), vec![k.clone(), k]);
    assert!(text.contains("in_out_ptr0: *f32 (buffer 3)"), "{text}");
}

#[test]
fn tile_errors_name_line_column_and_what_was_expected() {
    let text = sample_kernel().to_string();
    let fails = |text: &str, want: &str| {
        let e = TileKernel::parse(text).expect_err(text).to_string();
        assert!(e.contains(want), "expected `{want}` in:\n{e}");
    };
    fails(&text.replace("kind=looped_reduction", "kind=looped"), "1:14: unknown kernel kind `looped`");
    fails(&text.replace("combine_argmax(acc3", "combine_argmax(acc7"), "expected `acc3` (in `(acc3,`)");
    fails(&text.replace("exp(tmp12)", "exp(tmp99)"), "`tmp99` is not defined");
    fails(&text.replace("(buffer 3)", "(buffer x)"), "2:133: expected a buffer id");
    fails(&text.replace("        rmask", "      rmask"), "the loop's lines are indented alike");
    fails(&format!("{text}\n{text}"), "expected one kernel, found 2");
}

/// A mask rule with every part: an offset buffer, a negative constant and a period.
fn full_mask_rule() -> crate::loops::MaskRule {
    crate::loops::MaskRule { offset: Some(BufferId(1)), constant: -1, period: Some(3) }
}
