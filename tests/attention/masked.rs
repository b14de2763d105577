//! Attention with an explicit mask through the template, shared by `tests/attention/main.rs`
//! (CPU) and `tests/gpu.rs` (CUDA): `scaled_dot_product_attention(q, k, v, mask)` compiled on a
//! device is one extern call reading the mask through its strides (never expanded to the
//! scores' shape), and agrees with the interpreter (the full decomposition) on the same random
//! inputs: decode steps (one row, or grouped-query rows, against a long key range of which a
//! prefix is kept: the split kernels on CUDA), masks broadcast over the heads, added masks, and
//! rows that keep no key (0, as PyTorch).

use super::{agrees, normals, report, tensor};
use coil::{Backend, DType, Device, Result, Tensor};

/// What a case's mask keeps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MaskForm {
    /// `[1, S]` bool: keys up to the position (a decode step over its cache).
    Prefix(usize),
    /// `[L, S]` bool: row `r` keeps keys up to `base + r` (grouped-query rows of one step).
    Rows(usize),
    /// `[B, 1, L, S]` bool, broadcast over the heads: scattered keys, row 1 keeps none.
    PerBatch,
    /// `[L, S]` of the operands' dtype, added: -inf in places, row 2 all -inf.
    Added,
}

/// One masked case: q `[*batch, L, D]`, k and v `[*batch, S, D]`.
#[derive(Clone, Debug)]
pub struct MaskedCase {
    pub dtype: DType,
    pub batch: Vec<usize>,
    pub l: usize,
    pub s: usize,
    pub d: usize,
    pub mask: MaskForm,
}

impl MaskedCase {
    pub fn name(&self) -> String {
        format!("{:?} {} {:?} L={} S={} D={}", self.mask, self.dtype, self.batch, self.l, self.s, self.d)
    }
}

/// The cases every device runs.
pub fn masked_cases() -> Vec<MaskedCase> {
    let c = |dtype, batch: &[usize], (l, s, d), mask| MaskedCase { dtype, batch: batch.to_vec(), l, s, d, mask };
    vec![
        // GPT-2 decode: one row per head against a cache of 300, position 170.
        c(DType::BF16, &[2, 3], (1, 300, 64), MaskForm::Prefix(170)),
        // Llama-style grouped-query rows: 4 query heads per key/value head, D = 128.
        c(DType::BF16, &[2, 2], (4, 200, 128), MaskForm::Rows(100)),
        // f32 decode (the simple split kernel on CUDA), a position inside the first tile.
        c(DType::F32, &[2, 2], (1, 150, 64), MaskForm::Prefix(20)),
        // More rows than the split kernels take: the row-block kernels with an added mask.
        c(DType::F16, &[3], (70, 90, 64), MaskForm::Added),
        c(DType::F32, &[2], (20, 33, 16), MaskForm::Added),
        // A mask per batch index broadcast over the heads, a row that keeps no key.
        c(DType::BF16, &[2, 2], (5, 40, 32), MaskForm::PerBatch),
    ]
}

/// The case's mask, of its shape and dtype (see [`MaskForm`]).
pub fn mask_tensor(case: &MaskedCase, device: Device) -> Result<Tensor> {
    let (l, s) = (case.l, case.s);
    let bools = |shape: &[usize], keep: &dyn Fn(usize, usize, usize) -> bool| -> Result<Tensor> {
        let n: usize = shape.iter().product();
        let v: Vec<bool> = (0..n).map(|x| keep(x / (l * s), x / s % l, x % s)).collect();
        Tensor::from_vec(v, shape)?.to_device(device)
    };
    match case.mask {
        MaskForm::Prefix(pos) => bools(&[1, s], &|_, _, j| j <= pos),
        MaskForm::Rows(base) => bools(&[l, s], &|_, r, j| j <= base + r),
        MaskForm::PerBatch => bools(&[case.batch[0], 1, l, s], &|b, r, j| r != 1 && (j * 7 + r + 3 * b) % 5 != 0),
        MaskForm::Added => {
            let v: Vec<f32> = (0..l * s)
                .map(|x| {
                    let (r, j) = (x / s, x % s);
                    if r == 2 || (r + 2 * j) % 7 == 3 {
                        f32::NEG_INFINITY
                    } else {
                        ((r * 5 + j) as f32 * 0.3).sin()
                    }
                })
                .collect();
            tensor(&v, &[l, s], case.dtype, device)
        }
    }
}

/// q, k, v and the mask of a case.
pub fn masked_inputs(case: &MaskedCase, device: Device) -> Result<Vec<Tensor>> {
    let batch: usize = case.batch.iter().product();
    let with = |rows: usize| -> Vec<usize> { case.batch.iter().copied().chain([rows, case.d]).collect() };
    Ok(vec![
        tensor(&normals(11, batch * case.l * case.d), &with(case.l), case.dtype, device)?,
        tensor(&normals(12, batch * case.s * case.d), &with(case.s), case.dtype, device)?,
        tensor(&normals(13, batch * case.s * case.d), &with(case.s), case.dtype, device)?,
        mask_tensor(case, device)?,
    ])
}

/// Runs one case compiled on `device` and on the interpreter; the error says what differs.
pub fn check_masked(case: &MaskedCase, device: Device) -> std::result::Result<(), String> {
    let fail = |what: String| format!("{}: {what}", case.name());
    let program = |a: &[Tensor]| coil::scaled_dot_product_attention(&a[0], &a[1], &a[2], Some(&a[3]), false, None);
    coil::set_backend(Backend::Interpreter);
    coil::set_default_device(Device::Cpu);
    let reference = program(&masked_inputs(case, Device::Cpu).map_err(|e| fail(e.to_string()))?)
        .and_then(|y| y.to_vec::<f64>())
        .map_err(|e| fail(format!("interpreter: {e}")))?;
    coil::set_backend(Backend::Compiled);
    coil::set_eager_tier(false);
    coil::set_default_device(device);
    let y = program(&masked_inputs(case, device).map_err(|e| fail(e.to_string()))?).map_err(|e| fail(e.to_string()))?;
    let compiled = coil::inspect(&[&y]).map_err(|e| fail(format!("compile: {e}")))?;
    let ir = &compiled.pre_fusion;
    // Few rows (a decode step): one template call; more (a prefill): the decomposition.
    let template = case.l <= coil_passes::attention::MASKED_MAX_ROWS;
    if template && (ir.matches("extern attention").count() != 1 || !ir.contains(" mask=[")) {
        return Err(fail(format!("not one masked attention call in\n{ir}")));
    }
    if !template && ir.contains("extern attention") {
        return Err(fail(format!("a masked attention call for {} rows in\n{ir}", case.l)));
    }
    // The template reads the mask where it lies: no buffer of the scores' size.
    let scores = case.batch.iter().product::<usize>() * case.l * case.s;
    let program = match &compiled.executable {
        coil::Executable::Cpu(graph) => graph.program(),
        coil::Executable::Cuda(graph) => graph.program(),
    };
    let full = |b: &&coil::ir::loops::LoopBuffer| b.meta.shape.ends_with(&[case.l, case.s]) && b.meta.numel() >= scores;
    if let Some(b) = program.buffers.iter().find(full).filter(|_| template) {
        return Err(fail(format!("a buffer of the scores' size: {} {}", b.name, b.meta)));
    }
    let got = y.to_vec::<f64>().map_err(|e| fail(format!("compiled run: {e}")))?;
    agrees(&got, &reference, case.dtype).map_err(fail)
}

/// Every masked case on `device`; all failures reported at once.
pub fn check_masked_all(device: Device) {
    report(masked_cases().iter().filter_map(|c| check_masked(c, device).err()).collect());
}
