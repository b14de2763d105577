//! The host's side of a call: a compiled function's differentiated graphs kept between calls,
//! the hit that compares a capture with the cached graph node by node (no false hits when the
//! program changes in an attribute, a constant, an edge, a dtype or a size), the same for
//! graphs realized again outside compiled functions, and the host time by phase.

mod common;

use coil::{DType, Result, Tensor};
use common::{close, randn};
use std::cell::Cell;

/// A two-layer MLP's loss with dropout, from computed weights.
fn mlp_loss(x: &Tensor, w1: &Tensor, w2: &Tensor, p: f64) -> Result<Tensor> {
    let h = x.matmul(w1)?.gelu(true)?.dropout(p, true)?;
    let y = h.matmul(w2)?;
    (&y * &y).mean(&[], false)
}

fn values(ts: &[Tensor]) -> Vec<Vec<f64>> {
    ts.iter().map(|t| t.to_vec::<f64>().unwrap()).collect()
}

#[test]
fn a_compiled_training_step_differentiates_its_forward_graph_once() {
    let (w1, w2) = (randn(&[8, 16], DType::F32), randn(&[16, 4], DType::F32));
    let step = coil::compile(|a: &[Tensor]| {
        let (loss, grads) = coil::value_and_grad(&mlp_loss(&a[0], &w1, &w2, 0.25)?, &[&w1, &w2])?;
        Ok(std::iter::once(loss).chain(grads).collect())
    });
    for call in 0..4u64 {
        coil::manual_seed(100 + call);
        let x = randn(&[5, 8], DType::F32);
        let got = values(&step.call(&[&x]).unwrap());
        // The same step outside the compiled function, differentiated afresh, drawing the same
        // dropout mask (same seed, same draws).
        coil::manual_seed(100 + call);
        let x2 = randn(&[5, 8], DType::F32);
        let (loss, grads) = coil::value_and_grad(&mlp_loss(&x2, &w1, &w2, 0.25).unwrap(), &[&w1, &w2]).unwrap();
        let want = values(&std::iter::once(loss).chain(grads).collect::<Vec<_>>());
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(close(g, w, 1e-5), "call {call}, output {k}: {g:?} vs {w:?}");
        }
    }
    let s = step.stats();
    assert_eq!((s.host.differentiations, s.host.differentiation_hits), (1, 3), "{s:?}");
    assert_eq!((step.compile_count(), s.graph_hits), (1, 3));
}

#[test]
fn a_different_forward_graph_or_wrt_is_differentiated_again() {
    let (w1, w2) = (randn(&[8, 16], DType::F32), randn(&[16, 4], DType::F32));
    let both = Cell::new(true);
    let step = coil::compile(|a: &[Tensor]| {
        let loss = mlp_loss(&a[0], &w1, &w2, 0.0)?;
        let wrt: Vec<&Tensor> = if both.get() { vec![&w1, &w2] } else { vec![&w2] };
        let (loss, grads) = coil::value_and_grad(&loss, &wrt)?;
        Ok(std::iter::once(loss).chain(grads).collect())
    });
    let (x, taller) = (randn(&[5, 8], DType::F32), randn(&[7, 8], DType::F32));
    step.call(&[&x]).unwrap();
    both.set(false);
    let only_w2 = step.call(&[&x]).unwrap();
    assert_eq!(only_w2.len(), 2);
    step.call(&[&taller]).unwrap();
    both.set(true);
    step.call(&[&x]).unwrap();
    step.call(&[&taller]).unwrap();
    let s = step.stats();
    // [w1, w2] at 5 rows; [w2] at 5 and at 7 rows; [w1, w2] at 5 rows again (kept); at 7 rows.
    assert_eq!((s.host.differentiations, s.host.differentiation_hits), (4, 1), "{s:?}");
    let (loss, grads) = coil::value_and_grad(&mlp_loss(&x, &w1, &w2, 0.0).unwrap(), &[&w2]).unwrap();
    assert!(close(&only_w2[1].to_vec::<f64>().unwrap(), &grads[0].to_vec::<f64>().unwrap(), 1e-5));
    assert!(close(&only_w2[0].to_vec::<f64>().unwrap(), &loss.to_vec::<f64>().unwrap(), 1e-5));
}

/// One program per variant; they differ from the first only where the comment says, so a hit
/// that compared less than everything would run the wrong code.
fn variant(k: usize, x: &Tensor, y: &Tensor) -> Result<Tensor> {
    match k {
        0 => (x - y).sum(&[0], false),
        1 => (y - x).sum(&[0], false),                       // operands swapped
        2 => (x - y).sum(&[1], false),                       // an attribute
        3 => Ok((x - y).sum(&[0], false)? * 2.0),            // one more node
        4 => Ok((x - y).sum(&[0], false)? * 3.0),            // a constant
        5 => (x - &x.exp()?).sum(&[0], false),               // an edge
        _ => (x - y).to_dtype(DType::F64)?.sum(&[0], false), // a dtype
    }
}

#[test]
fn a_hit_compares_the_whole_program() {
    let (x, y) = (randn(&[3, 3], DType::F32), randn(&[3, 3], DType::F32));
    let which = Cell::new(0);
    let f = coil::compile(|a: &[Tensor]| Ok(vec![variant(which.get(), &a[0], &a[1])?]));
    let want: Vec<Vec<f64>> = (0..7).map(|k| variant(k, &x, &y).unwrap().to_vec::<f64>().unwrap()).collect();
    for round in 0..2 {
        for k in [0, 0, 1, 2, 3, 4, 5, 6, 0, 6, 6] {
            which.set(k);
            let got = f.call(&[&x, &y]).unwrap()[0].to_vec::<f64>().unwrap();
            assert!(close(&got, &want[k], 1e-6), "round {round}, variant {k}: {got:?} vs {:?}", want[k]);
        }
    }
    // Inputs of other sizes or dtypes are other graphs too.
    which.set(0);
    let wide = randn(&[3, 5], DType::F32);
    assert_eq!(f.call(&[&wide, &wide]).unwrap()[0].shape(), &[5]);
    let doubles = x.to_dtype(DType::F64).unwrap();
    doubles.realize().unwrap();
    assert_eq!(f.call(&[&doubles, &doubles]).unwrap()[0].dtype(), DType::F64);
}

#[test]
fn graphs_realized_again_are_recognized_and_kept_apart() {
    let x = randn(&[4, 4], DType::F32);
    let before = coil::profile::host_times();
    for round in 0..3 {
        for k in 0..7 {
            let got = variant(k, &x, &x.t().unwrap()).unwrap().to_vec::<f64>().unwrap();
            let want: Vec<f64> = {
                coil::set_backend(coil::Backend::Interpreter);
                let v = variant(k, &x, &x.t().unwrap()).unwrap().to_vec::<f64>().unwrap();
                coil::set_backend(coil::Backend::Compiled);
                coil::set_eager_tier(false);
                v
            };
            assert!(close(&got, &want, 1e-6), "round {round}, variant {k}");
        }
    }
    let spent = coil::profile::host_times().since(&before);
    assert_eq!(spent.graphs, 42, "{spent:?}");
}

#[test]
fn host_times_split_a_call_by_phase() {
    let (w1, w2) = (randn(&[8, 16], DType::F32), randn(&[16, 4], DType::F32));
    let step = coil::compile(|a: &[Tensor]| {
        let (loss, grads) = coil::value_and_grad(&mlp_loss(&a[0], &w1, &w2, 0.0)?, &[&w1, &w2])?;
        Ok(std::iter::once(loss).chain(grads).collect())
    });
    let x = randn(&[5, 8], DType::F32);
    step.call(&[&x]).unwrap();
    let first = step.stats().host;
    // A miss hashes the graph to find it among the compiled ones (of this process: another
    // test may have compiled it already).
    assert!(first.hash > std::time::Duration::ZERO && first.differentiations == 1, "{first:?}");
    step.call(&[&x]).unwrap();
    let hit = step.stats().host.since(&first);
    assert_eq!((hit.graphs, hit.differentiation_hits), (1, 1), "{hit:?}");
    // A hit compares the capture with the cached graph as it walks: nothing to hash or compile.
    assert_eq!((hit.hash, hit.compile), (std::time::Duration::ZERO, std::time::Duration::ZERO), "{hit:?}");
    assert!(hit.capture > std::time::Duration::ZERO && hit.run > std::time::Duration::ZERO, "{hit:?}");
}

#[test]
fn the_cpu_reports_a_kernel_error_at_the_run_that_found_it() {
    // CPU runs are synchronous: the realize fails, naming the user's op (and the kernel it ran
    // in) at the op's line, as the interpreter does. A GPU's run would return, and the error
    // surface at the next synchronization point: `tests/gpu.rs`.
    let x = randn(&[4, 3], DType::F32);
    let bad = Tensor::from_vec(vec![0i64, 7], &[2]).unwrap();
    let y = x.index_select(0, &bad).unwrap().exp().unwrap();
    let op_line = line!() - 1;
    let e = y.realize().unwrap_err();
    assert!(e.to_string().contains("index 7 is out of bounds"), "{e}");
    assert!(e.op.as_deref().is_some_and(|op| op.starts_with("index_select (kernel poi_fused_")), "{e}");
    assert_eq!(e.location.map(|l| (l.file(), l.line())), Some((file!(), op_line)));
    // (compiled before it runs: tier 0 would compute it without a kernel, `tests/tier0.rs`)
    let compiled = coil::Config { eager_tier: false, ..coil::config().as_ref().clone() };
    let a = Tensor::from_vec(vec![4i64, 5], &[2]).unwrap();
    let y = a.remainder(Tensor::from_vec(vec![2i64, 0], &[2]).unwrap()).unwrap() + 1;
    let op_line = line!() - 1;
    let e = coil::with_config(compiled, || y.realize().unwrap_err());
    assert!(e.op.as_deref().is_some_and(|op| op.starts_with("remainder (kernel")), "{e}");
    assert_eq!(e.location.map(|l| l.line()), Some(op_line), "{e}");
    coil::synchronize().unwrap();
}

#[test]
fn cuda_graphs_change_nothing_on_the_cpu() {
    // The option replays graphs on a GPU only (tests/gpu.rs); on the CPU earlier outputs stay
    // valid and every call runs as usual.
    let f = coil::compile(|a: &[Tensor]| Ok(vec![(&a[0] * 0.5 + 1.0)])).cuda_graphs(true);
    let mut x = Tensor::zeros(&[16], DType::F32);
    let mut earlier = Vec::new();
    for _ in 0..4 {
        x = f.call(&[&x]).unwrap().remove(0);
        earlier.push(x.clone());
    }
    assert_eq!(earlier[0].to_vec::<f32>().unwrap(), vec![1.0; 16]);
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![1.875; 16]);
}
