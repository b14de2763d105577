//! The ops a trial's steps call, by family: pointwise, reductions, views, indexing and data
//! movement, nn functions, matrix products and creation. Each step picks an operand from the
//! pool, makes the other arguments (plausible, or wild: see [`Gen::wild`]) and records one
//! call with its script line.

use crate::gen::Gen;
use coil::{DType, Result, Scalar, Tensor};

type Unary = (&'static str, fn(&Tensor) -> Result<Tensor>);

/// Every unary method without arguments.
const UNARY: &[Unary] = &[
    ("neg", |t| t.neg()),
    ("abs", |t| t.abs()),
    ("sign", |t| t.sign()),
    ("exp", |t| t.exp()),
    ("exp2", |t| t.exp2()),
    ("expm1", |t| t.expm1()),
    ("log", |t| t.log()),
    ("log2", |t| t.log2()),
    ("log1p", |t| t.log1p()),
    ("sqrt", |t| t.sqrt()),
    ("rsqrt", |t| t.rsqrt()),
    ("sin", |t| t.sin()),
    ("cos", |t| t.cos()),
    ("tan", |t| t.tan()),
    ("tanh", |t| t.tanh()),
    ("sigmoid", |t| t.sigmoid()),
    ("erf", |t| t.erf()),
    ("erfinv", |t| t.erfinv()),
    ("atan", |t| t.atan()),
    ("asin", |t| t.asin()),
    ("acos", |t| t.acos()),
    ("bitwise_not", |t| t.bitwise_not()),
    ("floor", |t| t.floor()),
    ("ceil", |t| t.ceil()),
    ("round", |t| t.round()),
    ("trunc", |t| t.trunc()),
    ("reciprocal", |t| t.reciprocal()),
    ("logical_not", |t| t.logical_not()),
    ("isnan", |t| t.isnan()),
    ("isinf", |t| t.isinf()),
    ("relu", |t| t.relu()),
    ("silu", |t| t.silu()),
    ("detach", |t| t.detach()),
    ("contiguous", |t| Ok(t.contiguous())),
    // Compositions written in the frontend (`frontend/src/ops/{math,activation,...}.rs`).
    ("log10", |t| t.log10()),
    ("frac", |t| t.frac()),
    ("isfinite", |t| t.isfinite()),
    ("isposinf", |t| t.isposinf()),
    ("isneginf", |t| t.isneginf()),
    ("signbit", |t| t.signbit()),
    ("sinh", |t| t.sinh()),
    ("cosh", |t| t.cosh()),
    ("asinh", |t| t.asinh()),
    ("acosh", |t| t.acosh()),
    ("atanh", |t| t.atanh()),
    ("square", |t| t.square()),
    ("sinc", |t| t.sinc()),
    ("deg2rad", |t| t.deg2rad()),
    ("logit", |t| t.logit(None)),
    ("entr", |t| t.entr()),
    ("leaky_relu", |t| t.leaky_relu(0.1)),
    ("elu", |t| t.elu(1.0)),
    ("selu", |t| t.selu()),
    ("celu", |t| t.celu(0.5)),
    ("mish", |t| t.mish()),
    ("hardswish", |t| t.hardswish()),
    ("hardsigmoid", |t| t.hardsigmoid()),
    ("hardtanh", |t| t.hardtanh(-1.0, 1.0)),
    ("relu6", |t| t.relu6()),
    ("logsigmoid", |t| t.logsigmoid()),
    ("softsign", |t| t.softsign()),
    ("tanhshrink", |t| t.tanhshrink()),
    ("hardshrink", |t| t.hardshrink(0.5)),
    ("softshrink", |t| t.softshrink(0.5)),
    ("threshold", |t| t.threshold(0.1, 2.0)),
    ("glu", |t| t.glu(-1)),
    ("softmin", |t| t.softmin(0)),
    ("trace", |t| t.trace()),
    ("diag", |t| t.diag(1)),
    ("diagonal", |t| t.diagonal(-1, 0, -1)),
    ("fliplr", |t| t.fliplr()),
    ("rot90", |t| t.rot90(1, [0, -1])),
    ("roll", |t| t.roll(&[2], &[])),
    ("repeat_interleave", |t| t.repeat_interleave(2, Some(0))),
    ("atleast_2d", |t| t.atleast_2d()),
    ("movedim", |t| t.movedim(0, -1)),
    ("diff", |t| t.diff(1, -1, None, None)),
    ("normalize", |t| t.normalize(2.0, -1, 1e-12)),
    ("pixel_shuffle", |t| t.pixel_shuffle(2)),
    ("max_pool1d", |t| t.max_pool1d(2, None, 0)),
    ("avg_pool1d", |t| t.avg_pool1d(2, Some(1), 1, false)),
    ("adaptive_avg_pool1d", |t| t.adaptive_avg_pool(&[3])),
    ("group_norm", |t| t.group_norm(1, None, None, 1e-5)),
    ("max_pool_ceil", |t| t.max_pool(&[2], &[2], &[1], &[2], true)),
    ("avg_pool_ceil", |t| t.avg_pool(&[3], &[2], &[1], true, false)),
    ("interpolate_bicubic", |t| t.interpolate(&[3, 2], coil::Interpolation::Bicubic { align_corners: false })),
    ("interpolate_linear", |t| t.interpolate(&[5], coil::Interpolation::Linear { align_corners: true })),
    ("fold", |t| t.fold([2, 2], [1, 1], [1, 1], [0, 0], [1, 1])),
    ("unfold2d", |t| t.unfold2d([2, 1], [1, 1], [0, 0], [1, 1])),
    ("local_response_norm", |t| t.local_response_norm(2, 1e-4, 0.75, 1.0)),
    ("cov", |t| t.cov(1.0)),
    ("trapezoid", |t| t.trapezoid(0.5, -1)),
    ("one_hot", |t| t.one_hot(3)),
    ("cummax", |t| t.cummax(-1).map(|p| p.1)),
    ("cummin", |t| t.cummin(0).map(|p| p.0)),
    ("logcumsumexp", |t| t.logcumsumexp(0)),
    ("cumprod", |t| t.cumprod(-1)),
    ("histc", |t| t.histc(4, 0.0, 0.0)),
    ("take", |t| t.take(&coil::Tensor::from_vec(vec![0i64, -1], &[2])?.to_device(t.device())?)),
];

/// A binary method's second operand: a tensor, or a Rust scalar (weak in type promotion).
pub enum Arg {
    T(Tensor),
    F(f64),
    I(i64),
    B(bool),
}

type Binary = (&'static str, fn(&Tensor, Arg) -> Result<Tensor>);

/// A table of binary methods, each taking an [`Arg`] as the method's `impl IntoTensor`; the
/// methods after `tensor:` take only a `&Tensor`, and get a Rust scalar as a 0-d tensor.
macro_rules! binary_methods {
    ($($name:ident),* ; tensor: $($tname:ident),*) => {
        &[$((stringify!($name), |a: &Tensor, b: Arg| match b {
            Arg::T(t) => a.$name(&t),
            Arg::F(v) => a.$name(v),
            Arg::I(v) => a.$name(v),
            Arg::B(v) => a.$name(v),
        }),)* $((stringify!($tname), |a: &Tensor, b: Arg| match b {
            Arg::T(t) => a.$tname(&t),
            Arg::F(v) => a.$tname(&Tensor::full(&[], v, DType::F64)),
            Arg::I(v) => a.$tname(&Tensor::full(&[], v, DType::I64)),
            Arg::B(v) => a.$tname(&Tensor::full(&[], v, DType::Bool)),
        })),*]
    };
}

/// Binary ops with more arguments, fixed, so that the binary table can call them.
trait FixedArgs {
    fn l1_loss_mean(&self, y: &Tensor) -> Result<Tensor>;
    fn smooth_l1_loss_mean(&self, y: &Tensor) -> Result<Tensor>;
    fn cosine_similarity_last(&self, y: &Tensor) -> Result<Tensor>;
    fn cdist2(&self, y: &Tensor) -> Result<Tensor>;
    fn grid_sample_zeros(&self, y: &Tensor) -> Result<Tensor>;
    fn bucketize_left(&self, y: &Tensor) -> Result<Tensor>;
}

impl FixedArgs for Tensor {
    fn l1_loss_mean(&self, y: &Tensor) -> Result<Tensor> {
        self.l1_loss(y, coil::LossReduction::Mean)
    }
    fn smooth_l1_loss_mean(&self, y: &Tensor) -> Result<Tensor> {
        self.smooth_l1_loss(y, coil::LossReduction::Mean, 0.5)
    }
    fn cosine_similarity_last(&self, y: &Tensor) -> Result<Tensor> {
        self.cosine_similarity(y, -1, 1e-8)
    }
    fn cdist2(&self, y: &Tensor) -> Result<Tensor> {
        self.cdist(y, 2.0)
    }
    fn grid_sample_zeros(&self, y: &Tensor) -> Result<Tensor> {
        self.grid_sample(y, coil::GridSample::Sample { bilinear: true, border: false, align_corners: false })
    }
    fn bucketize_left(&self, y: &Tensor) -> Result<Tensor> {
        self.bucketize(y, false)
    }
}

/// Every binary method.
const BINARY: &[Binary] = binary_methods!(
    add,
    sub,
    mul,
    div,
    floor_divide,
    trunc_divide,
    remainder,
    pow,
    maximum,
    minimum,
    eq,
    ne,
    lt,
    le,
    gt,
    ge,
    logical_and,
    logical_or,
    atan2,
    bitwise_and,
    bitwise_or,
    bitwise_xor,
    bitwise_left_shift,
    bitwise_right_shift,
    rsub,
    rdiv,
    xlogy,
    copysign,
    float_power,
    fmod;
    tensor: hypot,
    logical_xor,
    logaddexp,
    logaddexp2,
    fmax,
    fmin,
    heaviside,
    xlog1py,
    l1_loss_mean,
    smooth_l1_loss_mean,
    cosine_similarity_last,
    outer,
    dot,
    kron,
    cdist2,
    grid_sample_zeros,
    bucketize_left
);

/// Reductions over a list of dims with `keepdim`.
type Reduce = (&'static str, fn(&Tensor, &[i64], bool) -> Result<Tensor>);
const REDUCE: &[Reduce] = &[
    ("sum", |t, d, k| t.sum(d, k)),
    ("mean", |t, d, k| t.mean(d, k)),
    ("prod", |t, d, k| t.prod(d, k)),
    ("amax", |t, d, k| t.amax(d, k)),
    ("amin", |t, d, k| t.amin(d, k)),
    ("logsumexp", |t, d, k| t.logsumexp(d, k)),
    ("all", |t, d, k| t.all(d, k)),
    ("any", |t, d, k| t.any(d, k)),
    ("var", |t, d, k| t.var(d, 1.0, k)),
    ("std", |t, d, k| t.std(d, 0.0, k)),
    ("norm", |t, d, k| t.norm(2.0, d, k)),
    ("norm_1", |t, d, k| t.norm(1.0, d, k)),
    ("norm_inf", |t, d, k| t.norm(f64::INFINITY, d, k)),
    ("nansum", |t, d, k| t.nansum(d, k)),
    ("nanmean", |t, d, k| t.nanmean(d, k)),
    ("count_nonzero", |t, d, _| t.count_nonzero(d)),
];

/// Whole-tensor reductions.
const REDUCE_ALL: &[Unary] = &[
    ("sum_all", |t| t.sum_all()),
    ("max_all", |t| t.max_all()),
    ("min_all", |t| t.min_all()),
    ("all_all", |t| t.all_all()),
    ("any_all", |t| t.any_all()),
];

impl Gen {
    /// One step: an op of a random family on the pool.
    pub fn step(&mut self) -> Result<()> {
        match self.rng.below(100) {
            0..=17 => self.unary(),
            18..=37 => self.binary(),
            38..=51 => self.reduce(),
            52..=67 => self.view(),
            68..=79 => self.movement(),
            80..=89 => self.nn(),
            90..=95 => self.linalg(),
            _ => self.creation(),
        }
    }

    fn unary(&mut self) -> Result<()> {
        let (name, x) = self.operand();
        match self.rng.below(10) {
            0..=5 => {
                let (op, f) = self.rng.pick(UNARY);
                self.push(format!("{name}.{op}()"), f(&x))
            }
            6 => {
                let tanh = self.rng.chance(50);
                self.push(format!("{name}.gelu({tanh})"), x.gelu(tanh))
            }
            7 => {
                let (lo, hi) = (self.scalar_bound(), self.scalar_bound());
                self.push(format!("{name}.clamp({lo:?}, {hi:?})"), x.clamp(lo, hi))
            }
            8 => {
                let (beta, threshold) = (self.rng.pick(&[1.0, 0.5, 2.0]), self.rng.pick(&[20.0, 1.0]));
                self.push(format!("{name}.softplus({beta:?}, {threshold:?})"), x.softplus(beta, threshold))
            }
            _ => self.cast(name, x),
        }
    }

    /// `to_dtype`, or `nan_to_num`. Floats go to integers only through `nan_to_num` and a
    /// clamp into range: PyTorch leaves other float-to-integer casts undefined.
    fn cast(&mut self, name: String, x: Tensor) -> Result<()> {
        let to = self.dtype();
        if x.dtype().is_float() && to.is_integral() && to != DType::Bool {
            let safe = x.nan_to_num(0.0, Some(0.0), Some(0.0)).and_then(|t| t.clamp(Some(0i64), Some(100i64)));
            let text = format!("{name}.nan_to_num(0.0, Some(0.0), Some(0.0))?.clamp(Some(0), Some(100))?");
            return self.push(format!("{text}.to_dtype(DType::{to:?})"), safe.and_then(|t| t.to_dtype(to)));
        }
        if self.rng.chance(70) {
            return self.push(format!("{name}.to_dtype(DType::{to:?})"), x.to_dtype(to));
        }
        let (nan, pos, neg) = (self.rng.pick(&[0.0, 1.5]), self.rng.pick(&[None, Some(7.0)]), None);
        self.push(format!("{name}.nan_to_num({nan:?}, {pos:?}, {neg:?})"), x.nan_to_num(nan, pos, neg))
    }

    /// A clamp bound: absent, an integer or a float (a special one now and then).
    fn scalar_bound(&mut self) -> Option<Scalar> {
        match self.rng.below(6) {
            0 => None,
            1 | 2 => Some(Scalar::Int(self.rng.range(-3, 3))),
            3 => Some(Scalar::Float(self.rng.pick(&[f64::NAN, f64::INFINITY, -0.0, 0.0]))),
            _ => Some(Scalar::Float(self.rng.range(-8, 8) as f64 / 4.0)),
        }
    }

    fn binary(&mut self) -> Result<()> {
        let (name, x) = self.operand();
        let (op, f) = self.rng.pick(BINARY);
        match self.rng.below(10) {
            // A Rust scalar on the right.
            0..=2 => {
                let (text, arg) = match self.rng.below(3) {
                    0 => {
                        let v = self.rng.pick(&[0.5, -2.0, 0.0, -0.0, f64::NAN, f64::INFINITY, 1e30, 3.0]);
                        (format!("{v:?}"), Arg::F(v))
                    }
                    1 => {
                        let v = self.rng.pick(&[0i64, 1, -1, 2, 3, i64::MAX, i64::MIN]);
                        (format!("{v}i64"), Arg::I(v))
                    }
                    _ => {
                        let v = self.rng.chance(50);
                        (format!("{v}"), Arg::B(v))
                    }
                };
                self.push(format!("{name}.{op}({text})"), f(&x, arg))
            }
            // A tensor that broadcasts with `x` (of another dtype now and then).
            3..=6 => {
                let shape = if self.wild() { self.shape() } else { self.broadcastable(x.shape()) };
                let dtype = if self.rng.chance(50) { x.dtype() } else { self.dtype() };
                let (text, y) = self.data(dtype, &shape)?;
                self.push(format!("{name}.{op}(&{text})"), f(&x, Arg::T(y)))
            }
            7 => {
                let (yname, y) = self.operand();
                self.push(format!("{name}.{op}(&{yname})"), f(&x, Arg::T(y)))
            }
            _ => {
                let shape = if self.wild() { self.shape() } else { self.broadcastable(x.shape()) };
                let dtype = if self.wild() { DType::I64 } else { DType::Bool };
                let (text, cond) = self.data(dtype, &shape)?;
                let other = self.rng.pick(&[0.0, f64::NAN, -1.5]);
                self.push(format!("coil::where_(&{text}, &{name}, {other:?})"), coil::where_(&cond, &x, other))
            }
        }
    }

    fn reduce(&mut self) -> Result<()> {
        let (name, x) = self.operand();
        let keepdim = self.rng.chance(40);
        match self.rng.below(10) {
            0..=5 => {
                let (op, f) = self.rng.pick(REDUCE);
                let dims = self.dims(x.rank());
                self.push(format!("{name}.{op}(&{dims:?}, {keepdim})"), f(&x, &dims, keepdim))
            }
            6 => {
                let (op, f) = self.rng.pick(REDUCE_ALL);
                self.push(format!("{name}.{op}()"), f(&x))
            }
            7 => {
                let dim = self.dim(x.rank());
                if self.rng.chance(50) {
                    self.push_all(format!("{name}.max_dim({dim}, {keepdim})"), x.max_dim(dim, keepdim).map(pair))
                } else {
                    self.push_all(format!("{name}.min_dim({dim}, {keepdim})"), x.min_dim(dim, keepdim).map(pair))
                }
            }
            8 => {
                let dim = if self.rng.chance(30) { None } else { Some(self.dim(x.rank())) };
                if self.rng.chance(50) {
                    self.push(format!("{name}.argmax({dim:?}, {keepdim})"), x.argmax(dim, keepdim))
                } else {
                    self.push(format!("{name}.argmin({dim:?}, {keepdim})"), x.argmin(dim, keepdim))
                }
            }
            _ => {
                let dim = self.dim(x.rank());
                match self.rng.below(4) {
                    0 | 1 => self.push(format!("{name}.cumsum({dim})"), x.cumsum(dim)),
                    2 => {
                        let descending = self.rng.chance(50);
                        self.push_all(format!("{name}.sort({dim}, {descending})"), x.sort(dim, descending).map(pair))
                    }
                    _ => {
                        // k up to the dim's size, or past it when wild.
                        let size = wrapped(x.shape(), dim);
                        let k = self.rng.below(size + 1) + self.wild() as usize;
                        let largest = self.rng.chance(50);
                        self.push_all(format!("{name}.topk({k}, {dim}, {largest})"), x.topk(k, dim, largest).map(pair))
                    }
                }
            }
        }
    }

    fn view(&mut self) -> Result<()> {
        let (name, x) = self.operand();
        let rank = x.rank();
        match self.rng.below(14) {
            0 => {
                let shape = self.reshape_target(x.shape());
                self.push(format!("{name}.reshape(&{shape:?})"), x.reshape(&shape))
            }
            1 => {
                let mut perm: Vec<i64> = (0..rank as i64).collect();
                for i in (1..perm.len()).rev() {
                    perm.swap(i, self.rng.below(i + 1));
                }
                if self.wild() {
                    perm.push(0);
                }
                self.push(format!("{name}.permute(&{perm:?})"), x.permute(&perm))
            }
            2 => {
                let (a, b) = (self.dim(rank), self.dim(rank));
                self.push(format!("{name}.transpose({a}, {b})"), x.transpose(a, b))
            }
            3 => self.push(format!("{name}.t()"), x.t()),
            4 => {
                let sizes = self.expand_target(x.shape());
                self.push(format!("{name}.expand(&{sizes:?})"), x.expand(&sizes))
            }
            5 => {
                let (oname, other) = self.operand();
                self.push(format!("{name}.expand_as(&{oname})"), x.expand_as(&other))
            }
            6 => {
                if self.rng.chance(50) {
                    self.push(format!("{name}.squeeze()"), x.squeeze())
                } else {
                    let d = self.dim(rank);
                    self.push(format!("{name}.squeeze_dim({d})"), x.squeeze_dim(d))
                }
            }
            7 => {
                let d = self.dim(rank + 1);
                self.push(format!("{name}.unsqueeze({d})"), x.unsqueeze(d))
            }
            8 => {
                let d = self.dim(rank);
                let (start, len) = (self.rng.range(-3, 3), self.rng.below(4));
                self.push(format!("{name}.narrow({d}, {start}, {len})"), x.narrow(d, start, len))
            }
            9 => {
                let d = self.dim(rank);
                let start = self.rng.pick(&[None, Some(0), Some(1), Some(-2), Some(9)]);
                let end = self.rng.pick(&[None, Some(2), Some(-1), Some(0), Some(i64::MAX)]);
                let step = if self.wild() { self.rng.pick(&[0, -1]) } else { self.rng.range(1, 3) };
                self.push(format!("{name}.slice({d}, {start:?}, {end:?}, {step})"), x.slice(d, start, end, step))
            }
            10 => {
                let (d, i) = (self.dim(rank), self.rng.range(-3, 3));
                self.push(format!("{name}.select({d}, {i})"), x.select(d, i))
            }
            11 => {
                let d = self.dim(rank);
                match self.rng.below(3) {
                    0 => {
                        let size = self.rng.below(4);
                        self.push_all(format!("{name}.split({size}, {d})"), x.split(size, d))
                    }
                    1 => {
                        let chunks = self.rng.below(4);
                        self.push_all(format!("{name}.chunk({chunks}, {d})"), x.chunk(chunks, d))
                    }
                    _ => {
                        let sizes: Vec<usize> = (0..self.rng.range(1, 3)).map(|_| self.size()).collect();
                        self.push_all(format!("{name}.split_sizes(&{sizes:?}, {d})"), x.split_sizes(&sizes, d))
                    }
                }
            }
            12 => {
                let (s, e) = (self.dim(rank), self.dim(rank));
                self.push(format!("{name}.flatten({s}, {e})"), x.flatten(s, e))
            }
            _ => {
                let d = self.dim(rank);
                let size = x.shape().get(d.rem_euclid(rank.max(1) as i64) as usize).copied().unwrap_or(1) as i64;
                let options = [vec![size], vec![1, size], vec![-1, 1], vec![size, -1], vec![2, -1]];
                let sizes = options[self.rng.below(options.len())].clone();
                self.push(format!("{name}.unflatten({d}, &{sizes:?})"), x.unflatten(d, &sizes))
            }
        }
    }

    /// A reshape target for `shape`: the same elements regrouped (with a `-1` now and then), or
    /// sizes that do not fit when wild.
    fn reshape_target(&mut self, shape: &[usize]) -> Vec<i64> {
        if self.wild() {
            return vec![self.huge_size() as i64, 2, -1];
        }
        let numel = coil::ir::graph::numel(shape);
        match self.rng.below(4) {
            0 => vec![-1],
            1 => shape.iter().rev().map(|&s| s as i64).collect(),
            2 if numel >= 2 && numel & 1 == 0 => vec![2, -1, 1],
            _ => {
                let mut out: Vec<i64> = shape.iter().map(|&s| s as i64).collect();
                out.insert(self.rng.below(out.len() + 1), 1);
                out
            }
        }
    }

    /// An `expand` target: size-1 dims stretched, `-1`s, a new leading dim; huge when wild.
    fn expand_target(&mut self, shape: &[usize]) -> Vec<i64> {
        let mut out: Vec<i64> = Vec::new();
        if self.rng.chance(40) {
            out.push(self.rng.range(0, 3));
        }
        for &s in shape {
            out.push(match s {
                1 => self.rng.range(0, 4),
                _ if self.rng.chance(30) => -1,
                s => s as i64,
            });
        }
        if self.wild() {
            out.insert(0, self.huge_size() as i64);
        }
        out
    }

    fn movement(&mut self) -> Result<()> {
        let (name, x) = self.operand();
        let rank = x.rank();
        let d = self.dim(rank);
        let size = wrapped(x.shape(), d);
        match self.rng.below(10) {
            0 | 1 => {
                let shape = match self.rng.below(10) {
                    0 => vec![],
                    1 if self.wild() => vec![2, 2],
                    _ => vec![self.rng.below(4)],
                };
                let (text, index) = self.index_tensor(&shape, size)?;
                self.push(format!("{name}.index_select({d}, &{text})"), x.index_select(d, &index))
            }
            2 | 3 => {
                let shape = self.index_shape(x.shape(), d, false);
                let (text, index) = self.index_tensor(&shape, size)?;
                self.push(format!("{name}.gather({d}, &{text})"), x.gather(d, &index))
            }
            4 => self.scatter(name, x, d),
            5 => {
                let mut repeats: Vec<usize> = (0..rank + self.rng.below(2)).map(|_| self.rng.below(3)).collect();
                if self.wild() {
                    repeats.insert(0, self.huge_size());
                }
                self.push(format!("{name}.repeat(&{repeats:?})"), x.repeat(&repeats))
            }
            6 => {
                let pads: Vec<i64> =
                    (0..2 * self.rng.range(0, rank.min(3) as i64)).map(|_| self.rng.range(-2, 2)).collect();
                let value = self.rng.pick(&[0.0, -1.5, f64::NAN]);
                self.push(format!("{name}.pad(&{pads:?}, {value:?})"), x.pad(&pads, value))
            }
            7 => {
                let k = self.rng.range(-2, 2);
                if self.rng.chance(50) {
                    self.push(format!("{name}.tril({k})"), x.tril(k))
                } else {
                    self.push(format!("{name}.triu({k})"), x.triu(k))
                }
            }
            8 => {
                let dims = self.dims(rank);
                self.push(format!("{name}.flip(&{dims:?})"), x.flip(&dims))
            }
            _ => self.join(name, x, d),
        }
    }

    /// The shape of a gather or scatter index for `shape` along `d`: no larger than the input
    /// outside `d`; for a scatter no larger along `d` either.
    fn index_shape(&mut self, shape: &[usize], d: i64, scatter: bool) -> Vec<usize> {
        let along = wrapped_dim(shape.len(), d);
        let mut out: Vec<usize> = shape
            .iter()
            .enumerate()
            .map(|(i, &s)| if i == along && !scatter { self.rng.below(4) } else { self.rng.below(s + 1) })
            .collect();
        if self.wild() {
            out.push(2);
        }
        out
    }

    /// An index tensor of `shape` for a dim of `size`: in bounds; when wild, of floats (refused
    /// when recorded) or out of bounds (an error only the values show, at realize).
    fn index_tensor(&mut self, shape: &[usize], size: usize) -> Result<(String, Tensor)> {
        if self.wild() {
            return self.data(DType::F32, shape);
        }
        if self.wild() {
            return self.indices(shape, -2, size as i64 + 1);
        }
        self.indices(shape, 0, (size as i64 - 1).max(0))
    }

    /// `scatter` (indices distinct along `d`: PyTorch leaves the winner of a repeated index
    /// undefined) or `scatter_add` (any indices).
    fn scatter(&mut self, name: String, x: Tensor, d: i64) -> Result<()> {
        let shape = self.index_shape(x.shape(), d, true);
        let dtype = if self.wild() { DType::F64 } else { x.dtype() };
        let (src_text, src) = self.data(dtype, &shape)?;
        let size = wrapped(x.shape(), d);
        if self.rng.chance(50) {
            let (text, index) = self.index_tensor(&shape, size)?;
            return self.push(format!("{name}.scatter_add({d}, &{text}, &{src_text})"), x.scatter_add(d, &index, &src));
        }
        // Distinct positions along `d`: each line takes a prefix of a permutation of the dim.
        let along = wrapped_dim(shape.len(), d);
        let n = coil::ir::graph::numel(&shape);
        if n > crate::gen::RUN_LIMIT || size > crate::gen::RUN_LIMIT {
            let (text, index) = self.indices(&shape, 0, 0)?;
            return self.push(format!("{name}.scatter({d}, &{text}, &{src_text})"), x.scatter(d, &index, &src));
        }
        let len = shape.get(along).copied().unwrap_or(1).max(1);
        let mut values = Vec::with_capacity(n);
        let mut perm: Vec<usize> = (0..size.max(1)).collect();
        let stride: usize = shape.iter().skip(along + 1).product();
        for i in 0..n {
            if i % (stride * len) < stride {
                for j in (1..perm.len()).rev() {
                    perm.swap(j, self.rng.below(j + 1));
                }
            }
            values.push(perm[(i / stride) % len % perm.len()] as f64);
        }
        let text = format!("input(DType::I64, &{shape:?}, &{values:?})");
        let index = crate::gen::input(DType::I64, &shape, &values)?.to_device(x.device())?;
        self.push(format!("{name}.scatter({d}, &{text}, &{src_text})"), x.scatter(d, &index, &src))
    }

    /// `cat` or `stack` of `x` with tensors that fit it (another dtype now and then).
    fn join(&mut self, name: String, x: Tensor, d: i64) -> Result<()> {
        let stack = self.rng.chance(30);
        let mut texts = vec![format!("&{name}")];
        let mut parts = vec![x.clone()];
        for _ in 0..self.rng.below(3) {
            let mut shape = x.shape().to_vec();
            if !stack && !shape.is_empty() && !self.wild() {
                let along = wrapped_dim(shape.len(), d);
                shape[along] = self.size();
            } else if self.wild() {
                shape = self.shape();
            }
            let dtype = if self.rng.chance(70) { x.dtype() } else { self.dtype() };
            let (text, t) = self.data(dtype, &shape)?;
            texts.push(format!("&{text}"));
            parts.push(t);
        }
        let refs: Vec<&Tensor> = parts.iter().collect();
        let list = texts.join(", ");
        if stack {
            self.push(format!("coil::stack(&[{list}], {d})"), coil::stack(&refs, d))
        } else {
            self.push(format!("coil::cat(&[{list}], {d})"), coil::cat(&refs, d))
        }
    }
}

fn pair((a, b): (Tensor, Tensor)) -> Vec<Tensor> {
    vec![a, b]
}

/// `d` wrapped into a rank (0 when out of range: only for choosing sizes).
pub fn wrapped_dim(rank: usize, d: i64) -> usize {
    let r = rank.max(1) as i64;
    if (-r..r).contains(&d) {
        d.rem_euclid(r) as usize
    } else {
        0
    }
}

/// The size of dim `d` of `shape` (1 for a 0-d tensor or a dim out of range).
pub fn wrapped(shape: &[usize], d: i64) -> usize {
    shape.get(wrapped_dim(shape.len(), d)).copied().unwrap_or(1)
}
