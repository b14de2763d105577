//! Realizations outside compiled functions on new shapes: the same program at a second size
//! compiles once more, for symbolic sizes, and that compilation serves every later size (no C
//! compiler run per shape); a size that keeps coming back gets a compilation of its own. Values
//! equal the interpreter's at every size. (One test in its own binary: it counts the process's
//! compiles.)

mod common;

use coil::{DType, Tensor};
use common::{close, randn};

fn program(x: &Tensor, w: &Tensor, g: &Tensor) -> Tensor {
    let d = w.shape()[0];
    x.layer_norm(&[d], Some(g), None, 1e-5).unwrap().gelu(false).unwrap().matmul(w).unwrap()
}

fn interpreted(x: &Tensor, w: &Tensor, g: &Tensor) -> Vec<f64> {
    coil::set_backend(coil::Backend::Interpreter);
    let y = program(x, w, g).to_vec::<f64>().unwrap();
    coil::set_backend(coil::Backend::Compiled);
    coil::set_eager_tier(false);
    y
}

#[test]
fn new_shapes_compile_twice_and_a_recurring_shape_once_more() {
    if coil::backend() != coil::Backend::Compiled {
        return;
    }
    // The compiled path's own policy: tier 0 (`coil::tiered`, `tests/tier0.rs`) off.
    coil::set_config(coil::Config { eager_tier: false, ..coil::config().as_ref().clone() });
    let count = coil::compile_count;
    let inputs = |n: usize, d: usize| {
        let (x, w, g) = (randn(&[n, d], DType::F32), randn(&[d, d], DType::F32), randn(&[d], DType::F32));
        coil::realize(&[&x, &w, &g]).unwrap();
        (x, w, g)
    };
    let shapes: Vec<(usize, usize)> = (0..6).map(|i| (3 + 5 * i, 8 + 4 * i)).collect();
    let all: Vec<_> = shapes.iter().map(|&(n, d)| inputs(n, d)).collect();
    let before = count();
    for (x, w, g) in &all {
        let got = program(x, w, g).to_vec::<f64>().unwrap();
        assert!(close(&got, &interpreted(x, w, g), 1e-5), "shape {:?}", x.shape());
    }
    assert_eq!(count() - before, 2, "the first size static, the second symbolic, then no compile");

    // One size again and again: served by the symbolic compilation a few times, then its own.
    let (x, w, g) = &all[2];
    let want = interpreted(x, w, g);
    let before = count();
    for _ in 0..6 {
        assert!(close(&program(x, w, g).to_vec::<f64>().unwrap(), &want, 1e-5));
    }
    assert_eq!(count() - before, 1, "a recurring size is specialized once");
}
