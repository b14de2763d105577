use coil::nn::models::gpt2::{Gpt2, Gpt2Config};
use coil::nn::{clip_grad_norm, AdamW, AdamWConfig, Optimizer, ParamStore};
use coil::{DType, Device, Tensor};
fn main() -> coil::Result<()> {
    coil::manual_seed(0);
    let cfg = Gpt2Config {
        vocab_size: 64,
        block_size: 32,
        n_layer: 2,
        n_head: 2,
        n_embd: 32,
        dropout: 0.0,
        layer_norm_eps: 1e-5,
    };
    let store = ParamStore::new();
    let model = Gpt2::new(&store.root(Device::Cpu, DType::F32), cfg)?;
    let params = store.trainable();
    let mut opt = AdamW::new(params.clone(), AdamWConfig { lr: 1e-2, ..Default::default() })?;
    let data: Vec<i64> = (0..17 * 4).map(|i| (i * 7 % 64) as i64).collect();
    let x = Tensor::from_vec(data.iter().take(16 * 4).cloned().collect::<Vec<_>>(), &[4, 16])?;
    let y = Tensor::from_vec(data.iter().skip(4).take(16 * 4).cloned().collect::<Vec<_>>(), &[4, 16])?;
    let step = coil::compile(|a: &[Tensor]| {
        let loss = model.loss(&a[0], &a[1])?;
        let ps: Vec<Tensor> = params.iter().map(|p| p.tensor()).collect();
        let refs: Vec<&Tensor> = ps.iter().collect();
        let (loss, grads) = coil::value_and_grad(&loss, &refs)?;
        let mut out = vec![loss];
        out.extend(grads);
        Ok(out)
    });
    for i in 0..20 {
        let t = std::time::Instant::now();
        let out = step.call(&[&x, &y])?;
        let (clipped, norm) = clip_grad_norm(&out[1..], 1.0)?;
        opt.step(&clipped)?;
        println!(
            "step {i} loss {:.4} norm {:.3} {:.1} ms compiles {} total {}",
            out[0].item::<f32>()?,
            norm.item::<f32>().unwrap_or(f32::NAN),
            t.elapsed().as_secs_f64() * 1e3,
            step.compile_count(),
            coil_frontend::compile::compile_count()
        );
    }
    Ok(())
}
