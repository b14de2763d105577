#!/usr/bin/env python3
"""Writes tests/golden/cases.json: the PyTorch golden cases coil's test suite compares against.

Standard library only. Run from anywhere:  python3 tests/golden/make_cases.py
Then produce golden.safetensors with PyTorch (see README.md next to this file):
    python3 torch_golden.py tests/golden/cases.json --out tests/golden --name golden

Format (documented in full at the top of torch_golden.py): each case is
    {"name": ..., "expr": <Python expression over the inputs; torch, F, math in scope>,
     "inputs": {<name>: {"shape": [...], "dtype": ..., "dist": ...} or {"values": [...], ...}},
     "seed": <int>}
The safetensors file then holds "<name>.in.<input>", "<name>.out.<k>" (tuple outputs flattened in
order: torch.max(a, dim) gives out.0 = values, out.1 = indices; split/chunk give one per piece) and,
when any input is floating, "<name>.ref64.<k>" (the same expression with floating inputs upcast to
float64). A case that PyTorch rejects has "<name>.error" metadata and no tensors.

Conventions
-----------
* Names are `<op>_<variant>` in [a-z0-9_]; the op comes first so `grep '^softmax_'` finds its cases.
  Dtype tags in names: f32 f16 bf16 f64 i64 i32 i8 u8 bool. Cases PyTorch rejects start with `err_`;
  coil must raise for those too.
* Inputs are single lower-case letters a, b, c, ... (q, k, v for attention, w for weights, m for
  masks) plus `idx` for index tensors (int64) and `t` for class targets (int64).
* Unless a case says otherwise the dtype is float32 and the dist randn. "positive" (uniform [0.1, 2))
  is used for log/sqrt/rsqrt/reciprocal/pow domains; "values" gives exact data (special values are
  the strings "nan", "inf", "-inf").
* Non-contiguous inputs are made inside the expression (a.t(), a.permute(...), a[:, ::2]): the
  stored inputs are always contiguous, the expression says which view coil must build.
* Each case's seed is crc32(name) & 0x7fffffff, written into the JSON, so adding or reordering cases
  never changes another case's data.
* One PyTorch call chain per expression where possible, so the Rust side can map each name to one
  coil expression. Shapes are small (mostly <= 64 elements) to keep golden.safetensors < 1.5 MiB.
* ref64 caveat: for dtype-dependent ops (casts, nan_to_num defaults, rms_norm eps=None, promotion
  cases) the float64 reference computes something different on purpose; compare those against out.*.
"""
import json
import math
import os
import re
import zlib

CASES = []


def case(name, expr, **inputs):
    CASES.append({"name": name, "expr": expr, "inputs": inputs,
                  "seed": zlib.crc32(name.encode()) & 0x7FFFFFFF})


DT = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64", "i64": "int64",
      "i32": "int32", "i8": "int8", "u8": "uint8", "bool": "bool"}


def r(*shape, dt="f32", dist="randn"):
    """Random input of the given shape."""
    return {"shape": list(shape), "dtype": DT[dt], "dist": dist}


def pos(*shape, dt="f32"):
    return r(*shape, dt=dt, dist="positive")


def uni(*shape, dt="f32"):
    return r(*shape, dt=dt, dist="rand")


def ints(lo, hi, *shape, dt="i64"):
    """Integers in [lo, hi)."""
    return r(*shape, dt=dt, dist=f"int:{lo}:{hi}")


def bools(*shape):
    return r(*shape, dt="bool", dist="bool")


def _shape_of(v):
    return [len(v)] + _shape_of(v[0]) if isinstance(v, list) else []


def _enc(v):
    if isinstance(v, list):
        return [_enc(x) for x in v]
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def vals(values, dt="f32", shape=None):
    """Exact data; the shape is that of the nested list unless given."""
    return {"shape": shape if shape is not None else _shape_of(values), "dtype": DT[dt],
            "values": _enc(values)}


NAN, INF = float("nan"), float("inf")

# --------------------------------------------------------------------------------------- creation
# Deterministic creation ops take no inputs (or a dummy `a` for the *_like ops).
case("zeros_f32", "torch.zeros(2, 3)")
case("zeros_i32", "torch.zeros(2, 3, dtype=torch.int32)")
case("zeros_size0", "torch.zeros(0, 3)")
case("ones_bf16", "torch.ones(4, dtype=torch.bfloat16)")
case("ones_3d", "torch.ones(2, 1, 3)")
case("full_f32", "torch.full((2, 3), 1.5)")
case("full_int_infers_i64", "torch.full((2, 3), 7)")
case("full_bool", "torch.full((3,), True)")
case("full_f16", "torch.full((2, 2), -0.25, dtype=torch.float16)")
case("arange_int", "torch.arange(5)")
case("arange_int_start_step", "torch.arange(-3, 7, 2)")
case("arange_int_neg_step", "torch.arange(10, 0, -3)")
case("arange_float_step", "torch.arange(0.5, 2.0, 0.25)")
case("arange_f32_dtype", "torch.arange(6, dtype=torch.float32)")
case("arange_empty", "torch.arange(3, 3)")
case("linspace_0_1_5", "torch.linspace(0, 1, 5)")
case("linspace_neg", "torch.linspace(-2, 3, 7)")
case("linspace_one_step", "torch.linspace(2, 3, 1)")
case("linspace_f64", "torch.linspace(0, 1, 4, dtype=torch.float64)")
case("eye_3", "torch.eye(3)")
case("eye_rect", "torch.eye(2, 4)")
case("eye_i64", "torch.eye(3, dtype=torch.int64)")
case("zeros_like_f32", "torch.zeros_like(a)", a=r(2, 3))
case("ones_like_i32", "torch.ones_like(a)", a=ints(-5, 5, 2, 3, dt="i32"))
case("ones_like_dtype_f16", "torch.ones_like(a, dtype=torch.float16)", a=r(3, 2))
case("full_like_f32", "torch.full_like(a, 2.5)", a=r(2, 3))
case("full_like_i64", "torch.full_like(a, 3)", a=ints(0, 5, 4))
case("full_like_noncontig", "torch.full_like(a.t(), -1.0)", a=r(2, 3))

# -------------------------------------------------------------------------------- pointwise unary
UNARY = [  # (name, expr, input dist)
    ("neg", "torch.neg(a)", "randn"), ("abs", "torch.abs(a)", "randn"),
    ("sign", "torch.sign(a)", "randn"), ("exp", "torch.exp(a)", "randn"),
    ("exp2", "torch.exp2(a)", "randn"), ("expm1", "torch.expm1(a)", "randn"),
    ("log", "torch.log(a)", "positive"), ("log2", "torch.log2(a)", "positive"),
    ("log1p", "torch.log1p(a)", "positive"), ("sqrt", "torch.sqrt(a)", "positive"),
    ("rsqrt", "torch.rsqrt(a)", "positive"), ("sin", "torch.sin(a)", "randn"),
    ("cos", "torch.cos(a)", "randn"), ("tan", "torch.tan(a)", "rand"),
    ("tanh", "torch.tanh(a)", "randn"), ("sigmoid", "torch.sigmoid(a)", "randn"),
    ("relu", "torch.relu(a)", "randn"), ("gelu", "F.gelu(a)", "randn"),
    ("gelu_tanh", "F.gelu(a, approximate='tanh')", "randn"), ("silu", "F.silu(a)", "randn"),
    ("softplus", "F.softplus(a)", "randn"),
    ("softplus_beta2_thr1", "F.softplus(a, beta=2.0, threshold=1.0)", "randn"),
    ("erf", "torch.erf(a)", "randn"), ("floor", "torch.floor(a)", "randn"),
    ("ceil", "torch.ceil(a)", "randn"), ("round", "torch.round(a)", "randn"),
    ("trunc", "torch.trunc(a)", "randn"), ("reciprocal", "torch.reciprocal(a)", "positive"),
]
for op, expr, dist in UNARY:
    case(f"{op}_f32", expr, a=r(4, 8, dist=dist))
# other dtypes
for op, dt in [("exp", "f16"), ("exp", "bf16"), ("exp", "f64"), ("sigmoid", "f16"), ("silu", "f16"),
               ("tanh", "bf16"), ("gelu", "bf16"), ("relu", "bf16"), ("erf", "f64"), ("sin", "f16"),
               ("floor", "f16"), ("neg", "bf16")]:
    expr, dist = next((e, d) for o, e, d in UNARY if o == op)
    case(f"{op}_{dt}", expr, a=r(4, 8, dt=dt, dist=dist))
for op, dt in [("log", "f64"), ("sqrt", "bf16"), ("rsqrt", "f16"), ("reciprocal", "bf16")]:
    expr = next(e for o, e, d in UNARY if o == op)
    case(f"{op}_{dt}", expr, a=pos(4, 8, dt=dt))
case("neg_i32", "torch.neg(a)", a=ints(-10, 10, 3, 4, dt="i32"))
case("abs_i32", "torch.abs(a)", a=ints(-10, 10, 3, 4, dt="i32"))
case("abs_i8", "torch.abs(a)", a=ints(-100, 100, 3, 4, dt="i8"))
case("sign_i64", "torch.sign(a)", a=ints(-3, 4, 3, 4))
case("relu_i32", "torch.relu(a)", a=ints(-10, 10, 3, 4, dt="i32"))
case("sign_zeros", "torch.sign(a)", a=vals([0.0, -0.0, 1.5, -2.5, INF, -INF]))
case("round_half_even", "torch.round(a)", a=vals([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49, -0.51]))
case("round_decimals2", "torch.round(a, decimals=2)", a=r(3, 4))
case("trunc_floor_ceil_neg", "torch.stack([torch.trunc(a), torch.floor(a), torch.ceil(a)])",
     a=vals([-2.7, -1.5, -0.2, 0.0, 0.2, 1.5, 2.7, -3.0]))
# special values
case("exp_special", "torch.exp(a)", a=vals([0.0, 1.0, -1.0, INF, -INF, NAN, 100.0, -100.0]))
case("log_special", "torch.log(a)", a=vals([0.0, -1.0, INF, NAN, 1.0, 1e-30]))
case("sqrt_special", "torch.sqrt(a)", a=vals([-1.0, 0.0, -0.0, INF, NAN, 4.0]))
case("sigmoid_extreme", "torch.sigmoid(a)", a=vals([-100.0, -20.0, 0.0, 20.0, 100.0, INF, -INF, NAN]))
case("tanh_extreme", "torch.tanh(a)", a=vals([-100.0, -10.0, 0.0, 10.0, 100.0, INF, -INF, NAN]))
case("relu_nan", "torch.relu(a)", a=vals([NAN, -1.0, 0.0, 1.0, -INF, INF]))
case("reciprocal_zero", "torch.reciprocal(a)", a=vals([0.0, -0.0, INF, 2.0, -4.0, NAN]))
case("expm1_small", "torch.expm1(a)", a=vals([1e-8, -1e-8, 1e-4, 0.0, -1e-30, 1.0]))
case("log1p_small", "torch.log1p(a)", a=vals([1e-8, -1e-8, 1e-4, 0.0, -1.0, -2.0]))
case("gelu_extreme", "F.gelu(a)", a=vals([-10.0, -5.0, 0.0, 5.0, 10.0, INF, -INF, NAN]))
case("softplus_large", "F.softplus(a)", a=vals([-100.0, -30.0, 0.0, 19.0, 21.0, 100.0]))
# layouts and odd shapes
case("exp_transposed", "torch.exp(a.t())", a=r(4, 3))
case("sin_strided", "torch.sin(a[:, ::2])", a=r(3, 8))
case("abs_permuted", "torch.abs(a.permute(2, 0, 1))", a=r(2, 3, 4))
case("exp_size0", "torch.exp(a)", a=r(0, 4))
case("exp_0d", "torch.exp(a)", a=r())
case("sigmoid_expanded", "torch.sigmoid(a.expand(3, 4))", a=r(3, 1))

# ------------------------------------------------------------------------------- pointwise binary
case("add_f32", "a + b", a=r(3, 4), b=r(3, 4))
case("add_broadcast_row", "a + b", a=r(3, 4), b=r(4))
case("add_broadcast_col", "a + b", a=r(3, 4), b=r(3, 1))
case("add_broadcast_outer", "a + b", a=r(3, 1), b=r(1, 4))
case("add_broadcast_3d", "a + b", a=r(2, 1, 4), b=r(3, 1))
case("add_alpha", "torch.add(a, b, alpha=2)", a=r(3, 4), b=r(3, 4))
for dt in ["f16", "bf16", "f64"]:
    case(f"add_{dt}", "a + b", a=r(3, 4, dt=dt), b=r(3, 4, dt=dt))
case("add_i32", "a + b", a=ints(-50, 50, 3, 4, dt="i32"), b=ints(-50, 50, 3, 4, dt="i32"))
case("add_i64_broadcast", "a + b", a=ints(-50, 50, 3, 4), b=ints(-50, 50, 4))
case("add_transposed", "a.t() + b", a=r(4, 3), b=r(3, 4))
case("add_strided", "a[:, ::2] + b", a=r(3, 8), b=r(3, 4))
case("add_size0", "a + b", a=r(0, 4), b=r(4))
case("add_0d", "a + b", a=r(), b=r(3))
case("sub_f32", "a - b", a=r(3, 4), b=r(3, 4))
case("sub_i64", "a - b", a=ints(-50, 50, 3, 4), b=ints(-50, 50, 3, 4))
case("sub_alpha", "torch.sub(a, b, alpha=0.5)", a=r(3, 4), b=r(4))
case("sub_bf16_broadcast", "a - b", a=r(3, 4, dt="bf16"), b=r(3, 1, dt="bf16"))
case("mul_f32", "a * b", a=r(3, 4), b=r(3, 4))
case("mul_bf16", "a * b", a=r(3, 4, dt="bf16"), b=r(3, 4, dt="bf16"))
case("mul_i32", "a * b", a=ints(-20, 20, 3, 4, dt="i32"), b=ints(-20, 20, 3, 4, dt="i32"))
case("mul_broadcast", "a * b", a=r(2, 3, 1), b=r(4))
case("div_f32", "a / b", a=r(3, 4), b=pos(3, 4))
case("div_f16", "a / b", a=r(3, 4, dt="f16"), b=pos(3, 4, dt="f16"))
case("div_by_zero_f32", "a / b", a=vals([1.0, -1.0, 0.0, 2.0]), b=vals([0.0, 0.0, 0.0, -0.0]))
FA = [-7.5, -3.0, -1.2, 0.0, 1.2, 3.0, 7.5, 5.0]
FB = [2.0, 2.0, -2.0, 3.0, -0.5, -4.0, 4.0, -3.0]
IA = [-7, -7, 7, 7, -6, 6, 0, 5]
IB = [2, -2, 2, -2, 3, -3, 4, -1]
case("div_floor_f32", "torch.div(a, b, rounding_mode='floor')", a=vals(FA), b=vals(FB))
case("div_trunc_f32", "torch.div(a, b, rounding_mode='trunc')", a=vals(FA), b=vals(FB))
case("div_floor_f32_random", "torch.div(a, b, rounding_mode='floor')", a=r(3, 4), b=r(3, 4))
case("div_floor_i64", "torch.div(a, b, rounding_mode='floor')", a=vals(IA, "i64"), b=vals(IB, "i64"))
case("div_trunc_i64", "torch.div(a, b, rounding_mode='trunc')", a=vals(IA, "i64"), b=vals(IB, "i64"))
case("div_floor_i32_scalar", "torch.div(a, 3, rounding_mode='floor')", a=ints(-10, 10, 8, dt="i32"))
case("floordiv_op_i64", "a // b", a=vals(IA, "i64"), b=vals(IB, "i64"))
case("div_true_i64", "a / b", a=vals(IA, "i64"), b=vals(IB, "i64"))
case("remainder_f32", "torch.remainder(a, b)", a=vals(FA), b=vals(FB))
case("remainder_i64", "torch.remainder(a, b)", a=vals(IA, "i64"), b=vals(IB, "i64"))
case("remainder_op_scalar_i64", "a % 3", a=ints(-10, 10, 8))
case("remainder_neg_scalar_f32", "torch.remainder(a, -1.5)", a=r(8))
case("fmod_f32", "torch.fmod(a, b)", a=vals(FA), b=vals(FB))
case("pow_tensor_tensor", "torch.pow(a, b)", a=pos(3, 4), b=r(3, 4))
case("pow_tensor_scalar2", "a ** 2", a=r(3, 4))
case("pow_tensor_scalar_half", "a ** 0.5", a=pos(3, 4))
case("pow_tensor_scalar_neg", "torch.pow(a, -1.5)", a=pos(3, 4))
case("pow_scalar_tensor", "2.0 ** a", a=r(3, 4))
case("pow_scalar_tensor_fn", "torch.pow(3.0, a)", a=r(3, 4))
case("pow_neg_base_frac", "torch.pow(a, 0.5)", a=r(3, 4))
case("pow_neg_base_int_exp", "torch.pow(a, 3.0)", a=r(3, 4))
case("pow_i64_scalar", "a ** 3", a=ints(-4, 5, 3, 4))
case("pow_i64_tensor", "torch.pow(a, b)", a=ints(-3, 4, 3, 4), b=ints(0, 4, 3, 4))
case("pow_bf16", "torch.pow(a, b)", a=pos(3, 4, dt="bf16"), b=r(3, 4, dt="bf16"))
case("pow_broadcast", "torch.pow(a, b)", a=pos(3, 1), b=r(4))
case("clamp_min", "torch.clamp(a, min=-0.5)", a=r(3, 4))
case("clamp_max", "torch.clamp(a, max=0.5)", a=r(3, 4))
case("clamp_both", "torch.clamp(a, -0.5, 0.5)", a=r(3, 4))
case("clamp_i64", "torch.clamp(a, -2, 3)", a=ints(-6, 6, 3, 4))
case("clamp_min_i32", "a.clamp(min=0)", a=ints(-6, 6, 3, 4, dt="i32"))
case("clamp_tensor_bounds", "torch.clamp(a, min=b, max=c)", a=r(3, 4), b=r(3, 4), c=r(4))
case("clamp_nan", "torch.clamp(a, -1.0, 1.0)", a=vals([NAN, -2.0, 0.5, 2.0, INF, -INF]))
case("clamp_bf16", "torch.clamp(a, -0.5, 0.5)", a=r(3, 4, dt="bf16"))
case("maximum_f32", "torch.maximum(a, b)", a=r(3, 4), b=r(3, 4))
case("minimum_f32", "torch.minimum(a, b)", a=r(3, 4), b=r(3, 4))
case("maximum_broadcast", "torch.maximum(a, b)", a=r(3, 4), b=r(3, 1))
case("maximum_nan", "torch.maximum(a, b)", a=vals([NAN, 1.0, -INF, 2.0]), b=vals([0.0, NAN, 3.0, -1.0]))
case("minimum_nan", "torch.minimum(a, b)", a=vals([NAN, 1.0, -INF, 2.0]), b=vals([0.0, NAN, 3.0, -1.0]))
case("minimum_i32", "torch.minimum(a, b)", a=ints(-9, 9, 3, 4, dt="i32"), b=ints(-9, 9, 3, 4, dt="i32"))
case("maximum_bf16", "torch.maximum(a, b)", a=r(3, 4, dt="bf16"), b=r(3, 4, dt="bf16"))
case("max_binary", "torch.max(a, b)", a=r(3, 4), b=r(4))
case("where_f32", "torch.where(c, a, b)", c=bools(3, 4), a=r(3, 4), b=r(3, 4))
case("where_broadcast", "torch.where(c, a, b)", c=bools(3, 1), a=r(4), b=r(3, 4))
case("where_scalar_other", "torch.where(a > 0, a, 0.0)", a=r(3, 4))
case("where_scalar_both", "torch.where(c, 1.0, -1.0)", c=bools(3, 4))
case("where_i64", "torch.where(c, a, b)", c=bools(3, 4), a=ints(0, 10, 3, 4), b=ints(-10, 0, 3, 4))
case("where_bf16", "torch.where(c, a, b)", c=bools(3, 4), a=r(3, 4, dt="bf16"), b=r(3, 4, dt="bf16"))
case("eq_i64", "torch.eq(a, b)", a=ints(0, 3, 3, 4), b=ints(0, 3, 3, 4))
case("ne_i64", "a != b", a=ints(0, 3, 3, 4), b=ints(0, 3, 3, 4))
case("eq_f32_values", "a == b", a=vals([1.0, 2.0, -0.0, NAN, INF]), b=vals([1.0, 2.5, 0.0, NAN, INF]))
case("ne_nan", "a != b", a=vals([1.0, NAN, NAN]), b=vals([1.0, 1.0, NAN]))
case("lt_f32_broadcast", "a < b", a=r(3, 4), b=r(4))
case("le_scalar", "a <= 0.5", a=r(3, 4))
case("gt_scalar", "torch.gt(a, 0)", a=r(3, 4))
case("ge_i32_broadcast", "a >= b", a=ints(-3, 3, 3, 4, dt="i32"), b=ints(-3, 3, 3, 1, dt="i32"))
case("lt_bf16", "a < b", a=r(3, 4, dt="bf16"), b=r(3, 4, dt="bf16"))
case("ne_scalar_i64", "a != 1", a=ints(0, 3, 3, 4))
case("gt_int_vs_float", "a > b", a=ints(-3, 3, 3, 4), b=r(3, 4))
case("logical_and_bool", "torch.logical_and(a, b)", a=bools(3, 4), b=bools(3, 4))
case("logical_or_bool", "torch.logical_or(a, b)", a=bools(3, 4), b=bools(3, 4))
case("logical_not_bool", "torch.logical_not(a)", a=bools(3, 4))
case("logical_and_f32", "torch.logical_and(a, b)", a=vals([0.0, 1.5, -0.0, NAN, 2.0, 0.0]),
     b=vals([1.0, 0.0, 3.0, 1.0, -1.0, 0.0]))
case("logical_or_broadcast", "torch.logical_or(a, b)", a=bools(3, 1), b=bools(4))
case("logical_not_i32", "torch.logical_not(a)", a=ints(-2, 3, 3, 4, dt="i32"))
case("isnan_f32", "torch.isnan(a)", a=vals([NAN, 1.0, INF, -INF, 0.0, -NAN]))
case("isinf_f32", "torch.isinf(a)", a=vals([NAN, 1.0, INF, -INF, 0.0, 3e38]))
case("isnan_bf16", "torch.isnan(a)", a=vals([NAN, 1.0, INF, -INF], "bf16"))
case("nan_to_num_default", "torch.nan_to_num(a)", a=vals([NAN, INF, -INF, 1.5, -2.0, 0.0]))
case("nan_to_num_values", "torch.nan_to_num(a, nan=0.5, posinf=100.0, neginf=-100.0)",
     a=vals([NAN, INF, -INF, 1.5, -2.0, 0.0]))
case("nan_to_num_f16_default", "torch.nan_to_num(a)", a=vals([NAN, INF, -INF, 1.5], "f16"))
# casts
case("cast_f32_to_i32", "a.to(torch.int32)", a=vals([-2.7, -1.5, -0.5, -0.0, 0.4, 1.5, 2.9, 100.99]))
case("cast_f32_to_i64_scaled", "(a * 10).to(torch.int64)", a=r(3, 4))
case("cast_f32_to_bf16", "a.to(torch.bfloat16)", a=r(3, 4))
case("cast_f32_to_f16", "a.to(torch.float16)", a=r(3, 4))
case("cast_f32_to_f16_overflow", "a.to(torch.float16)", a=vals([70000.0, -70000.0, 65504.0, 1e-8]))
case("cast_bf16_to_f32", "a.to(torch.float32)", a=r(3, 4, dt="bf16"))
case("cast_f64_to_f32", "a.to(torch.float32)", a=r(3, 4, dt="f64"))
case("cast_bool_to_f32", "a.to(torch.float32)", a=bools(3, 4))
case("cast_f32_to_bool", "a.to(torch.bool)", a=vals([0.0, -0.0, 0.1, -2.0, NAN, INF]))
case("cast_i64_to_f32", "a.to(torch.float32)", a=ints(-100, 100, 3, 4))
case("cast_i32_to_bool", "a.to(torch.bool)", a=ints(-2, 3, 3, 4, dt="i32"))
case("cast_i64_to_i32", "a.to(torch.int32)", a=ints(-1000, 1000, 3, 4))
case("cast_f32_to_u8", "a.to(torch.uint8)", a=vals([0.0, 0.9, 1.5, 200.7, 255.0, 3.2]))
case("cast_u8_to_f32", "a.to(torch.float32)", a=ints(0, 256, 3, 4, dt="u8"))
case("cast_method_long", "a.long()", a=vals([-2.7, -0.5, 0.5, 2.7]))
case("cast_method_half_transposed", "a.t().half()", a=r(3, 4))
# type promotion
case("promo_i32_plus_float_scalar", "a + 2.5", a=ints(-5, 5, 3, 4, dt="i32"))
case("promo_i64_times_float_scalar", "a * 0.5", a=ints(-5, 5, 3, 4))
case("promo_u8_plus_i8", "a + b", a=ints(0, 200, 3, 4, dt="u8"), b=ints(-100, 100, 3, 4, dt="i8"))
case("promo_f16_plus_bf16", "a + b", a=r(3, 4, dt="f16"), b=r(3, 4, dt="bf16"))
case("promo_i64_div_i64", "a / b", a=ints(-10, 10, 3, 4), b=ints(1, 5, 3, 4))
case("promo_bool_plus_bool", "a + b", a=bools(3, 4), b=bools(3, 4))
case("promo_i32_plus_i64", "a + b", a=ints(-5, 5, 3, 4, dt="i32"), b=ints(-5, 5, 4))
case("promo_f32_plus_f64_0d", "a + b", a=r(3, 4), b=r(dt="f64"))
case("promo_i32_times_f16", "a * b", a=ints(-5, 5, 3, 4, dt="i32"), b=r(3, 4, dt="f16"))
case("promo_bool_times_f32", "a * b", a=bools(3, 4), b=r(3, 4))
case("promo_i32_plus_bool", "a + b", a=ints(-5, 5, 3, 4, dt="i32"), b=bools(3, 4))
case("promo_u8_plus_int_scalar", "a + 5", a=ints(0, 250, 3, 4, dt="u8"))
case("promo_f16_plus_float_scalar", "a + 2.5", a=r(3, 4, dt="f16"))
case("promo_bool_plus_int_scalar", "a + 1", a=bools(3, 4))
case("promo_f32_plus_i64", "a + b", a=r(3, 4), b=ints(-5, 5, 3, 4))
# scalar on either side
case("rsub_scalar", "2.0 - a", a=r(3, 4))
case("sub_scalar", "a - 1.5", a=r(3, 4))
case("mul_scalar_right", "a * 3", a=r(3, 4))
case("mul_scalar_left", "0.5 * a", a=r(3, 4))
case("rdiv_scalar", "1.0 / a", a=pos(3, 4))
case("div_scalar", "a / 4", a=r(3, 4))
case("radd_scalar_i32", "3 + a", a=ints(-5, 5, 3, 4, dt="i32"))
case("rsub_scalar_i64", "5 - a", a=ints(-5, 5, 3, 4))
case("rfloordiv_scalar_i64", "7 // a", a=vals([1, 2, 3, -2, -3, 4], "i64"))
case("affine_scalar_chain", "a * 2.0 + 1.0", a=r(3, 4))
case("rsub_scalar_bf16", "1.0 - a", a=r(3, 4, dt="bf16"))

# ------------------------------------------------------------------------------------- reductions
A3 = r(3, 4, 5)
case("sum_all", "torch.sum(a)", a=A3)
case("sum_dim1", "a.sum(1)", a=A3)
case("sum_dim_neg1_keepdim", "a.sum(-1, keepdim=True)", a=A3)
case("sum_dims02", "a.sum((0, 2))", a=A3)
case("sum_dims_neg_keepdim", "a.sum((-1, -3), keepdim=True)", a=A3)
case("sum_i32_all_to_i64", "a.sum()", a=ints(-10, 10, 3, 4, dt="i32"))
case("sum_i32_dim0_to_i64", "a.sum(0)", a=ints(-10, 10, 3, 4, dt="i32"))
case("sum_bool_all", "a.sum()", a=bools(3, 4))
case("sum_bool_dim1", "a.sum(1)", a=bools(3, 4))
case("sum_bf16_dim", "a.sum(-1)", a=r(4, 16, dt="bf16"))
case("sum_f16_all", "a.sum()", a=r(4, 16, dt="f16"))
case("sum_f64_dim", "a.sum(0)", a=r(3, 4, dt="f64"))
case("sum_size0_dim", "a.sum(0)", a=r(0, 3))
case("sum_size0_all", "a.sum()", a=r(0, 3))
case("sum_transposed", "a.t().sum(0)", a=r(3, 4))
case("sum_permuted", "a.permute(2, 0, 1).sum(-1)", a=r(2, 3, 4))
case("sum_dtype_f64", "a.sum(-1, dtype=torch.float64)", a=r(3, 4))
case("sum_long_row", "a.sum(-1)", a=r(2, 150))
case("mean_all", "torch.mean(a)", a=A3)
case("mean_dim1", "a.mean(1)", a=A3)
case("mean_dims_keepdim", "a.mean((1, 2), keepdim=True)", a=A3)
case("mean_neg_dim", "torch.mean(a, dim=-2)", a=A3)
case("mean_bf16", "a.mean(-1)", a=r(4, 16, dt="bf16"))
case("mean_f16", "a.mean()", a=r(4, 16, dt="f16"))
case("mean_size0", "a.mean()", a=r(0, 3))
case("prod_all", "torch.prod(a)", a=pos(3, 4))
case("prod_dim", "a.prod(1)", a=r(3, 4))
case("prod_keepdim_neg", "torch.prod(a, -1, keepdim=True)", a=r(2, 3, 4))
case("prod_i32_to_i64", "a.prod()", a=ints(-3, 4, 8, dt="i32"))
case("prod_size0", "a.prod(0)", a=r(0, 3))
case("max_all", "torch.max(a)", a=A3)
case("min_all", "torch.min(a)", a=A3)
case("max_dim1", "torch.max(a, 1)", a=A3)
case("min_dim_keepdim", "torch.min(a, dim=-1, keepdim=True)", a=A3)
case("max_dim_i64", "torch.max(a, 1)", a=vals([[3, -1, 7, 2], [0, 5, -4, 1], [-9, -2, -8, -3]], "i64"))
case("max_dim_bf16", "torch.max(a, -1)", a=r(3, 8, dt="bf16"))
case("max_nan", "torch.max(a)", a=vals([1.0, NAN, 3.0, -INF]))
case("max_dim_nan", "torch.max(a, 1)", a=vals([[1.0, NAN, 3.0], [2.0, 0.0, -1.0]]))
case("amax_dims", "torch.amax(a, (0, 2))", a=A3)
case("amin_keepdim", "torch.amin(a, -1, keepdim=True)", a=A3)
case("amax_all", "a.amax()", a=A3)
case("amax_i32", "torch.amax(a, 1)", a=ints(-50, 50, 3, 4, dt="i32"))
case("amin_bf16", "torch.amin(a, 0)", a=r(3, 8, dt="bf16"))
case("argmax_all", "torch.argmax(a)", a=A3)
case("argmax_dim1", "torch.argmax(a, dim=1)", a=A3)
case("argmax_keepdim", "torch.argmax(a, dim=-1, keepdim=True)", a=A3)
case("argmin_all", "torch.argmin(a)", a=A3)
case("argmin_dim0", "torch.argmin(a, 0)", a=A3)
case("argmax_transposed", "a.t().argmax(-1)", a=r(4, 3))
case("argmax_ties_first", "torch.argmax(a, dim=1)", a=vals([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]]))
case("argmax_i64", "torch.argmax(a, dim=0)", a=vals([[3, -1, 7], [0, 5, -4], [9, -2, 8]], "i64"))
case("var_default", "torch.var(a)", a=A3)
case("var_dim_corr0", "torch.var(a, dim=1, correction=0)", a=A3)
case("var_dim_corr1_keepdim", "torch.var(a, dim=-1, correction=1, keepdim=True)", a=A3)
case("var_unbiased_false", "torch.var(a, dim=2, unbiased=False)", a=A3)
case("var_dims", "torch.var(a, dim=(0, 2))", a=A3)
case("var_size1_dim_nan", "torch.var(a, dim=1)", a=r(3, 1))
case("std_default", "torch.std(a)", a=A3)
case("std_dim_corr0", "torch.std(a, dim=0, correction=0)", a=A3)
case("std_dims_keepdim", "torch.std(a, dim=(0, 1), correction=1, keepdim=True)", a=A3)
case("std_f64", "torch.std(a, dim=-1)", a=r(3, 8, dt="f64"))
case("logsumexp_dim1", "torch.logsumexp(a, 1)", a=A3)
case("logsumexp_dims", "torch.logsumexp(a, (0, 2))", a=A3)
case("logsumexp_keepdim_neg", "torch.logsumexp(a, -1, keepdim=True)", a=A3)
case("logsumexp_large", "torch.logsumexp(a, -1)", a=vals([[1000.0, 1001.0, 999.0], [-1000.0, -1002.0, -999.5]]))
case("logsumexp_neginf", "torch.logsumexp(a, -1)", a=vals([[-INF, -INF, -INF], [-INF, 0.0, 1.0]]))
case("logsumexp_bf16", "torch.logsumexp(a, -1)", a=r(3, 8, dt="bf16"))
case("norm_l2_all", "torch.linalg.vector_norm(a)", a=A3)
case("norm_l2_dim", "torch.norm(a, dim=1)", a=A3)
case("norm_l1_dim", "torch.linalg.vector_norm(a, ord=1, dim=-1)", a=A3)
case("norm_inf_all", "torch.linalg.vector_norm(a, ord=math.inf)", a=A3)
case("norm_inf_dim_keepdim", "torch.linalg.vector_norm(a, ord=math.inf, dim=(0, 1), keepdim=True)", a=A3)
case("norm_p1_all", "torch.norm(a, p=1)", a=A3)
case("norm_l2_bf16", "torch.linalg.vector_norm(a, dim=-1)", a=r(3, 8, dt="bf16"))
case("all_bool", "torch.all(a)", a=bools(3, 4))
case("all_true", "torch.all(a)", a=vals([True, True, True]))
case("all_dim1", "a.all(dim=1)", a=bools(3, 4))
case("any_bool", "torch.any(a)", a=bools(3, 4))
case("any_dim0_keepdim", "torch.any(a, dim=0, keepdim=True)", a=bools(3, 4))
case("any_f32_dim", "torch.any(a, dim=1)", a=vals([[0.0, 0.0, 0.0], [0.0, -0.5, 0.0], [NAN, 0.0, 0.0]]))
case("all_i64", "torch.all(a)", a=ints(-2, 3, 3, 4))
case("all_empty", "torch.all(a)", a=r(0, dt="bool"))
case("any_empty", "torch.any(a)", a=r(0, dt="bool"))
case("cumsum_dim0", "torch.cumsum(a, 0)", a=r(3, 4))
case("cumsum_neg_dim", "a.cumsum(-1)", a=r(2, 3, 4))
case("cumsum_i32_to_i64", "torch.cumsum(a, 1)", a=ints(-10, 10, 3, 4, dt="i32"))
case("cumsum_bool", "a.cumsum(0)", a=bools(8))
case("cumsum_bf16", "torch.cumsum(a, -1)", a=r(2, 16, dt="bf16"))
case("cumsum_transposed", "a.t().cumsum(1)", a=r(3, 4))

# -------------------------------------------------------------------------------- views, indexing
case("reshape_2d_to_3d", "a.reshape(2, 3, 2)", a=r(3, 4))
case("reshape_infer", "a.reshape(-1, 6)", a=r(3, 4))
case("reshape_flat", "a.reshape(-1)", a=r(2, 3, 2))
case("reshape_transposed", "a.t().reshape(12)", a=r(3, 4))
case("reshape_size0", "a.reshape(3, 0, 2)", a=r(0, 6))
case("reshape_to_0d", "a.reshape(())", a=r(1))
case("reshape_i64", "a.reshape(4, 3)", a=ints(0, 100, 2, 6))
case("view_2x6", "a.view(2, 6)", a=r(3, 4))
case("view_add_dim", "a.view(3, 1, 4)", a=r(3, 4))
case("view_infer_neg", "a.view(-1, 2)", a=r(2, 3, 2))
case("flatten_all", "a.flatten()", a=r(2, 3, 4))
case("flatten_start1", "a.flatten(1)", a=r(2, 3, 4))
case("flatten_0_1", "torch.flatten(a, 0, 1)", a=r(2, 3, 4))
case("flatten_neg", "a.flatten(-2, -1)", a=r(2, 3, 4))
case("flatten_0d", "a.flatten()", a=r())
case("flatten_permuted", "a.permute(1, 0, 2).flatten(1)", a=r(2, 3, 4))
case("unflatten_dim1", "a.unflatten(1, (2, 3))", a=r(4, 6))
case("unflatten_infer_neg", "a.unflatten(-1, (2, -1))", a=r(4, 6))
case("permute_3d", "a.permute(2, 0, 1)", a=r(2, 3, 4))
case("permute_neg", "a.permute(-1, 0, -2)", a=r(2, 3, 4))
case("permute_4d", "torch.permute(a, (0, 2, 3, 1))", a=r(2, 3, 2, 4))
case("transpose_02", "a.transpose(0, 2)", a=r(2, 3, 4))
case("transpose_neg", "torch.transpose(a, -1, -2)", a=r(2, 3, 4))
case("t_2d", "a.t()", a=r(3, 4))
case("t_1d", "a.t()", a=r(5))
case("expand_col", "a.expand(3, 4)", a=r(3, 1))
case("expand_neg1", "a.expand(-1, 4)", a=r(3, 1))
case("expand_new_dim", "a.expand(2, 3, 4)", a=r(3, 1))
case("expand_as", "a.expand_as(b)", a=r(1, 4), b=r(3, 4))
case("broadcast_to_2d", "torch.broadcast_to(a, (3, 4))", a=r(4))
case("broadcast_to_3d", "a.broadcast_to((2, 3, 4))", a=r(3, 1))
case("squeeze_all", "a.squeeze()", a=r(1, 3, 1, 2))
case("squeeze_dim", "a.squeeze(2)", a=r(1, 3, 1, 2))
case("squeeze_neg", "a.squeeze(-4)", a=r(1, 3, 1, 2))
case("squeeze_noop", "a.squeeze(1)", a=r(1, 3, 1, 2))
case("squeeze_dims", "a.squeeze((0, 2))", a=r(1, 3, 1, 2))
case("unsqueeze_0", "a.unsqueeze(0)", a=r(3, 4))
case("unsqueeze_neg", "torch.unsqueeze(a, -1)", a=r(3, 4))
case("unsqueeze_mid", "a.unsqueeze(1)", a=r(3, 4))
case("narrow_dim1", "a.narrow(1, 1, 2)", a=r(3, 4))
case("narrow_neg", "torch.narrow(a, -1, 0, 3)", a=r(2, 3, 4))
case("narrow_len0", "a.narrow(0, 2, 0)", a=r(3, 4))
case("slice_step2", "a[1:5:2]", a=r(6, 4))
case("slice_col_step3", "a[:, ::3]", a=r(4, 7))
case("slice_neg_bounds", "a[-3:, 1:-1]", a=r(5, 4))
case("slice_2d_steps", "a[::2, 1::2]", a=r(5, 6))
case("slice_ellipsis", "a[..., ::2]", a=r(2, 3, 4))
case("slice_oob_empty", "a[5:10]", a=r(4, 3))
case("slice_clamped_end", "a[1:100]", a=r(4, 3))
case("slice_none", "a[:, None, 1:]", a=r(3, 4))
case("select_dim1", "a.select(1, 2)", a=r(3, 4))
case("select_index", "a[2]", a=r(3, 4))
case("select_neg_index", "a[-1]", a=r(3, 4))
case("select_col_neg", "a[:, -1]", a=r(3, 4))
case("select_neg_dim", "a.select(-1, 0)", a=r(2, 3, 4))
case("index_select_dim0", "torch.index_select(a, 0, idx)", a=r(4, 3), idx=ints(0, 4, 5))
case("index_select_dim1", "a.index_select(1, idx)", a=r(3, 5), idx=ints(0, 5, 3))
case("index_select_neg_dim", "torch.index_select(a, -1, idx)", a=r(2, 3, 4), idx=ints(0, 4, 2))
case("index_select_i64_data", "torch.index_select(a, 0, idx)", a=ints(0, 100, 4, 3), idx=ints(0, 4, 3))
case("index_tensor_rows", "a[idx]", a=r(4, 3), idx=ints(0, 4, 5))
case("index_tensor_2d_idx", "a[idx]", a=r(5, 3), idx=ints(0, 5, 2, 3))
case("index_tensor_cols", "a[:, idx]", a=r(3, 5), idx=ints(0, 5, 4))
case("gather_dim1", "torch.gather(a, 1, idx)", a=r(3, 5), idx=ints(0, 5, 3, 4))
case("gather_dim0", "torch.gather(a, 0, idx)", a=r(4, 3), idx=ints(0, 4, 2, 3))
case("gather_neg_dim", "a.gather(-1, idx)", a=r(2, 3, 4), idx=ints(0, 4, 2, 3, 2))
case("gather_smaller_index", "torch.gather(a, 1, idx)", a=r(3, 5), idx=ints(0, 5, 2, 2))
case("scatter_dim1", "torch.scatter(a, 1, idx, b)", a=r(3, 5),
     idx=vals([[0, 3], [4, 1], [2, 0]], "i64"), b=r(3, 2))
case("scatter_scalar_dim0", "a.scatter(0, idx, 2.0)", a=r(4, 3), idx=vals([[0, 1, 2], [3, 0, 1]], "i64"))
case("scatter_add_dim1", "torch.scatter_add(a, 1, idx, b)", a=r(3, 5), idx=ints(0, 5, 3, 6), b=r(3, 6))
case("scatter_add_dim0", "a.scatter_add(0, idx, b)", a=r(3, 4), idx=ints(0, 3, 5, 4), b=r(5, 4))
case("scatter_add_i64", "torch.scatter_add(a, 0, idx, b)", a=ints(0, 10, 4), idx=ints(0, 4, 6),
     b=ints(1, 5, 6))
case("cat_dim0", "torch.cat([a, b])", a=r(2, 3), b=r(4, 3))
case("cat_dim1_three", "torch.cat([a, b, c], dim=1)", a=r(2, 1), b=r(2, 3), c=r(2, 2))
case("cat_neg_dim", "torch.cat([a, b], -1)", a=r(2, 3, 2), b=r(2, 3, 1))
case("cat_with_empty", "torch.cat([a, b], 0)", a=r(2, 3), b=r(0, 3))
case("cat_promote_f32_f16", "torch.cat([a, b])", a=r(2, 3), b=r(1, 3, dt="f16"))
case("cat_transposed", "torch.cat([a.t(), b], 0)", a=r(3, 2), b=r(1, 3))
case("cat_i64", "torch.cat([a, b], 1)", a=ints(0, 9, 2, 2), b=ints(0, 9, 2, 3))
case("stack_dim0", "torch.stack([a, b])", a=r(2, 3), b=r(2, 3))
case("stack_neg", "torch.stack([a, b, c], dim=-1)", a=r(2, 3), b=r(2, 3), c=r(2, 3))
case("stack_mid", "torch.stack([a, b], 1)", a=r(2, 3), b=r(2, 3))
case("split_even", "torch.split(a, 2, dim=0)", a=r(4, 3))
case("split_uneven", "torch.split(a, 2, dim=1)", a=r(3, 5))
case("split_sizes", "torch.split(a, [1, 4], dim=-1)", a=r(3, 5))
case("chunk_3", "a.chunk(3, 0)", a=r(7, 2))
case("chunk_fewer", "torch.chunk(a, 4, 0)", a=r(6, 2))
case("chunk_neg_dim", "a.chunk(2, -1)", a=r(2, 3, 4))
case("repeat_2d", "a.repeat(2, 3)", a=r(2, 3))
case("repeat_add_dim", "a.repeat(2, 1, 1)", a=r(2, 3))
case("repeat_ones", "a.repeat(1, 1)", a=r(2, 3))
case("flip_dim0", "torch.flip(a, [0])", a=r(3, 4))
case("flip_multi", "torch.flip(a, (0, 2))", a=r(2, 3, 4))
case("flip_neg", "a.flip(-1)", a=r(2, 3, 4))
case("pad_last", "F.pad(a, (1, 2))", a=r(2, 3))
case("pad_2d_value", "F.pad(a, (1, 0, 2, 1), value=-1.5)", a=r(2, 3))
case("pad_3d", "F.pad(a, (1, 1, 0, 2, 1, 0), value=0.5)", a=r(2, 3, 4))
case("pad_negative_crop", "F.pad(a, (-1, 2))", a=r(2, 4))
case("pad_i64", "F.pad(a, (1, 1), value=7)", a=ints(0, 5, 2, 3))
case("pad_bf16", "F.pad(a, (0, 3), value=1.0)", a=r(2, 3, dt="bf16"))
case("tril_default", "torch.tril(a)", a=r(4, 4))
case("tril_pos", "torch.tril(a, 1)", a=r(4, 6))
case("tril_neg_tall", "a.tril(-1)", a=r(5, 3))
case("triu_default", "torch.triu(a)", a=r(4, 4))
case("triu_pos2", "a.triu(2)", a=r(4, 6))
case("triu_neg_tall", "torch.triu(a, diagonal=-1)", a=r(5, 3))
case("triu_batched", "torch.triu(a, 1)", a=r(2, 3, 4))
case("tril_i64", "torch.tril(a)", a=ints(1, 10, 3, 3))
case("contiguous_t", "a.t().contiguous()", a=r(3, 4))
case("contiguous_permute", "a.permute(1, 0, 2).contiguous()", a=r(2, 3, 4))
case("contiguous_slice", "a[:, 1::2].contiguous()", a=r(3, 6))

# ------------------------------------------------------------------------------- linear algebra
case("matmul_2d", "a @ b", a=r(3, 4), b=r(4, 5))
case("matmul_1d_2d", "torch.matmul(a, b)", a=r(4), b=r(4, 5))
case("matmul_2d_1d", "torch.matmul(a, b)", a=r(3, 4), b=r(4))
case("matmul_1d_1d", "torch.matmul(a, b)", a=r(6), b=r(6))
case("matmul_batched_bcast", "a @ b", a=r(2, 1, 3, 4), b=r(5, 4, 2))
case("matmul_3d_2d", "a @ b", a=r(2, 3, 4), b=r(4, 5))
case("matmul_1d_3d", "torch.matmul(a, b)", a=r(4), b=r(2, 4, 3))
case("matmul_transposed", "a.t() @ b", a=r(4, 3), b=r(4, 5))
case("matmul_inner0", "a @ b", a=r(3, 0), b=r(0, 4))
case("matmul_bf16", "a @ b", a=r(4, 8, dt="bf16"), b=r(8, 4, dt="bf16"))
case("matmul_f64", "a @ b", a=r(3, 4, dt="f64"), b=r(4, 5, dt="f64"))
case("matmul_larger", "a @ b", a=r(8, 32), b=r(32, 8))
case("mm_f32", "torch.mm(a, b)", a=r(3, 4), b=r(4, 5))
case("mm_transposed_b", "torch.mm(a, b.t())", a=r(3, 4), b=r(5, 4))
case("bmm_f32", "torch.bmm(a, b)", a=r(2, 3, 4), b=r(2, 4, 5))
case("bmm_transposed_b", "torch.bmm(a, b.transpose(1, 2))", a=r(2, 3, 4), b=r(2, 5, 4))
case("linear_bias", "F.linear(a, w, b)", a=r(3, 4), w=r(5, 4), b=r(5))
case("linear_nobias", "F.linear(a, w)", a=r(3, 4), w=r(5, 4))
case("linear_3d_input", "F.linear(a, w, b)", a=r(2, 3, 4), w=r(5, 4), b=r(5))
case("linear_1d_input", "F.linear(a, w, b)", a=r(4), w=r(5, 4), b=r(5))

# ---------------------------------------------------------------------------------------- nn
case("softmax_f32_dim1", "torch.softmax(a, dim=1)", a=r(3, 5))
case("softmax_f32_dim0", "torch.softmax(a, dim=0)", a=r(3, 5))
case("softmax_f32_neg1_3d", "torch.softmax(a, -1)", a=r(2, 3, 4))
case("softmax_3d_dim1", "F.softmax(a, dim=1)", a=r(2, 3, 4))
case("softmax_bf16", "torch.softmax(a, -1)", a=r(3, 8, dt="bf16"))
case("softmax_f16", "torch.softmax(a, -1)", a=r(3, 8, dt="f16"))
case("softmax_f64", "torch.softmax(a, -1)", a=r(3, 8, dt="f64"))
case("softmax_bf16_dtype_f32", "torch.softmax(a, -1, dtype=torch.float32)", a=r(3, 8, dt="bf16"))
case("softmax_neginf", "torch.softmax(a, -1)", a=vals([[0.0, -INF, 1.0, -INF], [-INF, 2.0, 2.0, 0.5]]))
case("softmax_large", "torch.softmax(a, -1)", a=vals([[1000.0, 1001.0, 999.0], [-1000.0, -1002.0, -999.5]]))
case("softmax_transposed", "F.softmax(a.t(), dim=-1)", a=r(5, 3))
case("softmax_size1_dim", "torch.softmax(a, -1)", a=r(3, 1))
case("softmax_long_row", "torch.softmax(a, -1)", a=r(2, 150))
case("log_softmax_f32_dim1", "torch.log_softmax(a, dim=1)", a=r(3, 5))
case("log_softmax_dim0", "F.log_softmax(a, dim=0)", a=r(3, 5))
case("log_softmax_bf16", "F.log_softmax(a, dim=-1)", a=r(3, 8, dt="bf16"))
case("log_softmax_3d_neg2", "torch.log_softmax(a, -2)", a=r(2, 3, 4))
case("log_softmax_large", "torch.log_softmax(a, -1)", a=vals([[1000.0, 1001.0, 999.0], [-1000.0, -1002.0, -999.5]]))
case("log_softmax_neginf", "torch.log_softmax(a, -1)", a=vals([[0.0, -INF, 1.0, -INF]]))
case("layer_norm_plain", "F.layer_norm(a, (8,))", a=r(4, 8))
case("layer_norm_weight_bias", "F.layer_norm(a, (8,), w, b)", a=r(4, 8), w=r(8), b=r(8))
case("layer_norm_weight_only", "F.layer_norm(a, (8,), w)", a=r(4, 8), w=r(8))
case("layer_norm_2d_shape", "F.layer_norm(a, (3, 4), w, b)", a=r(2, 3, 4), w=r(3, 4), b=r(3, 4))
case("layer_norm_eps", "F.layer_norm(a, (8,), w, b, eps=1e-2)", a=r(4, 8), w=r(8), b=r(8))
case("layer_norm_bf16", "F.layer_norm(a, (8,), w, b)", a=r(4, 8, dt="bf16"), w=r(8, dt="bf16"), b=r(8, dt="bf16"))
case("layer_norm_3d_input", "F.layer_norm(a, (8,), w, b)", a=r(2, 3, 8), w=r(8), b=r(8))
case("rms_norm_weight", "F.rms_norm(a, (8,), w)", a=r(4, 8), w=r(8))
case("rms_norm_eps", "F.rms_norm(a, (8,), w, eps=1e-3)", a=r(4, 8), w=r(8))
case("rms_norm_eps_none", "F.rms_norm(a, (8,), eps=None)", a=r(4, 8))
case("rms_norm_2d_shape", "F.rms_norm(a, (3, 4), w)", a=r(2, 3, 4), w=r(3, 4))
case("rms_norm_bf16", "F.rms_norm(a, (8,), w, eps=1e-6)", a=r(4, 8, dt="bf16"), w=r(8, dt="bf16"))
case("embedding_1d", "F.embedding(idx, w)", idx=ints(0, 6, 5), w=r(6, 4))
case("embedding_2d", "F.embedding(idx, w)", idx=ints(0, 6, 2, 3), w=r(6, 4))
case("embedding_bf16", "F.embedding(idx, w)", idx=ints(0, 6, 4), w=r(6, 4, dt="bf16"))
case("embedding_padding_idx", "F.embedding(idx, w, padding_idx=0)", idx=vals([0, 2, 0, 5], "i64"), w=r(6, 4))
T_IGN = vals([1, -100, 4, 0, -100, 2], "i64")
case("cross_entropy_mean", "F.cross_entropy(a, t)", a=r(4, 5), t=ints(0, 5, 4))
case("cross_entropy_sum", "F.cross_entropy(a, t, reduction='sum')", a=r(4, 5), t=ints(0, 5, 4))
case("cross_entropy_none", "F.cross_entropy(a, t, reduction='none')", a=r(4, 5), t=ints(0, 5, 4))
case("cross_entropy_ignore_default", "F.cross_entropy(a, t)", a=r(6, 5), t=T_IGN)
case("cross_entropy_ignore_none", "F.cross_entropy(a, t, reduction='none')", a=r(6, 5), t=T_IGN)
case("cross_entropy_ignore_custom", "F.cross_entropy(a, t, ignore_index=2)", a=r(6, 5),
     t=vals([1, 2, 4, 0, 2, 3], "i64"))
case("cross_entropy_label_smoothing", "F.cross_entropy(a, t, label_smoothing=0.1)", a=r(4, 5), t=ints(0, 5, 4))
case("cross_entropy_ls_sum", "F.cross_entropy(a, t, reduction='sum', label_smoothing=0.1)", a=r(4, 5),
     t=ints(0, 5, 4))
case("cross_entropy_ls_ignore", "F.cross_entropy(a, t, label_smoothing=0.1)", a=r(6, 5), t=T_IGN)
case("cross_entropy_bf16_upcast", "F.cross_entropy(a.float(), t)", a=r(4, 5, dt="bf16"), t=ints(0, 5, 4))
case("cross_entropy_weight", "F.cross_entropy(a, t, weight=w)", a=r(4, 5), t=ints(0, 5, 4), w=pos(5))
case("cross_entropy_3d", "F.cross_entropy(a, t)", a=r(2, 4, 3), t=ints(0, 4, 2, 3))
case("cross_entropy_all_ignored_nan", "F.cross_entropy(a, t)", a=r(2, 5), t=vals([-100, -100], "i64"))
case("cross_entropy_large_logits", "F.cross_entropy(a, t)", a=vals([[1000.0, 0.0, -1000.0], [5.0, 1005.0, 1000.0]]),
     t=vals([2, 1], "i64"))
case("mse_loss_mean", "F.mse_loss(a, b)", a=r(3, 4), b=r(3, 4))
case("mse_loss_sum", "F.mse_loss(a, b, reduction='sum')", a=r(3, 4), b=r(3, 4))
case("mse_loss_none", "F.mse_loss(a, b, reduction='none')", a=r(3, 4), b=r(3, 4))
case("mse_loss_bf16", "F.mse_loss(a, b)", a=r(3, 4, dt="bf16"), b=r(3, 4, dt="bf16"))
QKV = dict(q=r(2, 2, 5, 8), k=r(2, 2, 5, 8), v=r(2, 2, 5, 8))
BOOL_MASK = [[[[(i == j) or ((i + 2 * j + b) % 3 != 1) for j in range(5)] for i in range(5)]]
             for b in range(2)]
case("sdpa_basic", "F.scaled_dot_product_attention(q, k, v)", **QKV)
case("sdpa_causal", "F.scaled_dot_product_attention(q, k, v, is_causal=True)", **QKV)
case("sdpa_float_mask", "F.scaled_dot_product_attention(q, k, v, attn_mask=m)", **QKV, m=r(5, 5))
case("sdpa_bool_mask", "F.scaled_dot_product_attention(q, k, v, attn_mask=m)", **QKV,
     m=vals(BOOL_MASK, "bool"))
case("sdpa_scale", "F.scaled_dot_product_attention(q, k, v, scale=0.5)", **QKV)
case("sdpa_causal_scale", "F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.25)", **QKV)
case("sdpa_cross_len", "F.scaled_dot_product_attention(q, k, v)", q=r(2, 2, 3, 8), k=r(2, 2, 6, 8),
     v=r(2, 2, 6, 8))
case("sdpa_3d", "F.scaled_dot_product_attention(q, k, v)", q=r(2, 5, 8), k=r(2, 5, 8), v=r(2, 5, 8))
case("sdpa_bf16_causal", "F.scaled_dot_product_attention(q, k, v, is_causal=True)", q=r(1, 2, 5, 8, dt="bf16"),
     k=r(1, 2, 5, 8, dt="bf16"), v=r(1, 2, 5, 8, dt="bf16"))
# Masked attention as the template runs it: rows that keep no key give 0 (PyTorch's _safe_softmax),
# a decode step's [1, S] prefix mask broadcast over batch and heads, grouped-query rows, masks
# broadcast over the heads, added masks with -inf.
DEAD_ROW_MASK = [[[[(i != 2) and ((i + 2 * j + b) % 3 != 1) for j in range(5)] for i in range(5)]]
                 for b in range(2)]
case("sdpa_bool_mask_dead_row", "F.scaled_dot_product_attention(q, k, v, attn_mask=m)", **QKV,
     m=vals(DEAD_ROW_MASK, "bool"))
case("sdpa_decode_mask", "F.scaled_dot_product_attention(q, k, v, attn_mask=m)", q=r(2, 3, 1, 16),
     k=r(2, 3, 40, 16), v=r(2, 3, 40, 16), m=vals([[j <= 17 for j in range(40)]], "bool"))
case("sdpa_gqa_rows_mask", "F.scaled_dot_product_attention(q, k, v, attn_mask=m)", q=r(1, 2, 4, 8),
     k=r(1, 2, 70, 8), v=r(1, 2, 70, 8), m=vals([[j <= 30 + i for j in range(70)] for i in range(4)], "bool"))
case("sdpa_bf16_bool_mask", "F.scaled_dot_product_attention(q, k, v, attn_mask=m)", q=r(2, 2, 5, 8, dt="bf16"),
     k=r(2, 2, 5, 8, dt="bf16"), v=r(2, 2, 5, 8, dt="bf16"), m=vals(BOOL_MASK, "bool"))
case("sdpa_float_mask_neg_inf", "F.scaled_dot_product_attention(q, k, v, attn_mask=m)", **QKV,
     m=vals([[-INF if (i == 3 or (i + j) % 4 == 0) else 0.25 * (j - i) for j in range(5)] for i in range(5)]))

# ------------------------------------------------------------------------------------ composites
case("composite_softmax_affine", "torch.softmax(a @ b + c, -1)", a=r(3, 4), b=r(4, 5), c=r(5))
case("composite_attention", "torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), dim=-1) @ v", **QKV)
case("composite_gelu_mlp", "F.linear(F.gelu(F.linear(a, b, c)), d, e)",  # x, w1, b1, w2, b2
     a=r(2, 3, 8), b=r(16, 8), c=r(16), d=r(8, 16), e=r(8))
case("composite_prenorm_residual", "a + F.linear(F.layer_norm(a, (8,)), w)", a=r(2, 3, 8), w=r(8, 8))
case("composite_swiglu", "F.linear(F.silu(F.linear(a, b)) * F.linear(a, c), d)",  # x, w1, w3, w2
     a=r(3, 8), b=r(12, 8), c=r(12, 8), d=r(8, 12))
case("composite_linear_cross_entropy", "F.cross_entropy(F.linear(a, w), t)", a=r(4, 8), w=r(5, 8), t=ints(0, 5, 4))
case("composite_sigmoid_tanh_bcast", "torch.sigmoid(a * 2.0 + 1.0) * torch.tanh(b)", a=r(3, 4), b=r(4))
case("composite_centered_var", "(a - a.mean(-1, keepdim=True)).pow(2).mean(-1)", a=r(3, 8))

# ------------------------------------------------------------------------------------- gradients
# torch.autograd.grad of a scalar loss with respect to fresh leaves (detach().requires_grad_(), so
# the stored inputs stay plain tensors); outputs are the gradients in the listed order.
def grad_case(name, params, loss, **inputs):
    """`loss` is an expression over the inputs; `params` (a string of input names) are differentiated."""
    names = ", ".join(params)
    leaves = ", ".join(f"{p}.detach().requires_grad_()" for p in params)
    case(name, f"(lambda {names}: torch.autograd.grad({loss}, [{names}]))({leaves})", **inputs)


grad_case("grad_mlp_train_step", "bcd",
          "F.cross_entropy(F.linear(F.gelu(F.linear(F.gelu(F.linear(a, b)), c)), d), t)",
          a=r(6, 8), b=r(12, 8), c=r(12, 12), d=r(5, 12), t=ints(0, 5, 6))
grad_case("grad_softmax_weighted", "a", "(torch.softmax(a, -1) * b).sum()", a=r(3, 5), b=r(3, 5))
grad_case("grad_layer_norm_affine", "awc", "(F.layer_norm(a, (6,), w, c) * d).sum()",
          a=r(3, 6), w=r(6), c=r(6), d=r(3, 6))
grad_case("grad_pointwise_chain", "abc",
          "(torch.tanh(a) * torch.sigmoid(b) + torch.exp(a * 0.3) / (b * b + 1) + torch.sqrt(c) * torch.log(c)"
          " + torch.rsqrt(c) + torch.erf(a) * torch.sin(b) - torch.cos(a) + torch.abs(b) * c.reciprocal()).sum()",
          a=r(3, 4), b=r(3, 4), c=pos(3, 4))
grad_case("grad_pow_tensor", "ab", "(a ** b).sum()", a=pos(3, 4), b=r(3, 4))
grad_case("grad_amax_ties", "a", "(a.amax(1) * b).sum()", a=vals([[1.0, 3.0, 3.0], [2.0, 0.0, -1.0]]), b=r(2))
grad_case("grad_maximum_ties", "ab", "(torch.maximum(a, b) * c).sum()", a=vals([1.0, 2.0, 3.0, -1.0]),
          b=vals([1.0, 0.5, 4.0, -1.0]), c=r(4))
grad_case("grad_views", "ac", "((a.permute(1, 0)[1:, ::2] + c).sum(0) * b).sum()", a=r(5, 4), c=r(3, 1), b=r(3))
grad_case("grad_slice_steps", "a", "(a[1::2, 2:10:3] * b).sum()", a=r(6, 11), b=r(3, 3))
grad_case("grad_cat_pad_flip", "a", "(torch.cat([F.pad(a, (1, 2)), a.flip(1)], 1) * b).sum()", a=r(2, 3), b=r(2, 9))
grad_case("grad_cumsum", "a", "(torch.cumsum(a, 1) * b).sum()", a=r(3, 5), b=r(3, 5))
grad_case("grad_embedding", "w", "(F.embedding(idx, w) * b).sum()", idx=vals([[0, 2, 0], [3, 2, 2]], "i64"),
          w=r(4, 3), b=r(2, 3, 3))
grad_case("grad_gather", "a", "(torch.gather(a, 1, idx) * b).sum()", a=r(3, 4),
          idx=vals([[0, 0, 3], [1, 2, 1], [3, 3, 3]], "i64"), b=r(3, 3))
grad_case("grad_bmm", "ab", "(torch.bmm(a, b) * c).sum()", a=r(2, 3, 4), b=r(2, 4, 5), c=r(2, 3, 5))
grad_case("grad_mse_var", "a", "F.mse_loss(a, b) + a.var(1).sum()", a=r(3, 5), b=r(3, 5))
grad_case("grad_bf16_linear_gelu", "aw", "F.gelu(F.linear(a, w)).float().sum()", a=r(4, 8, dt="bf16"),
          w=r(6, 8, dt="bf16"))

# ----------------------------------------------------------------------- errors (PyTorch raises)
case("err_add_shape", "a + b", a=r(3, 4), b=r(5, 4))
case("err_matmul_inner", "a @ b", a=r(3, 4), b=r(5, 2))
case("err_matmul_0d", "torch.matmul(a, b)", a=r(), b=r(3))
case("err_mm_3d", "torch.mm(a, b)", a=r(2, 3, 4), b=r(4, 5))
case("err_bmm_batch", "torch.bmm(a, b)", a=r(2, 3, 4), b=r(3, 4, 5))
case("err_linear_shape", "F.linear(a, w)", a=r(2, 3), w=r(4, 5))
case("err_reshape_numel", "a.reshape(5, 3)", a=r(3, 4))
case("err_reshape_two_infer", "a.reshape(-1, -1)", a=r(3, 4))
case("err_view_noncontig", "a.t().view(12)", a=r(3, 4))
case("err_unflatten_sizes", "a.unflatten(1, (5, 2))", a=r(3, 12))
case("err_cat_dims", "torch.cat([a, b], 0)", a=r(2, 3), b=r(2, 4))
case("err_stack_shape", "torch.stack([a, b])", a=r(2, 3), b=r(3, 2))
case("err_split_sizes", "torch.split(a, [2, 2])", a=r(5))
case("err_chunk_zero", "a.chunk(0)", a=r(4))
case("err_gather_rank", "torch.gather(a, 1, idx)", a=r(3, 4), idx=ints(0, 4, 3))
case("err_index_select_oob", "torch.index_select(a, 0, idx)", a=r(4, 3), idx=vals([0, 4], "i64"))
case("err_embedding_oob", "F.embedding(idx, w)", idx=vals([0, 5], "i64"), w=r(5, 3))
case("err_softmax_dim", "torch.softmax(a, dim=2)", a=r(3, 4))
case("err_sum_dim_range", "a.sum(dim=3)", a=r(3, 4))
case("err_permute_repeated", "a.permute(0, 0, 1)", a=r(2, 3, 4))
case("err_permute_len", "a.permute(0, 1)", a=r(2, 3, 4))
case("err_transpose_dim", "a.transpose(0, 2)", a=r(3, 4))
case("err_t_3d", "a.t()", a=r(2, 3, 4))
case("err_expand_non1", "a.expand(6, 4)", a=r(3, 4))
case("err_broadcast_to", "torch.broadcast_to(a, (3, 5))", a=r(3, 4))
case("err_squeeze_dim_range", "a.squeeze(3)", a=r(3, 1))
case("err_narrow_oob", "a.narrow(1, 2, 5)", a=r(3, 4))
case("err_slice_negative_step", "a[::-1]", a=r(4))
case("err_repeat_fewer_dims", "a.repeat(2)", a=r(2, 3))
case("err_pad_too_long", "F.pad(a, (1, 1, 1, 1))", a=r(3))
case("err_where_shape", "torch.where(c, a, b)", c=bools(3), a=r(4), b=r(4))
case("err_mean_int", "a.mean()", a=ints(0, 5, 4))
case("err_max_empty_dim", "torch.max(a, 0)", a=r(0, 3))
case("err_int_pow_negative", "torch.pow(a, -1)", a=ints(1, 5, 4))
case("err_bitwise_not_float", "~a", a=r(4))
case("err_layer_norm_shape", "F.layer_norm(a, (5,))", a=r(3, 4))
case("err_cross_entropy_target_oob", "F.cross_entropy(a, t)", a=r(2, 5), t=vals([1, 7], "i64"))
case("err_grad_nonscalar", "(lambda a: torch.autograd.grad(a * 2, [a]))(a.detach().requires_grad_())", a=r(3))
case("err_grad_unused", "(lambda a, b: torch.autograd.grad((a * 2).sum(), [a, b]))(a.detach().requires_grad_(), "
     "b.detach().requires_grad_())", a=r(3), b=r(3))
case("err_sdpa_head_dim", "F.scaled_dot_product_attention(q, k, v)", q=r(1, 2, 5, 8), k=r(1, 2, 5, 4),
     v=r(1, 2, 5, 8))


# ------------------------------------------------------------------ composite ops (decompositions)
# Ops coil writes as compositions of its primitives in the frontend. `gcase(name)` adds
# `grad_<name>`: the gradient of `sum(y * linspace(-1, 2, numel))` (y = the case's output) with
# respect to every floating input except targets (`t`, `y`) and weights PyTorch does not
# differentiate (`z`); coil's harness builds the same loss
# from the forward case.
def gcase(name):
    fwd = next(c for c in CASES if c["name"] == name)
    params = [k for k, spec in sorted(fwd["inputs"].items())
              if spec["dtype"] in ("float32", "float64", "float16", "bfloat16") and k not in ("t", "y", "z")]
    names = ", ".join(params)
    leaves = ", ".join(f"{p}.detach().requires_grad_()" for p in params)
    loss = (f"(lambda out: (out * torch.linspace(-1, 2, out.numel()).reshape(out.shape).to(out.dtype)).sum())"
            f"({fwd['expr']})")
    case(f"grad_{name}", f"(lambda {names}: torch.autograd.grad({loss}, [{names}]))({leaves})", **fwd["inputs"])


def fcase(name, expr, grad=True, **inputs):
    """A forward case and, with `grad`, its gradient case."""
    case(name, expr, **inputs)
    if grad:
        gcase(name)


# Gradients of masked attention (coil's backward templates with a mask): a bool mask broadcast over
# the heads with a row that keeps no key (its gradients are 0), more rows than a forward-only graph
# keeps masked, an added mask with -inf that is not differentiated (`z`), and one that is (a learned
# bias, whose gradient coil takes through the decomposition).
LONG_MASK = [[[[(i != 7) and ((3 * i + j + 5 * b) % 4 != 0) and (j < 24 - 5 * b) for j in range(24)]
               for i in range(20)]] for b in range(2)]
case("sdpa_bool_mask_long", "F.scaled_dot_product_attention(q, k, v, attn_mask=m)", q=r(2, 2, 20, 8),
     k=r(2, 2, 24, 8), v=r(2, 2, 24, 8), m=vals(LONG_MASK, "bool"))
case("sdpa_float_mask_fixed", "F.scaled_dot_product_attention(q, k, v, attn_mask=z)", **QKV,
     z=vals([[-INF if (i == 1 or (2 * i + j) % 5 == 0) else 0.3 * (i - j) for j in range(5)] for i in range(5)]))
gcase("sdpa_bool_mask_dead_row")
gcase("sdpa_bool_mask_long")
gcase("sdpa_float_mask_fixed")
gcase("sdpa_float_mask_neg_inf")


SPECIAL = [NAN, INF, -INF, 0.0, -0.0, 1.0, -1.0, 0.5]
# relu at its tie: no gradient at 0 or -0.0 (threshold_backward), -0.0 and NaN kept, NaN's passes
fcase("relu_ties", "torch.relu(a)", a=vals([0.0, -0.0, 1.0, -1.0, 0.0, 2.0, -0.0, NAN]))
# pointwise math
fcase("log10_f32", "torch.log10(a)", a=pos(4, 6))
case("log10_special", "torch.log10(a)", a=vals([0.0, -1.0, INF, NAN, 1.0, 10.0, 1e-30, 1000.0]))
case("log10_i64", "torch.log10(a)", a=ints(1, 1000, 8))
case("log10_bf16", "torch.log10(a)", a=pos(3, 5, dt="bf16"))
fcase("frac_f32", "torch.frac(a)", a=r(4, 6))
case("frac_special", "torch.frac(a)", a=vals([2.5, -2.5, -0.0, INF, -INF, NAN, 1e10, -7.25]))
case("frac_f64", "torch.frac(a)", a=r(3, 5, dt="f64"))
case("err_frac_int", "torch.frac(a)", a=ints(0, 5, 4))
fcase("clamp_min_fn", "torch.clamp_min(a, -0.3)", a=r(3, 4))
fcase("clamp_max_fn", "torch.clamp_max(a, 0.3)", a=r(3, 4))
case("clamp_min_fn_i64", "torch.clamp_min(a, 2)", a=ints(-5, 5, 8))
fcase("clamp_tensor_both", "torch.clamp(a, min=b, max=c)", a=r(3, 4), b=r(3, 4), c=r(4))
case("clamp_tensor_min_only", "torch.clamp(a, min=b)", a=r(3, 4), b=r(3, 1))
case("clamp_tensor_nan", "torch.clamp(a, min=b, max=c)", a=vals([NAN, 1.0, 0.5, 5.0]), b=vals([0.0, NAN, 1.0, 0.0]),
     c=vals([1.0, 2.0, 0.2, 3.0]))
case("isfinite_f32", "torch.isfinite(a)", a=vals(SPECIAL))
case("isfinite_i64", "torch.isfinite(a)", a=ints(-5, 5, 6))
case("isposinf_f32", "torch.isposinf(a)", a=vals(SPECIAL))
case("isneginf_f32", "torch.isneginf(a)", a=vals(SPECIAL))
case("isneginf_bf16", "torch.isneginf(a)", a=vals([-INF, INF, NAN, 1.0], "bf16"))
for op in ["sinh", "cosh", "asinh", "atanh"]:
    dist = uni(4, 6) if op == "atanh" else r(4, 6)
    fcase(f"{op}_f32", f"torch.{op}(a)", a=dist)
    case(f"{op}_f64", f"torch.{op}(a)", a=r(3, 5, dt="f64") if op != "atanh" else uni(3, 5, dt="f64"))
    case(f"{op}_bf16", f"torch.{op}(a)", a=r(3, 5, dt="bf16") if op != "atanh" else uni(3, 5, dt="bf16"))
case("sinh_special", "torch.sinh(a)", a=vals([0.0, 1e-8, -1e-5, 20.0, 25.0, -88.0, 89.0, INF, -INF, NAN]))
case("cosh_special", "torch.cosh(a)", a=vals([0.0, 1e-8, -1e-5, 20.0, 25.0, -88.0, 89.0, INF, -INF, NAN]))
case("asinh_special", "torch.asinh(a)", a=vals([0.0, 1e-8, -1e-5, 1e9, -1e20, 3e38, INF, -INF, NAN]))
fcase("acosh_f32", "torch.acosh(a)", a=vals([1.5, 2.0, 3.5, 10.0, 1.01, 100.0]))
case("acosh_special", "torch.acosh(a)", a=vals([1.0, 1.0000001, 0.5, -2.0, 1e9, 3e38, INF, NAN]))
case("atanh_special", "torch.atanh(a)", a=vals([0.0, 1e-8, -1e-5, 0.99, -0.999, 1.0, -1.0, 2.0, NAN]))
case("acosh_f64", "torch.acosh(a)", a=vals([1.5, 2.0, 3.5, 10.0], "f64"))
fcase("square_f32", "torch.square(a)", a=r(3, 4))
case("square_i32", "torch.square(a)", a=ints(-9, 9, 6, dt="i32"))
fcase("lerp_scalar", "torch.lerp(a, b, 0.3)", a=r(3, 4), b=r(3, 4))
fcase("lerp_tensor_weight", "torch.lerp(a, b, c)", a=r(3, 4), b=r(4), c=uni(3, 4))
case("lerp_weight_one", "torch.lerp(a, b, 1.0)", a=r(6), b=r(6))
case("lerp_bf16", "torch.lerp(a, b, 0.75)", a=r(3, 4, dt="bf16"), b=r(3, 4, dt="bf16"))
case("err_lerp_dtype", "torch.lerp(a, b, 0.5)", a=r(3), b=r(3, dt="f64"))
fcase("addcmul_f32", "torch.addcmul(a, b, c, value=0.5)", a=r(3, 4), b=r(3, 4), c=r(4))
case("addcmul_i64", "torch.addcmul(a, b, c, value=2)", a=ints(-5, 5, 6), b=ints(-5, 5, 6), c=ints(-5, 5, 6))
fcase("addcdiv_f32", "torch.addcdiv(a, b, c, value=-1.5)", a=r(3, 4), b=r(3, 4), c=pos(3, 4))
case("err_addcdiv_int", "torch.addcdiv(a, b, c)", a=ints(0, 5, 4), b=ints(0, 5, 4), c=ints(1, 5, 4))
fcase("hypot_f32", "torch.hypot(a, b)", a=r(3, 4), b=r(4))
case("hypot_special", "torch.hypot(a, b)", a=vals([3.0, 0.0, 3e30, 1e-30, INF, NAN, -INF, 0.0]),
     b=vals([4.0, 0.0, 4e30, 1e-30, NAN, 1.0, 2.0, -5.0]))
case("hypot_f64", "torch.hypot(a, b)", a=r(5, dt="f64"), b=r(5, dt="f64"))
case("logical_xor_bool", "torch.logical_xor(a, b)", a=bools(3, 4), b=bools(3, 4))
case("logical_xor_mixed", "torch.logical_xor(a, b)", a=vals([0.0, 1.5, NAN, -0.0]), b=vals([0, 0, 3, 2], "i64"))
fcase("xlogy_f32", "torch.xlogy(a, b)", a=r(3, 4), b=pos(3, 4))
case("xlogy_special", "torch.xlogy(a, b)", a=vals([0.0, 0.0, 1.0, 2.0, 0.0, -1.0]), b=vals([0.0, NAN, 0.0, INF, -1.0, 2.0]))
case("xlogy_scalar", "torch.xlogy(a, 3.0)", a=r(6))
fcase("copysign_f32", "torch.copysign(a, b)", a=r(3, 4), b=r(3, 4))
case("copysign_special", "torch.copysign(a, b)", a=vals([1.0, 2.0, -3.0, NAN, INF, 0.0]),
     b=vals([-0.0, 0.0, INF, -1.0, -2.0, -5.0]))
case("copysign_i64", "torch.copysign(a, b)", a=ints(-5, 5, 6), b=ints(-5, 5, 6))
case("float_power_f32", "torch.float_power(a, b)", a=pos(3, 4), b=r(3, 4))
case("float_power_i64", "torch.float_power(a, 2)", a=ints(-5, 5, 6))
fcase("logaddexp_f32", "torch.logaddexp(a, b)", a=r(3, 4), b=r(3, 4))
case("logaddexp_special", "torch.logaddexp(a, b)", a=vals([-INF, INF, 1000.0, -1000.0, NAN, -INF, 0.0]),
     b=vals([-INF, INF, 1000.0, -999.0, 0.0, 3.0, INF]))
fcase("logaddexp2_f32", "torch.logaddexp2(a, b)", a=r(3, 4), b=r(3, 4))
fcase("sinc_f32", "torch.sinc(a)", a=r(3, 4))
case("sinc_special", "torch.sinc(a)", a=vals([0.0, 1.0, -2.0, 0.5, 1e-8, INF, NAN]))
case("deg2rad_f32", "torch.deg2rad(a)", a=r(3, 4))
case("deg2rad_i64", "torch.deg2rad(a)", a=ints(-360, 360, 6))
case("rad2deg_f32", "torch.rad2deg(a)", a=r(3, 4))
fcase("logit_f32", "torch.logit(a)", a=uni(3, 4))
case("logit_eps", "torch.logit(a, eps=0.1)", a=vals([0.0, 0.05, 0.5, 0.95, 1.0, NAN]))
case("heaviside_f32", "torch.heaviside(a, b)", a=vals([-1.5, 0.0, 2.0, -0.0, NAN, INF]), b=vals([0.5]))
case("err_heaviside_dtype", "torch.heaviside(a, b)", a=r(4), b=r(1, dt="f64"))

# activations
for op, expr in [("leaky_relu", "F.leaky_relu(a, 0.1)"), ("elu", "F.elu(a, 1.5)"), ("selu", "F.selu(a)"),
                 ("celu", "F.celu(a, 0.7)"), ("mish", "F.mish(a)"), ("hardswish", "F.hardswish(a)"),
                 ("hardsigmoid", "F.hardsigmoid(a)"), ("hardtanh", "F.hardtanh(a, -0.5, 0.8)"),
                 ("relu6", "F.relu6(a * 4)"), ("logsigmoid", "F.logsigmoid(a)"), ("softsign", "F.softsign(a)"),
                 ("tanhshrink", "F.tanhshrink(a)"), ("hardshrink", "F.hardshrink(a, 0.4)"),
                 ("softshrink", "F.softshrink(a, 0.4)"), ("threshold", "F.threshold(a, 0.2, -3.0)")]:
    fcase(f"{op}_f32", expr, a=r(4, 6))
    case(f"{op}_special", expr, a=vals([NAN, INF, -INF, 0.0, -0.0, 30.0, -30.0, 0.4]))
    case(f"{op}_bf16", expr, a=r(3, 5, dt="bf16"))
case("leaky_relu_f64", "F.leaky_relu(a)", a=r(3, 5, dt="f64"))
case("elu_f16", "F.elu(a)", a=r(3, 5, dt="f16"))
case("mish_large", "F.mish(a)", a=vals([-100.0, -20.0, 0.0, 20.0, 50.0, 100.0]))
case("logsigmoid_large", "F.logsigmoid(a)", a=vals([-200.0, -30.0, 0.0, 30.0, 200.0]))
case("err_leaky_relu_int", "F.leaky_relu(a)", a=ints(-5, 5, 4))
case("err_celu_alpha0", "F.celu(a, 0.0)", a=r(4))
case("err_softshrink_negative", "F.softshrink(a, -1.0)", a=r(4))
fcase("glu_last", "F.glu(a)", a=r(3, 8))
fcase("glu_dim0", "F.glu(a, 0)", a=r(4, 3))
case("err_glu_odd", "F.glu(a)", a=r(3, 5))
fcase("softmin_dim1", "F.softmin(a, dim=1)", a=r(3, 5))
case("softmin_3d", "F.softmin(a, dim=0)", a=r(2, 3, 4))
fcase("prelu_channels", "F.prelu(a, w)", a=r(2, 3, 4), w=r(3))
case("prelu_single", "F.prelu(a, w)", a=r(4, 5), w=vals([0.25]))
case("err_prelu_channels", "F.prelu(a, w)", a=r(2, 3, 4), w=r(2))

# losses
for red in ["mean", "sum", "none"]:
    fcase(f"l1_loss_{red}", f"F.l1_loss(a, y, reduction='{red}')", a=r(3, 4), y=r(3, 4))
    fcase(f"smooth_l1_loss_{red}", f"F.smooth_l1_loss(a, y, reduction='{red}', beta=0.5)", a=r(3, 4), y=r(3, 4))
    fcase(f"huber_loss_{red}", f"F.huber_loss(a, y, reduction='{red}', delta=0.7)", a=r(3, 4), y=r(3, 4))
case("smooth_l1_loss_beta0", "F.smooth_l1_loss(a, y, beta=0.0)", a=r(3, 4), y=r(3, 4))
case("l1_loss_bf16", "F.l1_loss(a, y)", a=r(3, 4, dt="bf16"), y=r(3, 4, dt="bf16"))
case("err_huber_loss_delta", "F.huber_loss(a, y, delta=0.0)", a=r(3), y=r(3))
fcase("binary_cross_entropy_mean", "F.binary_cross_entropy(a, y)", a=uni(3, 4), y=uni(3, 4))
fcase("binary_cross_entropy_weight_sum", "F.binary_cross_entropy(a, y, weight=z, reduction='sum')", a=uni(3, 4),
      y=uni(3, 4), z=pos(4))
case("binary_cross_entropy_edges", "F.binary_cross_entropy(a, y, reduction='none')", a=vals([0.0, 1.0, 0.0, 1.0, 0.5]),
     y=vals([0.0, 1.0, 1.0, 0.0, 0.3]))
case("err_binary_cross_entropy_shape", "F.binary_cross_entropy(a, y)", a=uni(3, 4), y=uni(4))
fcase("binary_cross_entropy_with_logits_mean", "F.binary_cross_entropy_with_logits(a, y)", a=r(3, 4), y=uni(3, 4))
case("binary_cross_entropy_with_logits_pos_weight",
     "F.binary_cross_entropy_with_logits(a, y, weight=z, pos_weight=b, reduction='none')", a=r(3, 4), y=uni(3, 4),
     z=pos(4), b=pos(4))
fcase("binary_cross_entropy_with_logits_weight", "F.binary_cross_entropy_with_logits(a, y, weight=z, reduction='sum')",
      a=r(3, 4), y=uni(3, 4), z=pos(4))
case("binary_cross_entropy_with_logits_large", "F.binary_cross_entropy_with_logits(a, y, reduction='none')",
     a=vals([-100.0, -30.0, 0.0, 30.0, 100.0]), y=vals([1.0, 0.0, 0.5, 1.0, 0.0]))
fcase("kl_div_batchmean", "F.kl_div(a, y, reduction='batchmean')", a=r(3, 4), y=uni(3, 4))
fcase("kl_div_log_target_sum", "F.kl_div(a, y, reduction='sum', log_target=True)", a=r(3, 4), y=r(3, 4))
case("kl_div_none_zero_target", "F.kl_div(a, y, reduction='none')", a=r(4), y=vals([0.0, 0.5, 0.0, 1.0]))
case("kl_div_mean", "F.kl_div(a, y, reduction='mean')", a=r(3, 4), y=uni(3, 4))
fcase("nll_loss_mean", "F.nll_loss(a, t)", a=r(4, 5), t=ints(0, 5, 4))
fcase("nll_loss_weight_ignore", "F.nll_loss(a, t, weight=z, ignore_index=1)", a=r(6, 5), t=vals([1, 0, 4, 1, 2, 3], "i64"),
      z=pos(5))
fcase("nll_loss_none", "F.nll_loss(a, t, reduction='none')", a=r(6, 5), t=T_IGN)
case("nll_loss_sum", "F.nll_loss(a, t, reduction='sum')", a=r(4, 5), t=ints(0, 5, 4))
fcase("nll_loss_4d", "F.nll_loss(a, t)", a=r(2, 3, 2, 2), t=ints(0, 3, 2, 2, 2))
case("nll_loss_4d_none", "F.nll_loss(a, t, reduction='none')", a=r(2, 3, 2, 2), t=ints(0, 3, 2, 2, 2))
case("nll_loss_1d", "F.nll_loss(a, t)", a=r(5), t=vals(3, "i64", shape=[]))
case("err_nll_loss_target_shape", "F.nll_loss(a, t)", a=r(4, 5), t=ints(0, 5, 3))
case("err_nll_loss_target_oob", "F.nll_loss(a, t)", a=r(2, 5), t=vals([1, 7], "i64"))
fcase("cross_entropy_4d_label_smoothing", "F.cross_entropy(a, t, label_smoothing=0.2)", a=r(2, 4, 3, 2),
      t=ints(0, 4, 2, 3, 2))
case("cross_entropy_3d_none", "F.cross_entropy(a, t, reduction='none')", a=r(2, 4, 3), t=ints(0, 4, 2, 3))
fcase("cross_entropy_3d_weight_ignore", "F.cross_entropy(a, t, weight=z)", a=r(2, 4, 3),
      t=vals([[1, -100, 3], [0, 2, -100]], "i64"), z=pos(4))
fcase("margin_ranking_loss_mean", "F.margin_ranking_loss(a, b, y, margin=0.3)", a=r(6), b=r(6),
      y=vals([1.0, -1.0, 1.0, -1.0, 1.0, 1.0]))
fcase("soft_margin_loss_mean", "F.soft_margin_loss(a, y)", a=r(3, 4), y=vals([[1.0, -1.0, 1.0, 1.0]] * 3))
fcase("hinge_embedding_loss_mean", "F.hinge_embedding_loss(a, y, margin=0.8)", a=r(3, 4),
      y=vals([[1.0, -1.0, 1.0, -1.0]] * 3))
fcase("poisson_nll_loss_log", "F.poisson_nll_loss(a, y)", a=r(3, 4), y=pos(3, 4))
fcase("poisson_nll_loss_full", "F.poisson_nll_loss(a, y, log_input=False, full=True, reduction='sum')", a=pos(3, 4),
      y=vals([[0.0, 1.0, 2.0, 5.0]] * 3))
fcase("gaussian_nll_loss_mean", "F.gaussian_nll_loss(a, y, b)", a=r(3, 4), y=r(3, 4), b=pos(3, 4))
case("gaussian_nll_loss_full_sum", "F.gaussian_nll_loss(a, y, b, full=True, reduction='sum')", a=r(3, 4), y=r(3, 4),
     b=vals([[0.0, 1e-8, 0.5, 2.0]] * 3))
fcase("cosine_similarity_dim1", "F.cosine_similarity(a, b, dim=1)", a=r(3, 5), b=r(3, 5))
fcase("cosine_similarity_broadcast", "F.cosine_similarity(a, b, dim=-1)", a=r(2, 3, 4), b=r(4))
case("cosine_similarity_zero", "F.cosine_similarity(a, b, dim=0)", a=vals([0.0, 0.0, 0.0]), b=vals([1.0, 2.0, 3.0]))
fcase("pairwise_distance_p2", "F.pairwise_distance(a, b)", a=r(4, 5), b=r(4, 5))
case("pairwise_distance_p1_keepdim", "F.pairwise_distance(a, b, p=1.0, keepdim=True)", a=r(4, 5), b=r(5))
fcase("normalize_dim1", "F.normalize(a, dim=1)", a=r(3, 5))
case("normalize_p1_dim0", "F.normalize(a, p=1.0, dim=0)", a=r(3, 5))
case("normalize_zero_row", "F.normalize(a)", a=vals([[0.0, 0.0], [3.0, 4.0]]))

# indexing and rearranging
fcase("masked_fill_f32", "a.masked_fill(m, -2.5)", a=r(3, 4), m=bools(3, 4))
case("masked_fill_broadcast_i64", "a.masked_fill(m, 7)", a=ints(0, 5, 3, 4), m=bools(4))
case("masked_fill_nan", "a.masked_fill(m, float('nan'))", a=r(3, 4), m=bools(3, 1))
case("err_masked_fill_mask_dtype", "a.masked_fill(m, 0.0)", a=r(3, 4), m=ints(0, 2, 3, 4))
fcase("tile_2d", "torch.tile(a, (2, 3))", a=r(2, 3))
case("tile_short_reps", "torch.tile(a, (2,))", a=r(2, 3))
case("tile_long_reps", "torch.tile(a, (2, 1, 2))", a=ints(0, 9, 3))
case("unbind_dim0", "torch.unbind(a)", a=r(3, 4))
case("unbind_dim_neg", "torch.unbind(a, -1)", a=r(2, 3))
fcase("roll_1d", "torch.roll(a, 2)", a=r(6))
fcase("roll_dims", "torch.roll(a, (1, -2), (0, 1))", a=r(3, 5))
case("roll_flat_2d", "torch.roll(a, -3)", a=ints(0, 20, 3, 4))
case("roll_large_shift", "torch.roll(a, 13, 1)", a=r(2, 5))
fcase("diagonal_main", "torch.diagonal(a)", a=r(4, 4))
fcase("diagonal_offset_pos", "torch.diagonal(a, 1)", a=r(3, 5))
case("diagonal_offset_neg", "torch.diagonal(a, -2)", a=r(4, 3))
fcase("diagonal_batched_dims", "torch.diagonal(a, 0, 0, 2)", a=r(3, 2, 4))
case("diagonal_empty", "torch.diagonal(a, 5)", a=r(3, 3))
fcase("diag_vector", "torch.diag(a)", a=r(3))
fcase("diag_vector_offset", "torch.diag(a, -1)", a=r(3))
case("diag_vector_offset_pos", "torch.diag(a, 2)", a=ints(1, 9, 3))
case("diag_matrix", "torch.diag(a, 1)", a=r(3, 4))
case("err_diag_3d", "torch.diag(a)", a=r(2, 2, 2))
fcase("diag_embed_batched", "torch.diag_embed(a)", a=r(2, 3))
case("diag_embed_offset", "torch.diag_embed(a, 1)", a=r(2, 3))
fcase("trace_f32", "torch.trace(a)", a=r(3, 4))
case("trace_i64", "torch.trace(a)", a=ints(-5, 5, 3, 3))
case("one_hot_1d", "F.one_hot(idx, 5)", idx=ints(0, 5, 6))
case("one_hot_2d", "F.one_hot(idx, 4)", idx=ints(0, 4, 2, 3))
case("err_one_hot_oob", "F.one_hot(idx, 3)", idx=vals([0, 3, 1], "i64"))
case("err_one_hot_negative", "F.one_hot(idx, 3)", idx=vals([0, -1], "i64"))
fcase("repeat_interleave_dim", "torch.repeat_interleave(a, 2, dim=1)", a=r(2, 3))
case("repeat_interleave_flat", "torch.repeat_interleave(a, 3)", a=ints(0, 9, 2, 2))
fcase("index_add_dim0", "torch.index_add(a, 0, idx, b, alpha=2.0)", a=r(4, 3), idx=vals([0, 2, 0, 3, 2], "i64"),
      b=r(5, 3))
case("index_add_dim1_i64", "torch.index_add(a, 1, idx, b)", a=ints(0, 5, 2, 4), idx=vals([3, 1], "i64"),
     b=ints(0, 5, 2, 2))
fcase("index_copy_dim0", "torch.index_copy(a, 0, idx, b)", a=r(4, 3), idx=vals([3, 0], "i64"), b=r(2, 3))
case("index_copy_dim1", "torch.index_copy(a, 1, idx, b)", a=r(2, 4), idx=vals([1, 2, 0], "i64"), b=r(2, 3))
case("err_index_copy_shape", "torch.index_copy(a, 0, idx, b)", a=r(4, 3), idx=vals([3, 0], "i64"), b=r(3, 3))
fcase("index_fill_dim1", "torch.index_fill(a, 1, idx, -1.0)", a=r(3, 4), idx=vals([0, 2, 2], "i64"))
case("index_fill_negative", "torch.index_fill(a, 0, idx, 9)", a=ints(0, 5, 3, 2), idx=vals([-1], "i64"))
case("err_index_fill_oob", "torch.index_fill(a, 1, idx, 0.0)", a=r(2, 3), idx=vals([3], "i64"))
fcase("take_2d", "torch.take(a, idx)", a=r(3, 4), idx=vals([[0, 11], [-1, 5]], "i64"))
case("err_take_oob", "torch.take(a, idx)", a=r(3, 4), idx=vals([12], "i64"))
fcase("take_along_dim_1", "torch.take_along_dim(a, idx, 1)", a=r(3, 4), idx=vals([[0, 3], [1, 1], [2, 0]], "i64"))
case("take_along_dim_broadcast", "torch.take_along_dim(a, idx, 0)", a=r(3, 4), idx=vals([[2, 0, 1, 1]], "i64"))
fcase("movedim_0_last", "torch.movedim(a, 0, -1)", a=r(2, 3, 4))
case("movedim_2_0", "torch.movedim(a, 2, 0)", a=r(2, 3, 4))
case("swapaxes_0_2", "torch.swapaxes(a, 0, 2)", a=r(2, 3, 4))
case("fliplr_2d", "torch.fliplr(a)", a=r(3, 4))
case("flipud_2d", "torch.flipud(a)", a=r(3, 4))
fcase("rot90_k1", "torch.rot90(a)", a=r(2, 3))
case("rot90_k2", "torch.rot90(a, 2)", a=r(2, 3))
case("rot90_k_neg1_dims", "torch.rot90(a, -1, (1, 2))", a=r(2, 3, 4))
fcase("hstack_2d", "torch.hstack([a, b])", a=r(2, 3), b=r(2, 2))
case("hstack_1d", "torch.hstack([a, b])", a=r(3), b=r(2))
fcase("vstack_1d", "torch.vstack([a, b])", a=r(3), b=r(3))
case("dstack_2d", "torch.dstack([a, b])", a=r(2, 3), b=r(2, 3))
case("column_stack_1d", "torch.column_stack([a, b])", a=r(3), b=r(3, 2))
case("row_stack_1d", "torch.row_stack([a, b])", a=r(3), b=r(2, 3))
case("meshgrid_ij", "torch.meshgrid(a, b, indexing='ij')", a=r(3), b=r(4))
case("meshgrid_xy", "torch.meshgrid(a, b, c, indexing='xy')", a=r(2), b=r(3), c=r(4))
case("atleast_2d_1d", "torch.atleast_2d(a)", a=r(3))
case("atleast_3d_2d", "torch.atleast_3d(a)", a=r(2, 3))
case("atleast_1d_0d", "torch.atleast_1d(a)", a=r())

# reductions
fcase("var_mean_dim1", "torch.var_mean(a, 1)", grad=False, a=r(3, 5))
case("var_mean_all_corr0", "torch.var_mean(a, correction=0)", a=r(3, 5))
case("std_mean_keepdim", "torch.std_mean(a, (0, 2), keepdim=True)", a=r(2, 3, 4))
case("aminmax_all", "torch.aminmax(a)", a=r(3, 5))
case("aminmax_dim_keepdim", "torch.aminmax(a, dim=-1, keepdim=True)", a=ints(-9, 9, 3, 5))
case("aminmax_nan", "torch.aminmax(a, dim=0)", a=vals([[1.0, NAN], [2.0, 3.0]]))
fcase("nansum_dim", "torch.nansum(a, 1)", a=vals([[1.0, NAN, 2.0], [NAN, NAN, 0.5]]))
case("nansum_i64", "torch.nansum(a)", a=ints(-5, 5, 6))
case("nansum_inf", "torch.nansum(a)", a=vals([1.0, NAN, INF]))
# The gradient of an all-NaN slice is 0 in coil and NaN in PyTorch (0 * 1/0): graded without one.
fcase("nanmean_dim", "torch.nanmean(a, 1)", a=vals([[1.0, NAN, 2.0], [NAN, NAN, 0.5], [NAN, 3.0, -1.0]]))
case("nanmean_all_nan_row", "torch.nanmean(a, 1)", a=vals([[1.0, NAN, 2.0], [NAN, NAN, NAN]]))
case("nanmean_all", "torch.nanmean(a)", a=r(3, 4))
case("err_nanmean_int", "torch.nanmean(a)", a=ints(0, 5, 4))
case("count_nonzero_all", "torch.count_nonzero(a)", a=vals([[0.0, 1.0, NAN], [-0.0, 2.0, 0.0]]))
case("count_nonzero_dim", "torch.count_nonzero(a, dim=0)", a=ints(-1, 2, 3, 4))
fcase("dist_p2", "torch.dist(a, b)", a=r(3, 4), b=r(4))
case("dist_p1", "torch.dist(a, b, p=1)", a=r(3, 4), b=r(3, 4))
case("dist_pinf", "torch.dist(a, b, p=float('inf'))", a=r(3, 4), b=r(3, 4))
fcase("frobenius_norm_batched", "torch.linalg.matrix_norm(a)", a=r(2, 3, 4))

# linear algebra
fcase("addmm_f32", "torch.addmm(a, b, c, beta=0.5, alpha=2.0)", a=r(4), b=r(3, 5), c=r(5, 4))
case("addmm_beta0_nan", "torch.addmm(a, b, c, beta=0.0)", a=vals([NAN, 1.0]), b=r(3, 2), c=r(2, 2))
case("err_addmm_shape", "torch.addmm(a, b, c)", a=r(3), b=r(3, 5), c=r(5, 4))
fcase("addmv_f32", "torch.addmv(a, b, c, alpha=0.5)", a=r(3), b=r(3, 4), c=r(4))
fcase("addr_f32", "torch.addr(a, b, c, beta=2.0)", a=r(3, 4), b=r(3), c=r(4))
fcase("baddbmm_f32", "torch.baddbmm(a, b, c, beta=0.5, alpha=1.5)", a=r(2, 3, 5), b=r(2, 3, 4), c=r(2, 4, 5))
fcase("addbmm_f32", "torch.addbmm(a, b, c)", a=r(3, 5), b=r(2, 3, 4), c=r(2, 4, 5))
fcase("outer_f32", "torch.outer(a, b)", a=r(3), b=r(4))
case("outer_i64", "torch.outer(a, b)", a=ints(-5, 5, 3), b=ints(-5, 5, 2))
fcase("dot_f32", "torch.dot(a, b)", a=r(7), b=r(7))
case("err_dot_size", "torch.dot(a, b)", a=r(3), b=r(4))
case("err_dot_2d", "torch.dot(a, b)", a=r(3, 1), b=r(3))
case("vdot_f64", "torch.vdot(a, b)", a=r(5, dt="f64"), b=r(5, dt="f64"))
fcase("inner_2d", "torch.inner(a, b)", a=r(2, 3), b=r(4, 3))
fcase("mv_f32", "torch.mv(a, b)", a=r(3, 4), b=r(4))
case("err_mv_rank", "torch.mv(a, b)", a=r(3, 4), b=r(4, 1))
fcase("tensordot_2", "torch.tensordot(a, b, dims=([1, 2], [1, 0]))", a=r(2, 3, 4), b=r(4, 3, 5))
case("tensordot_int_dims", "torch.tensordot(a, b, dims=1)", a=r(2, 3), b=r(3, 4))
fcase("einsum_matmul", "torch.einsum('ij,jk->ik', a, b)", a=r(3, 4), b=r(4, 5))
fcase("einsum_batched", "torch.einsum('bij,bjk->bik', a, b)", a=r(2, 3, 4), b=r(2, 4, 5))
fcase("einsum_attention", "torch.einsum('bhqd,bhkd->bhqk', a, b)", a=r(2, 2, 3, 4), b=r(2, 2, 5, 4))
case("einsum_trace", "torch.einsum('ii', a)", a=r(4, 4))
case("einsum_diag", "torch.einsum('ii->i', a)", a=r(4, 4))
case("einsum_sum", "torch.einsum('ij->', a)", a=r(3, 4))
case("einsum_transpose_implicit", "torch.einsum('ji', a)", a=r(3, 4))
case("einsum_outer", "torch.einsum('i,j->ij', a, b)", a=r(3), b=r(4))
fcase("einsum_three", "torch.einsum('ij,jk,kl->il', a, b, c)", a=r(2, 3), b=r(3, 4), c=r(4, 2))
case("einsum_bilinear", "torch.einsum('bn,anm,bm->ba', a, b, c)", a=r(2, 3), b=r(4, 3, 5), c=r(2, 5))
case("einsum_sum_out_single", "torch.einsum('ijk->ik', a)", a=r(2, 3, 4))
case("err_einsum_sizes", "torch.einsum('ij,jk->ik', a, b)", a=r(3, 4), b=r(5, 2))
case("err_einsum_operands", "torch.einsum('ij,jk->ik', a)", a=r(3, 4))
fcase("kron_2d", "torch.kron(a, b)", a=r(2, 3), b=r(2, 2))
case("kron_mixed_rank", "torch.kron(a, b)", a=ints(1, 5, 2), b=ints(1, 5, 2, 2))
fcase("cross_f32", "torch.linalg.cross(a, b)", a=r(4, 3), b=r(4, 3))
case("cross_dim0_broadcast", "torch.linalg.cross(a, b, dim=0)", a=r(3, 4), b=r(3, 1))
case("err_cross_size", "torch.linalg.cross(a, b)", a=r(4, 2), b=r(4, 2))
fcase("matrix_power_3", "torch.linalg.matrix_power(a, 3)", a=r(3, 3))
case("matrix_power_0_batched", "torch.linalg.matrix_power(a, 0)", a=r(2, 3, 3))
case("matrix_power_5", "torch.linalg.matrix_power(a, 5)", a=r(2, 2))
fcase("multi_dot_vectors", "torch.linalg.multi_dot([a, b, c])", a=r(3), b=r(3, 4), c=r(4))
case("multi_dot_matrices", "torch.linalg.multi_dot([a, b, c, d])", a=r(2, 3), b=r(3, 4), c=r(4, 2), d=r(2, 5))
fcase("cdist_p2", "torch.cdist(a, b)", a=r(3, 4), b=r(5, 4))
case("cdist_p1_batched", "torch.cdist(a, b, p=1.0)", a=r(2, 3, 4), b=r(2, 2, 4))

# creation
case("logspace_base10", "torch.logspace(0, 3, 4)")
case("logspace_base2", "torch.logspace(-2, 2, 5, base=2.0)")
case("logspace_f64", "torch.logspace(0.5, 1.5, 6, dtype=torch.float64)")
case("tril_indices_3_4", "torch.tril_indices(3, 4)")
case("tril_indices_offset", "torch.tril_indices(4, 3, -1)")
case("triu_indices_3_3_1", "torch.triu_indices(3, 3, 1)")


# pointwise, second batch
fcase("fmax_f32", "torch.fmax(a, b)", a=r(3, 4), b=r(4))
case("fmax_nan", "torch.fmax(a, b)", a=vals([NAN, 1.0, NAN, 2.0, -INF]), b=vals([0.0, NAN, NAN, 2.0, 1.0]))
fcase("fmin_f32", "torch.fmin(a, b)", a=r(3, 4), b=r(3, 4))
case("fmin_nan", "torch.fmin(a, b)", a=vals([NAN, 1.0, NAN, 2.0, INF]), b=vals([0.0, NAN, NAN, 2.0, 1.0]))
case("signbit_f32", "torch.signbit(a)", a=vals([-1.0, -0.0, 0.0, 2.0, -INF, INF]))
case("signbit_i64", "torch.signbit(a)", a=ints(-5, 5, 6))
fcase("xlog1py_f32", "torch.special.xlog1py(a, b)", a=r(3, 4), b=pos(3, 4))
case("xlog1py_special", "torch.special.xlog1py(a, b)", a=vals([0.0, 0.0, 1.0, 0.0]), b=vals([-1.0, NAN, -1.0, 3.0]))
fcase("entr_f32", "torch.special.entr(a)", a=pos(3, 4))
case("entr_special", "torch.special.entr(a)", a=vals([0.0, -1.0, 1.0, NAN, INF, 0.5]))

# losses, second batch
fcase("cosine_embedding_loss_mean", "F.cosine_embedding_loss(a, b, y, margin=0.2)", a=r(4, 5), b=r(4, 5),
      y=vals([1.0, -1.0, 1.0, -1.0]))
case("cosine_embedding_loss_none_1d", "F.cosine_embedding_loss(a, b, y, reduction='none')", a=r(5), b=r(5),
     y=vals(-1.0, shape=[]))
fcase("triplet_margin_loss_mean", "F.triplet_margin_loss(a, b, c)", a=r(4, 5), b=r(4, 5), c=r(4, 5))
case("triplet_margin_loss_swap_p1", "F.triplet_margin_loss(a, b, c, margin=0.5, p=1, swap=True, reduction='sum')",
     a=r(4, 5), b=r(4, 5), c=r(4, 5))
fcase("multilabel_soft_margin_loss_mean", "F.multilabel_soft_margin_loss(a, y)", a=r(3, 5),
      y=vals([[1.0, 0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0, 0.0]]))
case("multilabel_soft_margin_loss_weight", "F.multilabel_soft_margin_loss(a, y, weight=z, reduction='none')",
     a=r(3, 5), y=uni(3, 5), z=pos(5))

# assembling and splitting
fcase("diff_1", "torch.diff(a)", a=r(3, 5))
case("diff_2_dim0", "torch.diff(a, n=2, dim=0)", a=r(4, 3))
fcase("diff_prepend_append", "torch.diff(a, dim=1, prepend=b, append=c)", a=r(2, 3), b=r(2, 1), c=r(2, 2))
case("diff_bool", "torch.diff(a)", a=bools(6))
case("diff_i64", "torch.diff(a)", a=ints(-9, 9, 6))
fcase("block_diag_mixed", "torch.block_diag(a, b, c)", a=r(2, 2), b=r(3), c=r(2, 1))
case("block_diag_i64", "torch.block_diag(a, b)", a=ints(0, 9, 1, 2), b=ints(0, 9, 2, 2))
case("cartesian_prod_2", "torch.cartesian_prod(a, b)", a=r(3), b=r(2))
case("cartesian_prod_3_i64", "torch.cartesian_prod(a, b, c)", a=ints(0, 5, 2), b=ints(0, 5, 2), c=ints(0, 5, 3))
case("broadcast_tensors_3", "torch.broadcast_tensors(a, b, c)", a=r(3, 1), b=r(4), c=r(2, 1, 1))
case("err_broadcast_tensors", "torch.broadcast_tensors(a, b)", a=r(3), b=r(4))
case("tensor_split_sections", "torch.tensor_split(a, 3, dim=1)", a=r(2, 7))
case("tensor_split_indices", "torch.tensor_split(a, [1, 4, 10], dim=0)", a=r(6, 2))
case("hsplit_2d", "torch.hsplit(a, 2)", a=r(3, 4))
case("vsplit_2d", "torch.vsplit(a, 3)", a=r(3, 4))
case("err_hsplit_uneven", "torch.hsplit(a, 3)", a=r(3, 4))
fcase("slice_scatter_step", "torch.slice_scatter(a, b, dim=1, start=1, step=2)", a=r(3, 6), b=r(3, 3))
case("slice_scatter_dim0", "torch.slice_scatter(a, b, start=2, end=4)", a=r(5, 2), b=r(2, 2))
fcase("select_scatter_dim1", "torch.select_scatter(a, b, 1, -1)", a=r(3, 4), b=r(3))

# normalization, pooling, resampling
fcase("group_norm_affine", "F.group_norm(a, 2, w, b)", a=r(2, 4, 3), w=r(4), b=r(4))
case("group_norm_plain_4d", "F.group_norm(a, 3, eps=1e-3)", a=r(2, 6, 2, 2))
case("err_group_norm_groups", "F.group_norm(a, 3)", a=r(2, 4, 3))
fcase("instance_norm_affine", "F.instance_norm(a, weight=w, bias=b)", a=r(2, 3, 5), w=r(3), b=r(3))
case("instance_norm_plain_4d", "F.instance_norm(a)", a=r(2, 3, 2, 3))
# Running statistics are not differentiated: they are `y` and `z` (PyTorch refuses their gradient).
fcase("batch_norm_inference", "F.batch_norm(a, y, z, w, b, training=False)", a=r(4, 3, 2), y=r(3), z=pos(3), w=r(3),
      b=r(3))
fcase("batch_norm_training_no_stats", "F.batch_norm(a, None, None, w, b, training=True, eps=1e-3)", a=r(4, 3, 2),
      w=r(3), b=r(3))
case("batch_norm_training_2d", "F.batch_norm(a, None, None, training=True)", a=r(5, 3))
fcase("max_pool2d_k2", "F.max_pool2d(a, 2)", a=r(2, 2, 4, 6))
fcase("max_pool2d_k3_s2_p1", "F.max_pool2d(a, 3, stride=2, padding=1)", a=r(1, 2, 5, 5))
case("max_pool2d_nan", "F.max_pool2d(a, 2)", a=vals([[[1.0, NAN], [3.0, 2.0]]]))
case("err_max_pool2d_pad", "F.max_pool2d(a, 2, padding=2)", a=r(1, 2, 5, 5))
fcase("avg_pool2d_k2", "F.avg_pool2d(a, 2)", a=r(2, 2, 4, 6))
fcase("avg_pool2d_k3_p1_exclude", "F.avg_pool2d(a, 3, stride=2, padding=1, count_include_pad=False)", a=r(1, 2, 5, 5))
case("avg_pool2d_k3_p1_include", "F.avg_pool2d(a, 3, stride=2, padding=1)", a=r(1, 2, 5, 5))
fcase("max_pool1d_k3_s2", "F.max_pool1d(a, 3, stride=2)", a=r(2, 3, 9))
fcase("avg_pool1d_k2", "F.avg_pool1d(a, 2)", a=r(2, 3, 8))
fcase("adaptive_avg_pool2d_uneven", "F.adaptive_avg_pool2d(a, (3, 2))", a=r(2, 2, 5, 7))
case("adaptive_avg_pool2d_global", "F.adaptive_avg_pool2d(a, 1)", a=r(2, 3, 4, 4))
case("adaptive_avg_pool1d_3", "F.adaptive_avg_pool1d(a, 3)", a=r(2, 3, 8))
fcase("interpolate_nearest_2d", "F.interpolate(a, size=(5, 3), mode='nearest')", a=r(1, 2, 3, 4))
case("interpolate_nearest_exact_1d", "F.interpolate(a, size=7, mode='nearest-exact')", a=r(1, 2, 4))
fcase("interpolate_bilinear", "F.interpolate(a, size=(5, 7), mode='bilinear')", a=r(1, 2, 3, 4))
fcase("interpolate_bilinear_align", "F.interpolate(a, size=(2, 5), mode='bilinear', align_corners=True)",
      a=r(2, 1, 4, 3))
case("interpolate_linear_1d_down", "F.interpolate(a, size=3, mode='linear')", a=r(1, 2, 8))
fcase("pixel_shuffle_2", "F.pixel_shuffle(a, 2)", a=r(1, 8, 2, 3))
case("pixel_unshuffle_2", "F.pixel_unshuffle(a, 2)", a=r(1, 2, 4, 6))
case("err_pixel_shuffle_channels", "F.pixel_shuffle(a, 2)", a=r(1, 6, 2, 2))


# statistics, integration, searching; im2col
fcase("cov_2d", "torch.cov(a)", a=r(3, 6))
case("cov_corr0", "torch.cov(a, correction=0)", a=r(2, 5))
case("cov_1d_i64", "torch.cov(a)", a=ints(-5, 5, 6))
case("cov_one_observation", "torch.cov(a)", a=r(2, 1))
fcase("corrcoef_2d", "torch.corrcoef(a)", a=r(3, 6))
case("corrcoef_constant_row", "torch.corrcoef(a)", a=vals([[1.0, 2.0, 4.0], [0.0, 0.0, 0.0]]))
fcase("trapezoid_dx", "torch.trapezoid(a, dx=0.5)", a=r(3, 5))
case("trapezoid_dim0", "torch.trapezoid(a, dim=0)", a=r(4, 3))
fcase("cumulative_trapezoid_dx", "torch.cumulative_trapezoid(a, dx=2.0)", a=r(3, 5))
case("bucketize_left", "torch.bucketize(a, b)", a=vals([NAN, 2.0, 0.0, 5.0, INF, -INF, 1.0, 3.0]),
     b=vals([1.0, 2.0, 3.0]))
case("bucketize_right", "torch.bucketize(a, b, right=True)", a=vals([NAN, 2.0, 0.0, 5.0, INF, -INF, 1.0, 3.0]),
     b=vals([1.0, 2.0, 3.0]))
case("bucketize_i64", "torch.bucketize(a, b)", a=ints(-5, 10, 3, 4), b=vals([0, 2, 4, 6], "i64"))
case("searchsorted_2d", "torch.searchsorted(a, b)", a=vals([[1.0, 3.0, 5.0], [2.0, 4.0, 6.0]]),
     b=vals([[3.0, 6.0], [1.0, 7.0]]))
case("searchsorted_1d_right", "torch.searchsorted(a, b, right=True)", a=vals([1.0, 2.0, 2.0, 3.0]), b=r(2, 3))
fcase("unfold_k2", "F.unfold(a, 2)", a=r(2, 3, 4, 5))
fcase("unfold_k3_d2_p1_s2", "F.unfold(a, 3, dilation=2, padding=1, stride=2)", a=r(1, 2, 6, 7))

# convolutions (im2col + matrix product)
fcase("conv2d_basic", "F.conv2d(a, w, b)", a=r(2, 3, 6, 7), w=r(4, 3, 3, 3), b=r(4))
fcase("conv2d_stride_pad_dil", "F.conv2d(a, w, None, stride=2, padding=1, dilation=2)", a=r(1, 2, 9, 8),
      w=r(3, 2, 3, 2))
fcase("conv2d_groups", "F.conv2d(a, w, b, padding=1, groups=2)", a=r(2, 4, 5, 5), w=r(6, 2, 3, 3), b=r(6))
case("conv2d_depthwise", "F.conv2d(a, w, None, stride=(1, 2), padding=(2, 1), groups=3)", a=r(1, 3, 5, 6),
     w=r(3, 1, 3, 3))
case("conv2d_bf16", "F.conv2d(a, w, b, padding=1)", a=r(1, 2, 5, 5, dt="bf16"), w=r(3, 2, 3, 3, dt="bf16"),
     b=r(3, dt="bf16"))
fcase("conv1d_basic", "F.conv1d(a, w, b, stride=2, padding=1)", a=r(2, 3, 10), w=r(4, 3, 3), b=r(4))
fcase("conv_transpose2d_basic", "F.conv_transpose2d(a, w, b, stride=2, padding=1, output_padding=1)",
      a=r(2, 3, 4, 5), w=r(3, 2, 3, 3), b=r(2))
case("conv_transpose2d_groups_dil", "F.conv_transpose2d(a, w, None, groups=2, dilation=2)", a=r(1, 4, 3, 3),
     w=r(4, 3, 2, 2))
fcase("conv_transpose1d_stride", "F.conv_transpose1d(a, w, None, stride=3)", a=r(2, 2, 5), w=r(2, 3, 4))
case("err_conv2d_channels", "F.conv2d(a, w)", a=r(1, 3, 5, 5), w=r(2, 4, 3, 3))


# ------------------------------------------------------------- the convolution template (conv3d,
# 3-d transposes, channels-last views, dilation and groups in every rank). Forward and gradients:
# the gradients are the template's data- and weight-gradient forms.
fcase("conv3d_basic", "F.conv3d(a, w, b)", a=r(2, 3, 4, 5, 4), w=r(4, 3, 3, 2, 3), b=r(4))
fcase("conv3d_stride_pad_dil_groups", "F.conv3d(a, w, None, stride=(2, 1, 2), padding=(1, 2, 0), dilation=(1, 2, 2), groups=2)",
      a=r(1, 4, 5, 4, 6), w=r(2, 2, 2, 2, 2))
case("conv3d_bf16", "F.conv3d(a, w, b, padding=1)", a=r(1, 2, 3, 4, 3, dt="bf16"), w=r(3, 2, 3, 3, 3, dt="bf16"),
     b=r(3, dt="bf16"))
fcase("conv3d_channels_last", "F.conv3d(a.permute(0, 4, 1, 2, 3), w, b, padding=1)", a=r(2, 3, 4, 3, 4), w=r(2, 4, 3, 3, 3),
      b=r(2))
fcase("conv2d_channels_last", "F.conv2d(a.permute(0, 3, 1, 2), w, b, stride=2, padding=1)", a=r(2, 7, 6, 4),
      w=r(5, 4, 3, 3), b=r(5))
fcase("conv2d_channels_last_groups_dil", "F.conv2d(a.permute(0, 3, 1, 2), w, None, padding=2, dilation=2, groups=3)",
      a=r(1, 6, 7, 6), w=r(3, 2, 3, 3))
fcase("conv2d_1x1_stride2", "F.conv2d(a, w, stride=2)", a=r(2, 8, 4, 4), w=r(6, 8, 1, 1))
# 1x1 convolutions of channels-last views: one product over the batch in that layout (the
# forward, strided too, the transposed convolution and their gradients).
fcase("conv2d_1x1_channels_last", "F.conv2d(a.permute(0, 3, 1, 2), w, b)", a=r(2, 3, 4, 5), w=r(6, 5, 1, 1), b=r(6))
fcase("conv2d_1x1_stride2_channels_last", "F.conv2d(a.permute(0, 3, 1, 2), w, stride=2)", a=r(2, 5, 4, 6),
      w=r(3, 6, 1, 1))
fcase("conv3d_1x1_stride_channels_last", "F.conv3d(a.permute(0, 4, 1, 2, 3), w, stride=(1, 2, 3))",
      a=r(1, 2, 5, 7, 3), w=r(4, 3, 1, 1, 1))
fcase("conv_transpose2d_1x1_channels_last", "F.conv_transpose2d(a.permute(0, 3, 1, 2), w, stride=2, output_padding=1)",
      a=r(2, 3, 2, 5), w=r(5, 4, 1, 1))
fcase("conv1d_dil_groups", "F.conv1d(a, w, b, padding=3, dilation=3, groups=2)", a=r(2, 4, 9), w=r(6, 2, 3), b=r(6))
fcase("conv1d_channels_last", "F.conv1d(a.permute(0, 2, 1), w, None, stride=2)", a=r(2, 9, 3), w=r(4, 3, 3))
fcase("conv_transpose3d_basic", "F.conv_transpose3d(a, w, b, stride=2, padding=1, output_padding=1)",
      a=r(1, 2, 3, 2, 3), w=r(2, 3, 3, 3, 2), b=r(3))
fcase("conv_transpose2d_outpad_dil", "F.conv_transpose2d(a, w, None, stride=2, dilation=3, output_padding=2)",
      a=r(1, 2, 3, 3), w=r(2, 2, 2, 2))
case("err_conv3d_rank", "F.conv3d(a, w)", a=r(1, 3, 5, 5), w=r(2, 3, 3, 3, 3))
case("err_conv3d_kernel_too_large", "F.conv3d(a, w)", a=r(1, 1, 2, 5, 5), w=r(1, 1, 3, 3, 3))

# embedding bags, local response norm, rrelu (evaluation), matrix norms
fcase("embedding_bag_mean_offsets", "F.embedding_bag(idx, w, o, mode='mean')", idx=vals([1, 2, 4, 4, 3], "i64"), w=r(5, 3),
      o=vals([0, 2, 2], "i64"))
case("embedding_bag_sum_padding", "F.embedding_bag(idx, w, o, mode='sum', padding_idx=4)",
     idx=vals([1, 2, 4, 4, 3], "i64"), w=r(5, 3), o=vals([0, 2, 2], "i64"))
case("embedding_bag_include_last_offset", "F.embedding_bag(idx, w, o, mode='sum', include_last_offset=True)",
     idx=vals([1, 2, 4, 4, 3], "i64"), w=r(5, 3), o=vals([0, 2, 2, 5], "i64"))
fcase("embedding_bag_per_sample_weights", "F.embedding_bag(idx, w, o, mode='sum', per_sample_weights=b)",
      idx=vals([0, 3, 3, 1], "i64"), w=r(4, 2), o=vals([0, 1], "i64"), b=r(4))
fcase("embedding_bag_2d_max", "F.embedding_bag(idx, w, mode='max')", idx=ints(0, 6, 3, 4), w=r(6, 3))
case("embedding_bag_2d_mean", "F.embedding_bag(idx, w)", idx=ints(0, 6, 3, 4), w=r(6, 3))
fcase("local_response_norm_3d", "F.local_response_norm(a, 3)", a=r(2, 5, 4))
case("local_response_norm_4d", "F.local_response_norm(a, 2, alpha=0.1, beta=0.5, k=2.0)", a=r(2, 4, 3, 3))
fcase("rrelu_eval", "F.rrelu(a, 0.1, 0.3, training=False)", a=r(3, 4))
fcase("matrix_norm_ord1", "torch.linalg.matrix_norm(a, ord=1)", a=r(2, 3, 4))
case("matrix_norm_ord_neg_inf_keepdim", "torch.linalg.matrix_norm(a, ord=-float('inf'), keepdim=True)", a=r(3, 4))
case("matrix_norm_ord_inf", "torch.linalg.matrix_norm(a, ord=float('inf'))", a=r(3, 4))
case("matrix_norm_ord_neg1", "torch.linalg.matrix_norm(a, ord=-1)", a=r(3, 4))


# 3-d pooling, adaptive max pooling
fcase("max_pool3d_k2", "F.max_pool3d(a, 2)", a=r(1, 2, 4, 4, 4))
case("max_pool3d_k3_s2_p1", "F.max_pool3d(a, 3, stride=2, padding=1)", a=r(1, 1, 5, 4, 5))
fcase("avg_pool3d_k2_s1", "F.avg_pool3d(a, 2, stride=1)", a=r(1, 2, 3, 3, 3))
fcase("adaptive_max_pool2d_uneven", "F.adaptive_max_pool2d(a, (3, 2))", a=r(2, 2, 5, 7))
case("adaptive_max_pool1d_4", "F.adaptive_max_pool1d(a, 4)", a=r(2, 3, 9))
case("adaptive_max_pool2d_nan", "F.adaptive_max_pool2d(a, 1)", a=vals([[[1.0, NAN], [3.0, 2.0]]]))


# col2im
fcase("fold_k2", "F.fold(a, (3, 4), 2)", a=r(2, 12, 6))
fcase("fold_k3_d2_p1_s2", "F.fold(a, (6, 7), 3, dilation=2, padding=1, stride=2)", a=r(1, 18, 6))
case("err_fold_blocks", "F.fold(a, (3, 4), 2)", a=r(2, 12, 5))


# more interpolation modes
fcase("interpolate_bicubic_up", "F.interpolate(a, size=(5, 7), mode='bicubic')", a=r(1, 2, 3, 4))
case("interpolate_bicubic_down_align", "F.interpolate(a, size=(3, 2), mode='bicubic', align_corners=True)",
     a=r(2, 1, 6, 5))
fcase("interpolate_trilinear", "F.interpolate(a, size=(3, 4, 5), mode='trilinear')", a=r(1, 2, 2, 3, 4))
case("interpolate_nearest_3d", "F.interpolate(a, size=(4, 2, 3), mode='nearest')", a=r(1, 1, 2, 3, 3))
case("interpolate_area", "F.interpolate(a, size=(2, 3), mode='area')", a=r(1, 2, 5, 7))


# pooling with ceil_mode and dilation
fcase("max_pool2d_ceil_dilation", "F.max_pool2d(a, 3, stride=2, padding=1, dilation=2, ceil_mode=True)", a=r(1, 2, 8, 9))
case("max_pool1d_ceil", "F.max_pool1d(a, 2, stride=2, ceil_mode=True)", a=r(2, 3, 7))
fcase("avg_pool2d_ceil_include", "F.avg_pool2d(a, 3, stride=2, padding=1, ceil_mode=True)", a=r(1, 2, 6, 6))
case("avg_pool2d_ceil_exclude", "F.avg_pool2d(a, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)",
     a=r(1, 2, 6, 6))
case("avg_pool1d_ceil", "F.avg_pool1d(a, 2, stride=2, ceil_mode=True)", a=r(2, 3, 7))
case("max_pool3d_dilation", "F.max_pool3d(a, 2, stride=1, dilation=2)", a=r(1, 1, 5, 5, 5))
# Ties (small integers): the gradient goes to the first maximum in window order, as
# max_pool2d_with_indices_backward gives it; channels-last and ceil-mode overhang too.
fcase("max_pool2d_ties", "F.max_pool2d(a, 3, stride=2, padding=1)", a=r(2, 2, 7, 6, dist="int:-1:2"))
fcase("max_pool2d_ties_channels_last", "F.max_pool2d(a.permute(0, 3, 1, 2), 3, stride=2, padding=1).permute(0, 2, 3, 1)",
      a=r(2, 7, 6, 3, dist="int:-1:2"))
fcase("max_pool1d_ties_ceil", "F.max_pool1d(a, 3, stride=2, ceil_mode=True)", a=r(2, 3, 8, dist="int:0:2"))
fcase("max_pool2d_signed_zeros", "F.max_pool2d(a, 2)", a=vals([[[-0.0, -0.0], [-0.0, -0.0]], [[0.0, -0.0], [-0.0, 0.0]]]))


# sampling grids
fcase("affine_grid_align", "F.affine_grid(a, (2, 3, 4, 5), align_corners=True)", a=r(2, 2, 3))
fcase("affine_grid_no_align", "F.affine_grid(a, (1, 1, 3, 2), align_corners=False)", a=r(1, 2, 3))
fcase("grid_sample_bilinear_zeros", "F.grid_sample(a, b * 0.8, align_corners=False)", a=r(2, 3, 4, 5), b=r(2, 3, 2, 2))
fcase("grid_sample_bilinear_border_align", "F.grid_sample(a, b, padding_mode='border', align_corners=True)",
      a=r(1, 2, 3, 4), b=r(1, 4, 3, 2))
case("grid_sample_nearest", "F.grid_sample(a, b * 0.8, mode='nearest', align_corners=False)", a=r(2, 3, 4, 5),
     b=r(2, 3, 2, 2))


# histograms
case("histc_range", "torch.histc(a, bins=5, min=0, max=5)", a=vals([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 2.5, -1.0, 6.0, NAN]))
case("histc_data_range", "torch.histc(a, bins=7)", a=r(50))
case("histc_one_value", "torch.histc(a, bins=4)", a=vals([2.0, 2.0]))
case("histc_f64", "torch.histc(a, bins=10, min=-2, max=2)", a=r(40, dt="f64"))
case("err_histc_int", "torch.histc(a)", a=ints(0, 5, 4))


# fmod, exact from remainder
case("fmod_special", "torch.fmod(a, b)", a=vals([1e30, -1e-30, 7.5, -7.5, 5.0, INF, 3.0, -0.0, 2.0, 1e20, NAN, -3.0]),
     b=vals([3.0, 1.0, 2.0, 2.0, 0.0, 2.0, INF, 1.0, -0.7, -3.3, 1.0, -INF]))
fcase("fmod_random", "torch.fmod(a, b)", a=r(3, 4), b=pos(3, 4))
case("fmod_i64", "torch.fmod(a, b)", a=vals([-7, 7, -7, 7, 0, 5, -9223372036854775807], "i64"),
     b=vals([2, -2, -2, 2, 3, 9, 2], "i64"))
case("fmod_scalar_f64", "torch.fmod(a, 1.5)", a=r(8, dt="f64"))
case("err_fmod_int_zero", "torch.fmod(a, b)", a=vals([1, 2], "i64"), b=vals([1, 0], "i64"))


# scans as prefix reductions
fcase("cummax_dim1", "torch.cummax(a, 1)", grad=False, a=r(3, 6))
case("cummax_ties_nan", "torch.cummax(a, 0)", a=vals([1.0, 3.0, 3.0, 2.0, NAN, 5.0, NAN, 0.0]))
case("cummin_i64", "torch.cummin(a, -1)", a=vals([[3, 1, 1, 2], [0, 5, -2, -2]], "i64"))
case("cummin_dim0", "torch.cummin(a, 0)", a=r(5, 3))
gcase_values = "(lambda a: torch.autograd.grad((torch.cummax(a, 1)[0] * torch.linspace(-1, 2, 18).reshape(3, 6)).sum(), [a]))(a.detach().requires_grad_())"
case("grad_cummax_values", gcase_values, a=r(3, 6))
fcase("logcumsumexp_dim1", "torch.logcumsumexp(a, 1)", a=r(3, 6))
case("logcumsumexp_special", "torch.logcumsumexp(a, 0)", a=vals([-INF, 0.0, 1000.0, -1000.0, INF, NAN]))
case("logcumsumexp_bf16", "torch.logcumsumexp(a, -1)", a=r(2, 8, dt="bf16"))
case("cumprod_dim1", "torch.cumprod(a, 1)", a=r(3, 6))
case("cumprod_i32", "torch.cumprod(a, 0)", a=ints(-3, 4, 6, dt="i32"))
case("cumprod_zeros", "torch.cumprod(a, 0)", a=vals([2.0, 0.0, 3.0, NAN, -1.0]))


# gradients of forward cases above that had none
for name in ["float_power_f32", "deg2rad_f32", "rad2deg_f32", "fliplr_2d", "dstack_2d", "column_stack_1d",
             "cartesian_prod_2", "pixel_unshuffle_2", "adaptive_max_pool1d_4", "adaptive_avg_pool1d_3", "vdot_f64",
             "rot90_k_neg1_dims", "atleast_3d_2d", "logcumsumexp_special"]:
    gcase(name)

# ------------------------------------------------------- inverse trigonometry, erfinv and bit ops
# Primitives of their own (no accurate composition of the others). Edge values: signed zeros,
# ±1 (where asin, acos and erfinv meet their poles), just inside and outside [-1, 1], the
# switch points of the atan reduction (tan(pi/8), tan(3pi/8)), infinities, NaN.
UNIT = [-0.99, -0.7, -0.3, -0.05, 0.0, 0.1, 0.45, 0.8, 0.97, 0.5, -0.5, 0.25]
UNIT_EDGE = [0.0, -0.0, 1.0, -1.0, 1.0000001, -2.0, INF, -INF, NAN, 1e-30, 0.99999994, -0.99999994]
fcase("atan_f32", "torch.atan(a)", a=r(4, 6))
case("atan_f64", "torch.atan(a)", a=r(3, 5, dt="f64"))
case("atan_bf16", "torch.atan(a)", a=r(3, 5, dt="bf16"))
case("atan_f16", "torch.atan(a)", a=r(3, 5, dt="f16"))
case("atan_i64", "torch.atan(a)", a=ints(-5, 5, 8))
case("atan_special", "torch.atan(a)", a=vals([0.0, -0.0, 1e-30, 1.0, -1.0, 1e30, INF, -INF, NAN, 0.41421357,
                                              -0.41421354, 2.4142137, 2.4142134, 3e38]))
case("arctan_alias", "torch.arctan(a)", a=r(5))
for op in ["asin", "acos"]:
    fcase(f"{op}_f32", f"torch.{op}(a)", a=vals(UNIT))
    case(f"{op}_f64", f"torch.{op}(a)", a=vals(UNIT, "f64"))
    case(f"{op}_bf16", f"torch.{op}(a)", a=vals(UNIT, "bf16"))
    case(f"{op}_i32", f"torch.{op}(a)", a=ints(-1, 2, 6, dt="i32"))
    case(f"{op}_special", f"torch.{op}(a)", a=vals(UNIT_EDGE))
    case(f"{op}_random", f"torch.{op}(a)", a=uni(3, 7))
case("arcsin_alias", "torch.arcsin(a)", a=uni(5))
case("arccos_alias", "torch.arccos(a)", a=uni(5))
fcase("erfinv_f32", "torch.erfinv(a)", a=vals(UNIT))
case("erfinv_f64", "torch.erfinv(a)", a=vals(UNIT + [0.999999, -0.9999999999, 1e-300], "f64"))
case("erfinv_bf16", "torch.erfinv(a)", a=vals(UNIT, "bf16"))
case("erfinv_i64", "torch.erfinv(a)", a=ints(-1, 2, 6))
case("erfinv_special", "torch.erfinv(a)", a=vals(UNIT_EDGE + [0.998, -0.9981, 0.9999]))
case("erfinv_random", "torch.erfinv(a)", a=uni(4, 8))
fcase("atan2_f32", "torch.atan2(a, b)", a=r(3, 4), b=r(3, 4))
fcase("atan2_broadcast", "torch.atan2(a, b)", a=r(3, 1), b=r(4))
case("atan2_f64", "torch.atan2(a, b)", a=r(3, 4, dt="f64"), b=r(4, dt="f64"))
case("atan2_bf16", "torch.atan2(a, b)", a=r(3, 4, dt="bf16"), b=r(3, 4, dt="bf16"))
case("atan2_i64", "torch.atan2(a, b)", a=ints(-3, 4, 8), b=ints(-3, 4, 8))
case("atan2_special", "torch.atan2(a, b)",
     a=vals([0.0, -0.0, 0.0, -0.0, 1.0, -1.0, INF, -INF, INF, 1.0, NAN, 0.0, 2.0, -INF, 1e-30, 5.0]),
     b=vals([0.0, 0.0, -0.0, -0.0, -INF, INF, INF, -INF, 2.0, NAN, 1.0, -3.0, 2.0, -1.0, -1e30, -0.0]))
case("atan2_mixed_f32_i64", "torch.atan2(a, b)", a=r(6), b=ints(-3, 4, 6))
case("arctan2_alias", "torch.arctan2(a, b)", a=r(5), b=r(5))
IA2 = [12, -7, 5, 1, -1, 0, 255, -128]
IB2 = [10, 3, 31, 32, -1, 7, 15, 127]
case("bitwise_and_i64", "torch.bitwise_and(a, b)", a=ints(-100, 100, 12), b=ints(-100, 100, 12))
case("bitwise_and_values_i32", "a & b", a=vals(IA2, "i32"), b=vals(IB2, "i32"))
case("bitwise_and_bool", "a & b", a=bools(3, 4), b=bools(3, 4))
case("bitwise_and_scalar_i32", "a & 6", a=ints(-10, 10, 8, dt="i32"))
case("bitwise_and_rscalar", "5 & a", a=ints(-10, 10, 8))
case("bitwise_and_bool_int", "torch.bitwise_and(a, b)", a=bools(6), b=ints(0, 4, 6, dt="i32"))
case("bitwise_or_u8", "a | b", a=ints(0, 256, 8, dt="u8"), b=ints(0, 256, 8, dt="u8"))
case("bitwise_or_i16", "torch.bitwise_or(a.short(), b.short())", a=ints(-300, 300, 8, dt="i32"),
     b=ints(-300, 300, 8, dt="i32"))
case("bitwise_or_bool", "a | b", a=bools(6), b=bools(6))
case("bitwise_or_broadcast", "a | b", a=ints(0, 64, 3, 1), b=ints(0, 64, 4))
case("bitwise_xor_i8", "a ^ b", a=ints(-128, 128, 8, dt="i8"), b=ints(-128, 128, 8, dt="i8"))
case("bitwise_xor_bool", "torch.bitwise_xor(a, b)", a=bools(6), b=bools(6))
case("bitwise_xor_scalar_i64", "a ^ -1", a=ints(-50, 50, 6))
case("bitwise_not_i32", "~a", a=vals(IA2, "i32"))
case("bitwise_not_i64", "torch.bitwise_not(a)", a=ints(-100, 100, 8))
case("bitwise_not_u8", "torch.bitwise_not(a)", a=ints(0, 256, 8, dt="u8"))
case("bitwise_not_bool", "~a", a=bools(6))
case("bitwise_left_shift_i64", "a << b", a=ints(-1000, 1000, 10), b=ints(0, 12, 10))
# out of range: a negative amount or the width and more give 0 (PyTorch's CPU kernels)
case("bitwise_left_shift_large_i64", "torch.bitwise_left_shift(a, b)",
     a=vals([1, -1, 5, 3, 7, 1, -5, 123], "i64"), b=vals([63, 63, 64, 100, -1, 62, -3, 0], "i64"))
case("bitwise_left_shift_i32", "a << b", a=vals([1, 3, -1, 1000000, 7, 5], "i32"),
     b=vals([31, 31, 32, 20, -2, 1], "i32"))
case("bitwise_left_shift_i8", "a << b", a=vals([1, -1, 100, 3, 1], "i8"), b=vals([7, 8, 2, 127, -128], "i8"))
case("bitwise_left_shift_u8", "a << b", a=vals([1, 255, 100, 3], "u8"), b=vals([7, 8, 2, 200], "u8"))
case("bitwise_left_shift_scalar", "a << 3", a=ints(-10, 10, 6, dt="i32"))
case("bitwise_left_shift_rscalar", "1 << a", a=ints(0, 40, 6))
case("bitwise_right_shift_i64", "a >> b", a=ints(-1000, 1000, 10), b=ints(0, 12, 10))
# out of range: a negative amount or 63 and more shift by 63 (the sign fill)
case("bitwise_right_shift_negative", "torch.bitwise_right_shift(a, b)",
     a=vals([-7, -1, -1000, 7, -128, 5, -9], "i64"), b=vals([1, 63, 64, 100, -1, -5, 62], "i64"))
case("bitwise_right_shift_i16", "a.short() >> b.short()", a=vals([-300, 300, -1, 32767, -32768], "i32"),
     b=vals([3, 15, 16, 14, 40], "i32"))
case("bitwise_right_shift_u8", "a >> b", a=vals([249, 200, 255, 3], "u8"), b=vals([1, 8, 7, 200], "u8"))
case("bitwise_right_shift_scalar", "torch.bitwise_right_shift(a, 2)", a=ints(-20, 20, 8, dt="i32"))
case("err_bitwise_and_f32", "a & b", a=r(3), b=r(3))
case("err_bitwise_xor_float_scalar", "a ^ 1.5", a=ints(0, 5, 4))
case("err_bitwise_left_shift_bool", "a << b", a=bools(4), b=bools(4))

# ------------------------------------------------------------ data-dependent output shapes
# Computed on the host (graph breaks inside compiled functions): nonzero, argwhere, masked_select,
# unique, unique_consecutive.
ZN = [[0.0, 1.5, 0.0, -2.0], [NAN, 0.0, 0.0, 3.0], [-0.0, 0.0, 4.0, 0.0]]
case("nonzero_f32", "torch.nonzero(a)", a=vals(ZN))
case("nonzero_bool_3d", "torch.nonzero(a)", a=bools(2, 3, 4))
case("nonzero_i64", "torch.nonzero(a)", a=ints(-2, 3, 12))
case("nonzero_0d", "torch.nonzero(a)", a=vals(3.0))
case("nonzero_0d_zero", "torch.nonzero(a)", a=vals(0, "i64"))
case("nonzero_empty", "torch.nonzero(a)", a=r(0, 3))
case("nonzero_all_zero", "torch.nonzero(a)", a=vals([0.0, 0.0, 0.0]))
case("nonzero_as_tuple", "torch.nonzero(a, as_tuple=True)", a=vals(ZN))
case("nonzero_transposed", "torch.nonzero(a.t())", a=vals(ZN))
case("argwhere_i32", "torch.argwhere(a)", a=ints(-1, 2, 3, 4, dt="i32"))
case("masked_select_f32", "torch.masked_select(a, m)", a=r(3, 4), m=bools(3, 4))
case("masked_select_broadcast_mask", "torch.masked_select(a, m)", a=r(3, 4), m=bools(4))
case("masked_select_broadcast_both", "torch.masked_select(a, m)", a=r(3, 1), m=bools(1, 4))
case("masked_select_i64", "torch.masked_select(a, m)", a=ints(-9, 9, 2, 5), m=bools(2, 5))
case("masked_select_bf16", "torch.masked_select(a, m)", a=r(6, dt="bf16"), m=bools(6))
case("masked_select_none", "torch.masked_select(a, m)", a=r(4), m=vals([False] * 4, "bool"))
gcase("masked_select_f32")
gcase("masked_select_broadcast_both")
case("err_masked_select_int_mask", "torch.masked_select(a, m)", a=r(4), m=ints(0, 2, 4))
case("err_masked_select_shape", "torch.masked_select(a, m)", a=r(3, 4), m=bools(3))
UQ = [2.0, -1.0, NAN, 2.0, 0.0, -0.0, NAN, -1.0, 5.5, 2.0]
case("unique_i64", "torch.unique(a)", a=ints(0, 5, 20))
case("unique_f32_all", "torch.unique(a, return_inverse=True, return_counts=True)", a=vals(UQ))
case("unique_inverse_2d", "torch.unique(a, return_inverse=True)", a=ints(-3, 3, 4, 5))
case("unique_counts_bool", "torch.unique(a, return_counts=True)", a=bools(7))
case("unique_f16", "torch.unique(a)", a=vals([1.5, 0.25, 1.5, -3.0, 0.25], "f16"))
case("unique_u8", "torch.unique(a)", a=ints(0, 256, 16, dt="u8"))
case("unique_empty", "torch.unique(a, return_inverse=True, return_counts=True)", a=r(0))
case("unique_0d", "torch.unique(a, return_inverse=True, return_counts=True)", a=vals(3.0))
case("unique_consecutive_i64",
     "torch.unique_consecutive(a, return_inverse=True, return_counts=True)",
     a=vals([1, 1, 2, 2, 3, 1, 1, 2], "i64"))
case("unique_consecutive_f32", "torch.unique_consecutive(a)", a=vals([NAN, NAN, 1.0, 1.0, -0.0, 0.0, 2.0]))
case("unique_consecutive_2d", "torch.unique_consecutive(a, return_inverse=True)", a=ints(0, 2, 3, 4))

# ------------------------------------------------------------------- scatter with a reduction
# scatter_reduce / index_reduce: the Scatter primitive with sum, prod, amax, amin; mean and
# include_self=False are compositions.
def sr(name, reduce, include_self, dim=0, a=None, idx=None, b=None, grad=False):
    case(name, f"a.scatter_reduce({dim}, idx, b, '{reduce}', include_self={include_self})", a=a, idx=idx, b=b)
    if grad:
        gcase(name)


sr("scatter_reduce_sum_f32", "sum", True, 0, r(3, 5), ints(0, 3, 4, 5), r(4, 5), grad=True)
sr("scatter_reduce_sum_exclude_f32", "sum", False, 0, r(3, 5), ints(0, 3, 4, 5), r(4, 5), grad=True)
sr("scatter_reduce_prod_f32", "prod", True, 1, r(3, 4), ints(0, 4, 3, 6), r(3, 6), grad=True)
sr("scatter_reduce_prod_exclude_f32", "prod", False, 1, r(3, 4), ints(0, 4, 3, 6), r(3, 6), grad=True)
sr("scatter_reduce_prod_zeros", "prod", True, 0, vals([0.0, 2.0, -1.5, 3.0]),
   vals([0, 0, 1, 1, 2, 2, 3], "i64"), vals([1.5, 2.0, 0.0, 4.0, 0.0, 0.0, -2.0]), grad=True)
sr("scatter_reduce_mean_f32", "mean", True, 0, r(4, 3), ints(0, 4, 6, 3), r(6, 3), grad=True)
sr("scatter_reduce_mean_exclude_f32", "mean", False, 0, r(4, 3), ints(0, 4, 6, 3), r(6, 3), grad=True)
sr("scatter_reduce_mean_i64", "mean", True, 0, ints(-20, 20, 5), ints(0, 5, 8), ints(-20, 20, 8))
sr("scatter_reduce_mean_exclude_i32", "mean", False, 0, ints(-20, 20, 5, dt="i32"), ints(0, 5, 8),
   ints(-20, 20, 8, dt="i32"))
sr("scatter_reduce_amax_f32", "amax", True, 1, r(3, 5), ints(0, 5, 3, 7), r(3, 7), grad=True)
sr("scatter_reduce_amax_exclude_f32", "amax", False, 1, r(3, 5), ints(0, 5, 3, 7), r(3, 7), grad=True)
sr("scatter_reduce_amin_f32", "amin", True, 0, r(4, 2), ints(0, 4, 5, 2), r(5, 2), grad=True)
sr("scatter_reduce_amin_exclude_f64", "amin", False, 0, r(2, 2, dt="f64"), ints(0, 2, 5, 2), r(5, 2, dt="f64"),
   grad=True)
sr("scatter_reduce_amax_ties", "amax", True, 0, vals([1.0, 2.0, 0.5]), vals([0, 0, 1, 2, 2], "i64"),
   vals([1.0, -3.0, 2.0, 0.5, 0.5]), grad=True)
sr("scatter_reduce_amax_nan", "amax", True, 0, vals([1.0, NAN, 3.0, 0.0]), vals([0, 0, 1, 2, 3], "i64"),
   vals([NAN, 2.0, 5.0, 1.0, -0.0]))
sr("scatter_reduce_amin_nan_exclude", "amin", False, 0, vals([1.0, NAN, 3.0]), vals([0, 0, 1, 2], "i64"),
   vals([NAN, 2.0, 5.0, 1.0]))
sr("scatter_reduce_amax_i32", "amax", False, 0, ints(-50, 50, 6, dt="i32"), ints(0, 6, 9), ints(-50, 50, 9, dt="i32"))
sr("scatter_reduce_amin_i64", "amin", True, 0, ints(-50, 50, 6), ints(0, 6, 9), ints(-50, 50, 9))
sr("scatter_reduce_prod_i64", "prod", False, 0, ints(-5, 5, 4), ints(0, 4, 7), ints(-5, 5, 7))
sr("scatter_reduce_sum_bf16", "sum", True, 0, r(6, dt="bf16"), ints(0, 6, 10), r(10, dt="bf16"))
sr("scatter_reduce_amax_f16", "amax", False, 0, r(6, dt="f16"), ints(0, 6, 10), r(10, dt="f16"))
sr("scatter_reduce_prod_bf16", "prod", True, 0, r(6, dt="bf16"), ints(0, 6, 10), r(10, dt="bf16"))
# (no gradient case: PyTorch's own backward fails when src is larger than the index)
sr("scatter_reduce_src_larger", "amax", True, 1, r(3, 4), ints(0, 4, 2, 3), r(4, 5))
sr("err_scatter_reduce_dtype", "sum", True, 0, r(3), ints(0, 3, 2), r(2, dt="f64"))
sr("err_scatter_reduce_oob", "amax", True, 0, r(3), vals([0, 3], "i64"), r(2))
case("index_reduce_prod_f32", "a.index_reduce(0, idx, b, 'prod')", a=r(4, 3), idx=ints(0, 4, 5), b=r(5, 3))
gcase("index_reduce_prod_f32")
case("index_reduce_mean_exclude_f32", "a.index_reduce(1, idx, b, 'mean', include_self=False)", a=r(3, 4),
     idx=ints(0, 4, 6), b=r(3, 6))
gcase("index_reduce_mean_exclude_f32")
case("index_reduce_amax_f32", "a.index_reduce(1, idx, b, 'amax')", a=r(2, 4), idx=ints(0, 4, 5), b=r(2, 5))
gcase("index_reduce_amax_f32")
case("index_reduce_amin_i64", "a.index_reduce(0, idx, b, 'amin', include_self=False)", a=ints(-9, 9, 4, 2),
     idx=ints(0, 4, 3), b=ints(-9, 9, 3, 2))
case("index_reduce_mean_i64", "a.index_reduce(0, idx, b, 'mean')", a=ints(-9, 9, 4), idx=ints(0, 4, 6),
     b=ints(-9, 9, 6))
case("err_index_reduce_2d_index", "a.index_reduce(0, idx, b, 'prod')", a=r(4), idx=ints(0, 4, 2, 2), b=r(4))

# ------------------------------------------------------------------------------------- erfc
# Large x is the point: 1 - erf(x) rounds to 0 from x = 4 (f32) and 6 (f64) on.
ERFC = [-INF, -5.0, -1.0, -0.0, 0.0, 0.25, 0.5, 1.0, 2.0, 3.5, 4.0, 5.0, 7.5, 9.0, 9.5, 10.5, INF, NAN]
fcase("erfc_f32", "torch.erfc(a)", a=vals(ERFC))
case("erfc_f64", "torch.erfc(a)", a=vals(ERFC + [15.0, 26.0, 27.0, 30.0], "f64"))
case("erfc_bf16", "torch.erfc(a)", a=vals(ERFC, "bf16"))
case("erfc_f16", "torch.erfc(a)", a=vals([-2.0, 0.0, 0.5, 1.0, 2.0, 3.0, 3.5], "f16"))
case("erfc_i64", "torch.erfc(a)", a=ints(-3, 4, 6))
case("erfc_random", "torch.erfc(a)", a=r(4, 8))


# ------------------------------------------------ advanced indexing by index tensors (index_put)

fcase("index_two_dims", "a[idx, j]", a=r(4, 5), idx=vals([0, 3, -1, 2], "i64"), j=vals([1, 4, 0, -2], "i64"))
fcase("index_broadcast_indices", "a[idx, j]", a=r(3, 4, 2), idx=vals([[0], [2]], "i64"), j=vals([1, 3, 0], "i64"))
case("index_one_dim_i64", "a[idx]", a=ints(0, 9, 5, 3), idx=vals([4, 0, 4], "i64"))
case("err_index_out_of_range", "a[idx, j]", a=r(3, 4), idx=vals([0, 3], "i64"), j=vals([1, 1], "i64"))
fcase("index_put_set", "torch.index_put(a, (idx, j), b)", a=r(4, 3), idx=vals([0, 2], "i64"), j=vals([1, -1], "i64"),
      b=r(2))
fcase("index_put_accumulate_repeats", "torch.index_put(a, (idx, j), b, accumulate=True)", a=r(3, 3),
      idx=vals([0, 0, 2, 0], "i64"), j=vals([1, 1, 2, 1], "i64"), b=r(4))
fcase("index_put_rows_broadcast_value", "torch.index_put(a, (idx,), b)", a=r(4, 3), idx=vals([3, 1], "i64"), b=r(3))
case("index_put_i64_accumulate", "torch.index_put(a, (idx, j), b, accumulate=True)", a=ints(0, 9, 3, 2),
     idx=vals([[1], [2]], "i64"), j=vals([0, 1, 1], "i64"), b=ints(0, 5, 2, 3))
# The flat position 0 * 4 + 4 = 4 is in range; the column index is not.
case("err_index_put_out_of_range_inner", "torch.index_put(a, (idx, j), b)", a=r(3, 4), idx=vals([0], "i64"),
     j=vals([4], "i64"), b=r(1))

# ------------------------------------------------- aliasing: in-place ops on views and their bases
# Statements as one expression: `(x := a.clone())` first (the inputs stay as they are), the last
# element the outputs. The harness runs each eagerly and inside a compiled function.
case("alias_narrow_sees_base_add", "((x := a.clone()), (v := x.narrow(0, 1, 2)), x.add_(b), (x, v))[-1]",
     a=r(4, 5), b=r(5))
case("alias_select_mul_writes_base", "((x := a.clone()), (c := x[:, 2]), x.select(0, 1).mul_(b), (x, c))[-1]",
     a=r(4, 5), b=r(5))
case("alias_view_chain_copy", "((x := a.clone()), (v := x.t().narrow(0, 1, 3).select(1, 2)), v.copy_(b), (x, v))[-1]",
     a=r(4, 5), b=r(3))
case("alias_reshape_view_zero", "((x := a.clone()), x.reshape(20)[3:17:4].zero_(), x)[-1]", a=r(4, 5))
case("alias_reshape_copy_keeps_old", "((x := a.clone()), (y := x.t().reshape(20)), x.mul_(2.0), (x, y))[-1]",
     a=r(4, 5))
case("alias_diagonal_fill", "((x := a.clone()), (d := x.diagonal()), x.diagonal().fill_(7.0), (x, d))[-1]",
     a=r(4, 5))
case("alias_detach_add", "((x := a.clone()), (d := x.detach()), d.add_(b), (x, d))[-1]", a=r(4, 5), b=r(5))
case("alias_read_before_write", "((x := a.clone()), (s := x.sum(0)), x[1:].sub_(b), (x, s))[-1]",
     a=r(4, 5), b=r(5))


def check():
    names = [c["name"] for c in CASES]
    dup = {n for n in names if names.count(n) > 1}
    assert not dup, f"duplicate names: {sorted(dup)}"
    for c in CASES:
        assert re.fullmatch(r"[a-z0-9_]+", c["name"]), c["name"]
        for k, spec in c["inputs"].items():
            assert re.fullmatch(r"[a-z]|idx", k), (c["name"], k)
            if "values" in spec:
                n = math.prod(spec["shape"])
                flat = json.dumps(spec["values"]).count(",") + 1 if n else 0
                assert n == flat, (c["name"], k, spec["shape"])


if __name__ == "__main__":
    check()
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cases.json")
    with open(out, "w") as f:  # one case per line: readable diffs
        f.write("[\n" + ",\n".join(json.dumps(c, allow_nan=False) for c in CASES) + "\n]\n")
    n_err = sum(c["name"].startswith("err_") for c in CASES)
    print(f"{len(CASES)} cases ({n_err} err_) -> {out}")
