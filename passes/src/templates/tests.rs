//! The stage's report: every attention chain with what became of it and why, its costs at the
//! rates passed in, and its text.

use super::*;
use crate::rewrite::CostModel;
use crate::test_graph::Capture;
use coil_ir::target::GpuTarget;
use coil_ir::{BinaryOp, DType};

/// Causal attention over `[1, 2, t, 64]` inputs of `dtype` (`q @ k^T * 0.125`, `tril` mask,
/// softmax, `@ v`): its output and its probabilities.
fn chain(c: &mut Capture, t: usize, dtype: DType) -> (NodeId, NodeId) {
    let (out, p, _) = chain_with_scores(c, t, dtype);
    (out, p)
}

/// [`chain`], and the masked scores the softmax reads.
pub(crate) fn chain_with_scores(c: &mut Capture, t: usize, dtype: DType) -> (NodeId, NodeId, NodeId) {
    let shape = [1, 2, t, 64];
    let (q, k, v) = (c.input(&shape, dtype), c.input(&shape, dtype), c.input(&shape, dtype));
    let kt = c.permute(k, &[0, 1, 3, 2]);
    let s = c.op(Op::Matmul, &[q, kt]);
    let scale = c.scalar(0.125);
    let s = c.op(Op::Binary(BinaryOp::Mul), &[s, scale]);
    let ones = c.full(1, &[t, t], DType::Bool);
    let keep = c.op(Op::Tril { k: 0 }, &[ones]);
    let ninf = c.scalar(f64::NEG_INFINITY);
    let s = c.op(Op::Where, &[keep, s, ninf]);
    let p = c.op(Op::Softmax { dim: 3 }, &[s]);
    (c.op(Op::Matmul, &[p, v]), p, s)
}

/// Attention whose scores get an added bias (`[t, t]`, a learned position bias) before the
/// softmax: no rule takes an addition.
fn biased(c: &mut Capture, t: usize) -> NodeId {
    let shape = [1, 2, t, 64];
    let (q, k, v) = (c.input(&shape, DType::F32), c.input(&shape, DType::F32), c.input(&shape, DType::F32));
    let bias = c.input(&[t, t], DType::F32);
    let kt = c.permute(k, &[0, 1, 3, 2]);
    let s = c.op(Op::Matmul, &[q, kt]);
    let s = c.op(Op::Binary(BinaryOp::Add), &[s, bias]);
    let p = c.op(Op::Softmax { dim: 3 }, &[s]);
    c.op(Op::Matmul, &[p, v])
}

/// Five chains: one the template replaces; one refused (its probabilities are an output, and
/// at 1024 tokens extraction would compute them again); one kept (the same at 16 tokens,
/// where the product of the probabilities costs less); one with a bias added to its scores;
/// one in f64, which the template does not run.
fn five_chains() -> Graph {
    let mut c = Capture::new();
    let (chosen, _) = chain(&mut c, 128, DType::F32);
    let (refused, p_refused) = chain(&mut c, 1024, DType::F32);
    let (kept, p_kept) = chain(&mut c, 16, DType::F32);
    let bias = biased(&mut c, 32);
    let (f64_chain, _) = chain(&mut c, 8, DType::F64);
    c.out(&[chosen, refused, p_refused, kept, p_kept, bias, f64_chain])
}

#[test]
fn every_chain_is_reported_with_what_became_of_it() {
    let g = five_chains();
    let (found, report) = choose_attention(&g, &CostModel::default());
    assert_eq!(found.len(), 1, "{report}");
    let decisions: Vec<&Decision> = report.chains.iter().map(|c| &c.decision).collect();
    assert_eq!(decisions.len(), 5, "{report}");
    assert_eq!(*decisions[0], Decision::Chosen { causal: true, scale: 0.125 }, "{report}");
    assert!(matches!(decisions[1], Decision::Refused { needed, .. } if g.outputs.contains(needed)), "{report}");
    assert!(matches!(decisions[2], Decision::Kept { needed: Some(n), .. } if g.outputs.contains(n)), "{report}");
    let why = |d: &Decision| match d {
        Decision::Unmatched { why } => why.clone(),
        other => panic!("{other:?}"),
    };
    assert!(why(decisions[3]).contains(" add ") && why(decisions[3]).contains("no step of the rules"), "{report}");
    assert!(why(decisions[4]).contains("dtypes f64, f64, f64"), "{report}");
    assert_eq!((report.chosen, report.refused, report.kept(), report.unmatched()), (1, 1, 1, 2));
    // The chains' roots are the final products, in graph order.
    assert_eq!(report.chains[0].root, found[0].root);
    assert!(report.chains.windows(2).all(|w| w[0].root.0 < w[1].root.0));
}

#[test]
fn the_report_text() {
    let g = five_chains();
    let text = choose_attention(&g, &CostModel::default()).1.to_string();
    assert_eq!(text, choose_attention(&g, &CostModel::default()).1.to_string(), "deterministic");
    insta::assert_snapshot!(text);
}

#[test]
fn a_rule_condition_that_fails_is_named() {
    // A scale of infinity: the product matches, the scale step's condition does not.
    let mut c = Capture::new();
    let shape = [1, 2, 8, 64];
    let (q, k, v) = (c.input(&shape, DType::F32), c.input(&shape, DType::F32), c.input(&shape, DType::F32));
    let kt = c.permute(k, &[0, 1, 3, 2]);
    let s = c.op(Op::Matmul, &[q, kt]);
    let inf = c.scalar(f64::INFINITY);
    let s = c.op(Op::Binary(BinaryOp::Mul), &[s, inf]);
    let p = c.op(Op::Softmax { dim: 3 }, &[s]);
    let y = c.op(Op::Matmul, &[p, v]);
    let g = c.out(&[y]);
    let report = choose_attention(&g, &CostModel::default()).1;
    let [Chain { decision: Decision::Unmatched { why }, .. }] = report.chains.as_slice() else { panic!("{report}") };
    assert_eq!(why, &format!("{} is not a finite constant scale (the only one)", report::describe(&g, s)), "{report}");
}

/// The template's estimate, by hand: q, k, v and the output `[1, 2, t, 64]` f32 moved once,
/// `2 * (2 t) * t * (64 + 64)` flops, one launch.
fn template_seconds(t: usize, model: &CostModel) -> f64 {
    let bytes = 4.0 * (2 * t * 64 * 4) as f64;
    let flops = 2.0 * (2 * t) as f64 * t as f64 * 128.0;
    bytes / model.bandwidth + flops / model.flop_rate + lang::LAUNCH_SECONDS
}

#[test]
fn costs_follow_the_target_passed_in() {
    let mut c = Capture::new();
    let (y, _) = chain(&mut c, 256, DType::F32);
    let g = c.out(&[y]);
    let (cpu, h100, a100) = (CostModel::cpu(), CostModel::gpu(&GpuTarget::h100()), CostModel::gpu(&GpuTarget::a100()));
    // Interleaved: each call costs at its own model, nothing carries over between calls.
    let mut seen = Vec::new();
    for model in [cpu, h100, cpu, a100, h100] {
        let report = choose_attention(&g, &model).1;
        assert_eq!(report.model, Some(model));
        let chain = &report.chains[0];
        assert_eq!(chain.decision, Decision::Chosen { causal: true, scale: 0.125 });
        let (t, w) = (chain.template_seconds.unwrap(), chain.written_seconds.unwrap());
        assert!((t - template_seconds(256, &model)).abs() <= 1e-12 * t, "{t} at {model:?}");
        assert!(t < w, "the template moves a subset of the chain's bytes: {t} < {w}");
        seen.push(t);
    }
    assert_eq!((seen[0], seen[1]), (seen[2], seen[4]));
    assert!(seen[0] > 10.0 * seen[1], "a CPU is far slower than an H100: {seen:?}");
    assert!(seen[3] > seen[1], "an A100 is slower than an H100: {seen:?}");
    // The text names the rates.
    let text = choose_attention(&g, &cpu).1.to_string();
    assert!(text.contains("cost model: 20.0 GB/s, 0.2 TFLOP/s, 3.000 us per launch\n"), "{text}");
}

#[test]
fn where_a_chain_node_is_needed_the_rates_decide_how_the_chain_is_kept() {
    let mut c = Capture::new();
    let (y, p) = chain(&mut c, 1024, DType::F32);
    let g = c.out(&[y, p]);
    let decide = |model: CostModel| choose_attention(&g, &model).1.chains[0].decision.clone();
    // At an H100's rates recomputing the scores costs less than reading the probabilities (the
    // stage refuses that); at a CPU's, with ten times the flops per byte, it does not.
    assert!(matches!(decide(CostModel::gpu(&GpuTarget::h100())), Decision::Refused { needed, .. } if needed == p));
    assert!(matches!(decide(CostModel::cpu()), Decision::Kept { needed: Some(n), .. } if n == p));
}
