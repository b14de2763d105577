//! The generator: a seed becomes a short chain of `coil` API calls on random tensors, made as a
//! user would make them (the ops themselves are in `ops.rs`).
//!
//! A trial starts from one to three input tensors (any dtype, rank 0 to 4, dims of size 0 to 7,
//! values that include NaN, infinities, -0.0, huge and tiny numbers), then applies one to four
//! ops, each on tensors the chain has made so far. Most arguments are plausible (dims in range,
//! shapes that broadcast, indices in bounds); some are wild (dims out of range, mismatched
//! shapes, wrong dtypes, sizes whose product overflows, indices out of bounds). The first call
//! that coil refuses ends the trial. Every choice depends only on the seed and on the shapes
//! and dtypes coil reports, so the same seed records the same program on every backend and
//! device.
//!
//! Every call is also written to the trial's script (`let t3 = t1.index_select(0, &t2)?;`),
//! which is what a failing seed prints, ready to be cut down into a regression test.

use coil::{DType, Device, Element, Error, Result, Tensor};
use half::{bf16, f16};

/// splitmix64: small and deterministic.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5EED_F022_C011_0001)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next() % (hi - lo + 1) as u64) as i64
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }

    /// A standard normal number (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = ((self.next() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        let u2 = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

/// Trials whose tensors hold more elements than this are recorded but not run: a valid graph
/// of 2^40 elements is a question for the allocator tests, not for a fuzzer that has seconds.
pub const RUN_LIMIT: usize = 1 << 16;

/// A recorded program, ready to run.
pub struct Trial {
    /// The tensors to realize.
    pub outputs: Vec<Tensor>,
    /// The calls made, one per line.
    pub script: Vec<String>,
    /// An f16 or bf16 tensor took part (see `compare.rs`: the compiled backends keep such
    /// intermediates in f32, the interpreter rounds after every op).
    pub half: bool,
    /// A value near its dtype's largest took part (see `compare.rs`: matrix products of such
    /// values overflow at different points on different backends).
    pub huge: bool,
    /// Some tensor the outputs need exceeds [`RUN_LIMIT`]: the trial is not run.
    pub too_large: bool,
}

/// What a seed turned into.
pub enum Built {
    /// coil refused a call while recording (the error, and the script up to that call).
    Rejected {
        error: Error,
        script: Vec<String>,
    },
    Ready(Trial),
}

/// Records trial `seed` with new tensors on `device` (realized with the thread's backend).
pub fn build(seed: u64, device: Device) -> Built {
    coil::manual_seed(seed);
    coil::set_default_device(device);
    let mut g = Gen { rng: Rng::new(seed), device, pool: vec![], script: vec![], half: false, huge: false };
    match g.program() {
        Err(error) => Built::Rejected { error, script: g.script },
        Ok(outputs) => {
            // Every tensor the outputs need counts: operands made on the side, and the
            // intermediates of composite ops (a norm over an empty dim has a full-size mean).
            let refs: Vec<&Tensor> = outputs.iter().collect();
            let graph = coil::capture(&refs).graph;
            let graph = coil::decompose(&graph).unwrap_or(graph);
            let too_large = graph.nodes.iter().any(|n| n.meta.numel() > RUN_LIMIT);
            Built::Ready(Trial { outputs, script: g.script, half: g.half, huge: g.huge, too_large })
        }
    }
}

/// The state of one trial being generated.
pub struct Gen {
    pub rng: Rng,
    device: Device,
    /// The tensors made so far; `pool[i]` is `t{i}` in the script.
    pool: Vec<Tensor>,
    script: Vec<String>,
    half: bool,
    huge: bool,
}

impl Gen {
    fn program(&mut self) -> Result<Vec<Tensor>> {
        for _ in 0..1 + self.rng.below(3) {
            let (dtype, shape) = (self.dtype(), self.shape());
            let t = self.data(dtype, &shape)?;
            self.push(t.0, Ok(t.1))?;
        }
        for _ in 0..1 + self.rng.below(4) {
            self.step()?;
        }
        let mut outputs = vec![self.pool.last().expect("inputs").clone()];
        if self.pool.len() > 2 && self.rng.chance(30) {
            outputs.push(self.pool[self.rng.below(self.pool.len() - 1)].clone());
        }
        Ok(outputs)
    }

    /// Adds the result of one API call to the pool (and its text to the script): a refusal ends
    /// the trial.
    pub fn push(&mut self, call: String, result: Result<Tensor>) -> Result<()> {
        self.script.push(format!("let t{} = {call}?;", self.pool.len()));
        let t = result?;
        self.half |= matches!(t.dtype(), DType::F16 | DType::BF16);
        self.pool.push(t);
        Ok(())
    }

    /// [`Gen::push`] for calls that return several tensors (`split`, `max_dim`).
    pub fn push_all(&mut self, call: String, result: Result<Vec<Tensor>>) -> Result<()> {
        let first = self.pool.len();
        self.script.push(format!("let [t{first}..] = {call}?;"));
        for t in result? {
            self.half |= matches!(t.dtype(), DType::F16 | DType::BF16);
            self.pool.push(t);
        }
        Ok(())
    }

    /// A tensor of the pool, most often one of the last made: (its name, the tensor).
    pub fn operand(&mut self) -> (String, Tensor) {
        let n = self.pool.len();
        let i = if self.rng.chance(60) { n - 1 } else { self.rng.below(n) };
        (format!("t{i}"), self.pool[i].clone())
    }

    /// The device the trial's tensors are made on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// True for the share of arguments that are chosen without regard to validity.
    pub fn wild(&mut self) -> bool {
        self.rng.chance(7)
    }

    pub fn dtype(&mut self) -> DType {
        // Floats twice as often: most ops are about them.
        let floats = [DType::F32, DType::F64, DType::F16, DType::BF16];
        if self.rng.chance(50) {
            self.rng.pick(&floats)
        } else {
            self.rng.pick(&DType::ALL)
        }
    }

    pub fn float_dtype(&mut self) -> DType {
        self.rng.pick(&[DType::F32, DType::F32, DType::F64, DType::F16, DType::BF16])
    }

    /// One dim's size: small, 0 and 1 often.
    pub fn size(&mut self) -> usize {
        self.rng.pick(&[0, 1, 1, 2, 2, 3, 3, 4, 5, 7])
    }

    /// A size that overflows whatever it multiplies, or is far too large to allocate.
    pub fn huge_size(&mut self) -> usize {
        self.rng.pick(&[usize::MAX, usize::MAX / 2 + 1, 1 << 62, 1 << 42, i64::MAX as usize])
    }

    /// A shape of rank 0 to 4, of at most a few hundred elements.
    pub fn shape(&mut self) -> Vec<usize> {
        let rank = self.rng.pick(&[0, 1, 1, 2, 2, 2, 3, 3, 4]);
        let mut shape: Vec<usize> = (0..rank).map(|_| self.size()).collect();
        while shape.iter().product::<usize>() > 400 {
            let d = self.rng.below(rank);
            shape[d] = (shape[d] / 2).max(1);
        }
        shape
    }

    /// A shape that broadcasts with `shape`: a suffix of it with some dims set to 1.
    pub fn broadcastable(&mut self, shape: &[usize]) -> Vec<usize> {
        let keep = shape.len() - self.rng.below(shape.len() + 1);
        let mut out = shape[shape.len() - keep..].to_vec();
        for d in out.iter_mut() {
            if self.rng.chance(30) {
                *d = 1;
            }
        }
        out
    }

    /// A dim of a tensor of `rank` (negative half the time); out of range when wild.
    pub fn dim(&mut self, rank: usize) -> i64 {
        let r = rank.max(1) as i64;
        if self.wild() {
            return self.rng.pick(&[r, -r - 1, r + 3, i64::MAX, i64::MIN]);
        }
        let d = self.rng.range(0, r - 1);
        if self.rng.chance(40) {
            d - r
        } else {
            d
        }
    }

    /// A list of distinct dims (empty: every dim); repeated or out of range when wild.
    pub fn dims(&mut self, rank: usize) -> Vec<i64> {
        if self.wild() {
            let d = self.dim(rank);
            return vec![d, d];
        }
        let n = self.rng.pick(&[0, 1, 1, 1, 2]).min(rank);
        let mut all: Vec<i64> = (0..rank as i64).collect();
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(all.remove(self.rng.below(all.len())));
        }
        out
    }

    /// A tensor of random values of `dtype` and `shape` (with NaN, infinities, -0.0, extremes),
    /// on the trial's device: (the script's text for it, the tensor).
    pub fn data(&mut self, dtype: DType, shape: &[usize]) -> Result<(String, Tensor)> {
        let n = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).unwrap_or(usize::MAX);
        if n > RUN_LIMIT {
            // Only a huge tensor made earlier has such a shape: stand in a lazy one.
            return Ok((format!("Ok(Tensor::zeros(&{shape:?}, DType::{dtype:?}))"), Tensor::zeros(shape, dtype)));
        }
        let specials = self.rng.chance(40);
        let values: Vec<f64> = (0..n).map(|_| self.value(dtype, specials)).collect();
        let text = format!("input(DType::{dtype:?}, &{shape:?}, &{values:?})");
        Ok((text, input(dtype, shape, &values)?.to_device(self.device)?))
    }

    /// An integer tensor of `shape` with values in `lo..=hi` (i64, sometimes i32).
    pub fn indices(&mut self, shape: &[usize], lo: i64, hi: i64) -> Result<(String, Tensor)> {
        let n = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).unwrap_or(usize::MAX);
        if n > RUN_LIMIT {
            return Ok((format!("Ok(Tensor::zeros(&{shape:?}, DType::I64))"), Tensor::zeros(shape, DType::I64)));
        }
        let values: Vec<f64> = (0..n).map(|_| self.rng.range(lo, hi.max(lo)) as f64).collect();
        let dtype = if self.rng.chance(80) { DType::I64 } else { DType::I32 };
        let text = format!("input(DType::{dtype:?}, &{shape:?}, &{values:?})");
        Ok((text, input(dtype, shape, &values)?.to_device(self.device)?))
    }

    /// One value of `dtype`, with the special values of its kind when `specials`.
    fn value(&mut self, dtype: DType, specials: bool) -> f64 {
        let special = specials && self.rng.chance(20);
        match dtype {
            DType::Bool => self.rng.below(2) as f64,
            _ if dtype.is_float() && special => {
                let (huge, tiny) = extremes(dtype);
                let v = self.rng.pick(&[
                    f64::NAN,
                    f64::INFINITY,
                    f64::NEG_INFINITY,
                    -0.0,
                    0.0,
                    huge,
                    -huge,
                    tiny,
                    -tiny,
                    1.0,
                ]);
                self.huge |= v.abs() == huge;
                v
            }
            _ if dtype.is_float() => (self.rng.normal() * 4.0 * 64.0).round() / 64.0,
            _ if special => {
                let (lo, hi) = int_range(dtype);
                self.rng.pick(&[lo as f64, hi as f64, 0.0, -1.0, 1.0])
            }
            DType::U8 => self.rng.range(0, 9) as f64,
            _ => self.rng.range(-5, 5) as f64,
        }
    }
}

/// The largest value of a float dtype's order that a few additions overflow, and its smallest
/// subnormal.
fn extremes(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F16 => (30000.0, 6e-8),
        DType::BF16 => (1e38, 1e-40),
        DType::F32 => (1e38, 1.5e-45),
        _ => (1e307, 5e-324),
    }
}

/// The range of an integer dtype.
fn int_range(dtype: DType) -> (i64, i64) {
    match dtype {
        DType::U8 => (0, 255),
        DType::I8 => (-128, 127),
        DType::I16 => (-32768, 32767),
        DType::I32 => (i32::MIN as i64, i32::MAX as i64),
        _ => (i64::MIN, i64::MAX),
    }
}

/// A CPU tensor of `dtype` from values given as f64 (converted as a cast does): how the
/// scripts write their inputs.
pub fn input(dtype: DType, shape: &[usize], values: &[f64]) -> Result<Tensor> {
    fn typed<T: Element>(shape: &[usize], values: &[f64]) -> Result<Tensor> {
        Tensor::from_vec(values.iter().map(|&x| T::from_f64(x)).collect(), shape)
    }
    match dtype {
        DType::Bool => typed::<bool>(shape, values),
        DType::U8 => typed::<u8>(shape, values),
        DType::I8 => typed::<i8>(shape, values),
        DType::I16 => typed::<i16>(shape, values),
        DType::I32 => typed::<i32>(shape, values),
        DType::I64 => typed::<i64>(shape, values),
        DType::F16 => typed::<f16>(shape, values),
        DType::BF16 => typed::<bf16>(shape, values),
        DType::F32 => typed::<f32>(shape, values),
        DType::F64 => typed::<f64>(shape, values),
    }
}
