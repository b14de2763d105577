//! Tier 0 of the CPU (`coil::tiered`): a realization of a graph not compiled yet runs at once
//! on prebuilt kernels while the graph compiles in the background; values agree with the
//! reference interpreter; a graph repeated at one size waits for its compile; a tier-0 error
//! names the op and the user's line; with the knob off a realization compiles first.
//!
//! The checks share the process's counters (`pending`, `compile_count`; `tier0_runs` counts
//! per thread), so they run in one test, one after another; every check uses its own cache
//! directory (the compile is a real C compiler run, so it is still in flight when the
//! realization returns).

use coil::{tiered, Backend, Config, DType, Tensor};

fn config(tag: &str, eager_tier: bool) -> Config {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("tier0-{tag}-{}", std::process::id()));
    Config { cache_dir: dir, eager_tier, backend: Some(Backend::Compiled), ..coil::config().as_ref().clone() }
}

/// Random values in +-[0.1, 2), never zero.
fn data(shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let v: Vec<f32> = (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let u = (s >> 40) as f32 / (1u64 << 24) as f32;
            if s & 1 == 0 {
                0.1 + 1.9 * u
            } else {
                -0.1 - 1.9 * u
            }
        })
        .collect();
    Tensor::from_vec(v, shape).unwrap()
}

/// Everyday eager code: layer norm, both GELUs, SiLU, softmax, a linear layer, sums and means.
fn program(x: &Tensor, w: &Tensor, b: &Tensor, scale: f64) -> coil::Result<Vec<Tensor>> {
    let d = x.shape()[1];
    let h = x.layer_norm(&[d], Some(b), Some(b), 1e-5)?.gelu(false)?;
    let y = coil::linear(&h, w, Some(b))?.mul(scale)?;
    let z = y.gelu(true)?.add(&y.silu()?)?.softmax(-1)?;
    Ok(vec![z.sum(&[0], false)?, y.mean(&[1], true)?, y.amax(&[1], false)?, z])
}

fn values(ts: &[Tensor]) -> Vec<Vec<f64>> {
    ts.iter().map(|t| t.to_vec::<f64>().unwrap()).collect()
}

fn assert_agree(got: &[Vec<f64>], want: &[Vec<f64>], tol: f64) {
    for (k, (a, b)) in got.iter().zip(want).enumerate() {
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= tol * (1.0 + y.abs()), "output {k} element {i}: tier 0 {x}, interpreter {y}");
        }
    }
}

#[test]
fn tier_0_serves_new_graphs_while_they_compile() {
    policy();
    an_error_names_the_op_and_the_line();
    half_types_and_views_agree_with_the_interpreter();
}

fn policy() {
    // 1. A new structure: the result is there while its compile is still in flight.
    coil::with_config(config("new", true), || {
        let (x, w, b) = (data(&[12, 40], 1), data(&[40, 40], 2), data(&[40], 3));
        let (runs, compiles) = (tiered::tier0_runs(), coil::compile_count());
        let outs = program(&x, &w, &b, 0.75).unwrap();
        coil::realize(&outs.iter().collect::<Vec<_>>()).unwrap();
        assert_eq!(tiered::tier0_runs(), runs + 1, "the realization ran on tier 0");
        assert!(tiered::pending() >= 1, "its compile is in flight (a C compiler run) when the values are there");
        let got = values(&outs);
        coil::set_backend(Backend::Interpreter);
        let want = values(&program(&x, &w, &b, 0.75).unwrap());
        coil::set_backend(Backend::Compiled);
        assert_agree(&got, &want, 2e-5);
        // Once the compile is done, another size of the same program runs compiled: the
        // background compile was for symbolic sizes, and counted.
        tiered::wait_for_background_compiles();
        assert_eq!(coil::compile_count(), compiles + 1);
        let (x2, w2, b2) = (data(&[9, 24], 4), data(&[24, 24], 5), data(&[24], 6));
        let outs = program(&x2, &w2, &b2, 0.75).unwrap();
        coil::realize(&outs.iter().collect::<Vec<_>>()).unwrap();
        assert_eq!(tiered::tier0_runs(), runs + 1, "the compiled graph serves the new size");
        assert_eq!(coil::compile_count(), compiles + 1, "without a compile");
    });

    // 2. One graph at one size again and again: tier 0 twice, then the third waits for the
    //    compile and runs compiled, as every later one.
    coil::with_config(config("repeat", true), || {
        let x = data(&[7, 33], 7);
        let step = || x.exp().unwrap().mul(&x).unwrap().sum(&[1], false).unwrap().to_vec::<f32>().unwrap();
        let runs = tiered::tier0_runs();
        let first = step();
        assert_eq!(first, step(), "tier 0 is deterministic");
        assert_eq!(tiered::tier0_runs(), runs + 2);
        let third = step();
        assert_eq!(tiered::tier0_runs(), runs + 2, "the third realization waited for the compile");
        for (a, b) in first.iter().zip(&third) {
            assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "tier 0 {a}, compiled {b}");
        }
        step();
        assert_eq!(tiered::tier0_runs(), runs + 2);
    });

    // 3. The knob off: today's behaviour, a compile before the run.
    coil::with_config(config("off", false), || {
        let x = data(&[5, 17], 8);
        let (runs, compiles) = (tiered::tier0_runs(), coil::compile_count());
        let y = x.tanh().unwrap().add(x.sigmoid().unwrap()).unwrap();
        y.realize().unwrap();
        assert_eq!((tiered::tier0_runs(), coil::compile_count()), (runs, compiles + 1));
    });

    // 4. What tier 0 does not run (random numbers) compiles first, as before.
    coil::with_config(config("random", true), || {
        let x = data(&[6, 6], 9);
        let (runs, compiles) = (tiered::tier0_runs(), coil::compile_count());
        x.dropout(0.5, true).unwrap().realize().unwrap();
        assert_eq!((tiered::tier0_runs(), coil::compile_count()), (runs, compiles + 1));
    });

    // 5. A background compile that fails is reported by the next realization of its structure
    //    (a compiler that runs but builds nothing).
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("tier0-cc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cc = dir.join("brokencc");
    let script = "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'brokencc 1.0'; exit 0; fi\n\
                  echo 'brokencc: refuses to build' >&2; exit 1\n";
    std::fs::write(&cc, script).unwrap();
    let mut perms = std::fs::metadata(&cc).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&cc, perms).unwrap();
    let broken = Config { c_compiler: Some(cc.display().to_string()), ..config("broken", true) };
    coil::with_config(broken, || {
        let (runs, compiles) = (tiered::tier0_runs(), coil::compile_count());
        let y = data(&[4, 9], 10).cos().unwrap().mul(3.0).unwrap();
        y.realize().unwrap();
        assert_eq!(tiered::tier0_runs(), runs + 1, "tier 0 needs no compiler");
        tiered::wait_for_background_compiles();
        let again = data(&[5, 11], 11).cos().unwrap().mul(3.0).unwrap();
        let e = again.realize().unwrap_err();
        assert!(e.to_string().contains("refuses to build"), "the compile's error: {e}");
        // and so does every later one of the structure, as without tier 0
        let e = data(&[3, 7], 12).cos().unwrap().mul(3.0).unwrap().realize().unwrap_err();
        assert!(e.to_string().contains("refuses to build"), "the compile's error: {e}");
        assert_eq!((tiered::tier0_runs(), coil::compile_count()), (runs + 1, compiles));
    });
}

fn an_error_names_the_op_and_the_line() {
    coil::with_config(config("error", true), || {
        let x = Tensor::from_vec(vec![7i64, -3, 4, 9], &[4]).unwrap();
        let zero = Tensor::from_vec(vec![2i64, 1, 0, 3], &[4]).unwrap();
        let line = line!() + 1;
        let q = x.floor_divide(&zero).unwrap().add(&x).unwrap();
        let e = q.realize().unwrap_err();
        assert_eq!(e.op.as_deref(), Some("floor_divide"), "{e}");
        let at = e.location.expect("the user's line");
        assert_eq!((at.file(), at.line()), (file!(), line), "{e}");
        assert!(e.message.contains("division by zero"), "{e}");
    });
}

fn half_types_and_views_agree_with_the_interpreter() {
    coil::with_config(config("half", true), || {
        for dtype in [DType::BF16, DType::F16, DType::F64] {
            let x = data(&[6, 10], 12).to_dtype(dtype).unwrap();
            let w = data(&[10, 4], 13).to_dtype(dtype).unwrap();
            let f = |x: &Tensor, w: &Tensor| -> coil::Result<Vec<Tensor>> {
                let t = x.transpose(0, 1)?.softmax(0)?.transpose(0, 1)?; // a permuted read
                let m = t.matmul(w)?.relu()?;
                Ok(vec![m.sum(&[0], true)?, x.narrow(1, 2, 5)?.exp()?.amax(&[1], false)?, m])
            };
            let runs = tiered::tier0_runs();
            let outs = f(&x, &w).unwrap();
            coil::realize(&outs.iter().collect::<Vec<_>>()).unwrap();
            assert_eq!(tiered::tier0_runs(), runs + 1, "{dtype}");
            coil::set_backend(Backend::Interpreter);
            let want = values(&f(&x, &w).unwrap());
            coil::set_backend(Backend::Compiled);
            let tol = if dtype == DType::BF16 {
                1.6e-2
            } else if dtype == DType::F16 {
                2e-3
            } else {
                1e-12
            };
            assert_agree(&values(&outs), &want, tol);
        }
    });
}
