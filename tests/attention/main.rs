//! The attention template on the CPU: written-out attention and `scaled_dot_product_attention`
//! compiled to one extern call agree with the reference interpreter (the full decomposition);
//! the cases are in `cases.rs` (shared with `tests/gpu.rs`).

mod cases;

use coil::{DType, Device, Tensor};

#[test]
fn attention_template_agrees_with_the_interpreter_on_the_cpu() {
    cases::check_all(Device::Cpu);
}

/// A compiled function whose sequence length is dynamic: one attention call serves every
/// length, and every length agrees with the interpreter.
#[test]
fn attention_with_a_dynamic_sequence_length() {
    let body = |a: &[Tensor]| -> coil::Result<Vec<Tensor>> {
        let (b, t, h, d) = (a[0].shape()[0] as i64, a[0].shape()[1] as i64, 2i64, 8i64);
        let heads = |x: &Tensor| x.view(&[b, t, h, d])?.transpose(1, 2);
        let (q, k, v) = (heads(&a[0])?, heads(&a[1])?, heads(&a[2])?);
        let att = q.matmul(&k.transpose(-2, -1)?)?.mul(1.0 / (d as f64).sqrt())?;
        let mask = Tensor::ones(&[t as usize, t as usize], DType::Bool).tril(0)?;
        let att = coil::where_(&mask, &att, f64::NEG_INFINITY)?.softmax(-1)?;
        Ok(vec![att.matmul(&v)?.transpose(1, 2)?.reshape(&[b, t, h * d])?])
    };
    let f = coil::compile(body).named("attention");
    coil::set_backend(coil::Backend::Compiled);
    coil::set_default_device(Device::Cpu);
    for t in [5usize, 9, 70] {
        let make = |seed: usize| {
            let v: Vec<f32> = (0..2 * t * 16).map(|i| ((i * 7 + seed * 13) as f32 * 0.37).sin()).collect();
            Tensor::from_vec(v, &[2, t, 16]).unwrap()
        };
        let args = [make(1), make(2), make(3)];
        for a in &args {
            a.mark_dynamic(1).unwrap();
        }
        let got = f.call(&args.iter().collect::<Vec<_>>()).unwrap()[0].to_vec::<f64>().unwrap();
        coil::set_backend(coil::Backend::Interpreter);
        let want = body(&args).unwrap()[0].to_vec::<f64>().unwrap();
        coil::set_backend(coil::Backend::Compiled);
        for (x, y) in got.iter().zip(&want) {
            assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "T = {t}: {x} vs {y}");
        }
    }
    assert_eq!(f.compile_count(), 1, "one compile serves every length");
    // The one compile is the attention call with the length symbolic.
    let args: Vec<Tensor> =
        (0..3).map(|_| Tensor::from_vec(vec![0.5f32; 2 * 12 * 16], &[2, 12, 16]).unwrap()).collect();
    for a in &args {
        a.mark_dynamic(1).unwrap();
    }
    let y = body(&args).unwrap();
    let compiled = coil::inspect(&[&y[0]]).unwrap();
    let ir = &compiled.pre_fusion;
    assert!(ir.starts_with("symbol s0"), "{ir}");
    assert!(ir.contains("extern attention causal scale=0.35355339059327373 batch=[2, 2] l=s0 s=s0 d=8"), "{ir}");
}
