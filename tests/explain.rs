//! Compiled functions: graph breaks and `explain`, guards and recompiles, stances, the recompile
//! limit, and the cost of a cache hit.

mod common;

use coil::{BreakKind, Buffer, DType, ErrorKind, Result, Stance, Tensor};
use common::{close, randn, reference, Block};

/// `file:line` of the line `back` lines above the macro's.
macro_rules! line_above {
    ($back:expr) => {
        format!("{}:{}", file!(), line!() - $back)
    };
}

/// Two breaks: a branch on a value read with `item`, and an opaque host function.
fn two_breaks(args: &[Tensor]) -> Result<Vec<Tensor>> {
    let x = &args[0];
    let y = (x.abs()? + 1.0).log()?;
    let s = y.sum_all()?;
    let y = if s.item::<f32>()? > 0.0 { y.exp()? } else { y.neg()? };
    let reversed = y.map_host(|b| {
        let v: Vec<f32> = b.to_vec::<f32>().into_iter().rev().collect();
        Ok(Buffer::from_vec(v, b.meta().shape))
    })?;
    Ok(vec![(reversed * 2.0).sqrt()? + &y])
}

#[test]
fn explain_reports_two_breaks_with_reasons_hints_and_lines() {
    // Counts compiles: tier 0's background compiles would land in the count at any time.
    coil::set_eager_tier(false);
    coil::manual_seed(0);
    let x = randn(&[8], DType::F32);
    let report = coil::explain(|| two_breaks(std::slice::from_ref(&x))).unwrap();
    assert_eq!((report.graph_count, report.graph_break_count), (3, 2), "{report}");
    assert_eq!(report.breaks[0].id, "GB0001");
    assert_eq!(report.breaks[0].location_text(), "tests/explain.rs:21");
    assert_eq!(report.breaks[1].location_text(), "tests/explain.rs:22");
    let expected = reference(two_breaks, std::slice::from_ref(&x));
    assert!(close(&report.outputs[0].to_vec::<f64>().unwrap(), &expected[0], 1e-5));
    // The branch's operand `y` is held across the break: graph 1 returns it with the sum, and
    // graph 2 reads it instead of computing it again.
    assert_eq!(report.graphs[0].graph.outputs.len(), 2, "{report}");
    // Timings only in the alternate form.
    assert!(!report.to_string().contains("Compile Times"));
    assert!(format!("{report:#}").contains("Compile Times"));

    // The compiled function's own explain says the same, and names its arguments in guards.
    let f = coil::compile(two_breaks);
    let own = f.explain(&[&x]).unwrap();
    assert_eq!((own.op_count, &own.breaks), (report.op_count, &report.breaks));
    assert_eq!(f.compile_count(), 0, "explain leaves the function's cache alone");
    insta::assert_snapshot!(own.to_string());
}

#[test]
fn compiled_function_with_breaks_compiles_pieces_once_and_matches_the_interpreter() {
    // Counts compiles: tier 0's background compiles would land in the count at any time.
    coil::set_eager_tier(false);
    coil::manual_seed(1);
    let x = randn(&[16], DType::F32);
    let f = coil::compile(two_breaks);
    let expected = reference(two_breaks, std::slice::from_ref(&x));
    for _ in 0..3 {
        let out = f.call(&[&x]).unwrap();
        assert!(close(&out[0].to_vec::<f64>().unwrap(), &expected[0], 1e-5));
    }
    assert_eq!(f.compile_count(), 3, "three graphs, each compiled once");
    assert_eq!(f.recompile_count(), 0);
    let breaks = f.graph_breaks();
    assert_eq!(breaks.iter().map(|b| b.id.as_str()).collect::<Vec<_>>(), ["GB0001", "GB0002"]);
    assert_eq!(breaks[1].reason, "opaque host function (`map_host`)");
    let stats = f.stats();
    assert_eq!((stats.calls, stats.graph_hits, stats.graph_misses), (3, 6, 3));
}

#[test]
fn dtype_guard_failure_recompiles_and_says_why() {
    // Counts compiles: tier 0's background compiles would land in the count at any time.
    coil::set_eager_tier(false);
    let f = coil::compile(|a: &[Tensor]| Ok(vec![a[0].softmax(-1)? * 2.0])).named("f");
    let x = randn(&[4, 8], DType::F32);
    f.call(&[&x]).unwrap();
    f.call(&[&x]).unwrap();
    assert_eq!(f.compile_count(), 1);
    let xb = x.to_dtype(DType::BF16).unwrap();
    let out = f.call(&[&xb]).unwrap();
    assert_eq!(out[0].dtype(), DType::BF16);
    assert_eq!(f.compile_count(), 2);
    assert_eq!(f.recompile_reasons(), ["recompiling f (2nd time): input 0 dtype f32 -> bf16"]);
    // Both entries now serve hits.
    f.call(&[&x]).unwrap();
    f.call(&[&xb]).unwrap();
    assert_eq!(f.compile_count(), 2);
    let guards: Vec<String> = f.guards()[1].iter().map(|g| g.to_string()).collect();
    assert_eq!(guards[0], "TENSOR_MATCH graph input 0 (args[0]): bf16[4, 8] on cpu, static sizes");
}

#[test]
fn shape_mismatch_inside_the_function_is_an_error_at_the_users_line_not_a_recompile() {
    // Counts compiles: tier 0's background compiles would land in the count at any time.
    coil::set_eager_tier(false);
    let f = coil::compile(|a: &[Tensor]| {
        let y = a[0].matmul(&a[1])?;
        Ok(vec![y.relu()?])
    });
    let at = line_above!(3);
    let x = randn(&[4, 8], DType::F32);
    f.call(&[&x, &randn(&[8, 3], DType::F32)]).unwrap();
    let e = f.call(&[&x, &randn(&[5, 3], DType::F32)]).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Shape);
    assert!(e.to_string().contains(&at), "{e} should point at {at}");
    assert_eq!((f.compile_count(), f.recompile_count()), (1, 0));
}

/// Sizes 1, 2, 17, 64 and 1000 along the sequence dim: the change from 1 to 2 recompiles once
/// with the dim symbolic (automatic dynamic), and that graph serves every later size.
/// (`tests/dynamic.rs` has more.)
#[test]
fn a_size_change_recompiles_once_with_dynamic_shapes_and_values_match() {
    // Counts compiles: tier 0's background compiles would land in the count at any time.
    coil::set_eager_tier(false);
    let w = randn(&[16], DType::F32);
    let body = move |a: &[Tensor]| {
        let h = (&a[0] * &w).layer_norm(&[16], None, None, 1e-5)?;
        Ok(vec![h.gelu(true)?.softmax(0)?])
    };
    let f = coil::compile(body.clone()).named("f");
    for n in [1usize, 2, 17, 64, 1000] {
        let x = randn(&[n, 16], DType::F32);
        let expected = reference(&body, std::slice::from_ref(&x));
        for _ in 0..2 {
            let out = f.call(&[&x]).unwrap();
            assert!(close(&out[0].to_vec::<f64>().unwrap(), &expected[0], 1e-5), "size {n}");
        }
        assert_eq!(f.compile_count(), n.min(2), "size {n}");
    }
    let reasons = f.recompile_reasons();
    assert_eq!(reasons, ["recompiling f (2nd time): input 0 size[0] 1 -> 2; now dynamic: s0 = graph input 0 size[0]"]);
}

#[test]
fn fail_on_graph_break_stance_names_reason_hint_and_line() {
    let f = coil::compile(|a: &[Tensor]| {
        let s = a[0].sum_all()?;
        let y = if s.item::<f32>()? > 0.0 { a[0].exp()? } else { a[0].neg()? };
        Ok(vec![y])
    });
    let at = line_above!(3);
    let x = randn(&[8], DType::F32);
    let before = coil::set_stance(Stance::FailOnGraphBreak);
    let e = f.call(&[&x]).unwrap_err();
    coil::set_stance(before);
    assert_eq!(e.kind, ErrorKind::Unsupported);
    let msg = e.to_string();
    assert!(msg.contains("host read of a tensor value (`item`)"), "{msg}");
    assert!(msg.contains("use `where` instead of branching"), "{msg}");
    assert!(msg.contains(&at), "{msg} should point at {at}");
    // In the default stance the same call breaks the graph and runs.
    assert_eq!(f.call(&[&x]).unwrap()[0].shape(), &[8]);
}

#[test]
fn fail_on_recompile_stance_names_the_failed_guard() {
    // Counts compiles: tier 0's background compiles would land in the count at any time.
    coil::set_eager_tier(false);
    let f = coil::compile(|a: &[Tensor]| Ok(vec![a[0].exp()?])).named("f");
    let x = randn(&[8], DType::F32);
    let before = coil::set_stance(Stance::FailOnRecompile);
    f.call(&[&x]).unwrap(); // the first compile is not a recompile
    f.call(&[&x]).unwrap();
    let e = f.call(&[&x.to_dtype(DType::BF16).unwrap()]).unwrap_err();
    let at = line_above!(1);
    coil::set_stance(before);
    assert_eq!(e.kind, ErrorKind::Unsupported);
    assert!(e.to_string().contains("input 0 dtype f32 -> bf16"), "{e}");
    assert!(e.to_string().contains(&at), "{e} should point at {at}");
    assert_eq!(f.compile_count(), 1);
}

#[test]
fn past_the_recompile_limit_new_graphs_run_eagerly_with_one_warning() {
    // Counts compiles: tier 0's background compiles would land in the count at any time.
    coil::set_eager_tier(false);
    // A constant that changes every call (not a size: sizes would become dynamic instead).
    let body = |a: &[Tensor]| {
        let k = a[1].shape()[0] as f64 + 0.5;
        Ok(vec![(a[0].tanh()? * k).softmax(-1)?])
    };
    let f = coil::compile(body);
    let limit = coil::RECOMPILE_LIMIT;
    let x = randn(&[2, 5], DType::F32);
    for n in 1..=limit + 4 {
        let args = [x.clone(), randn(&[n], DType::F32)];
        let out = f.call(&[&args[0], &args[1]]).unwrap();
        let expected = reference(body, &args);
        assert!(close(&out[0].to_vec::<f64>().unwrap(), &expected[0], 1e-5), "size {n}");
    }
    assert_eq!(f.compile_count(), limit + 1, "the first compile and {limit} recompiles");
    assert!(f.is_eager());
    assert_eq!(f.warnings().len(), 1, "{:?}", f.warnings());
    assert!(f.warnings()[0].contains("recompiled 8 times"), "{:?}", f.warnings());
    // Graphs compiled before the limit still serve hits.
    f.call(&[&x, &randn(&[3], DType::F32)]).unwrap();
    assert_eq!(f.compile_count(), limit + 1);
}

#[test]
fn dumps_carry_guards_per_graph() {
    let dir = std::env::temp_dir().join(format!("coil_guards_dump_{}", std::process::id()));
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "dtype_guard_failure_recompiles_and_says_why", "--nocapture"])
        .env("COIL_DEBUG", &dir)
        .env("COIL_BACKEND", "compiled") // dumps come from compilations
        .status()
        .unwrap();
    assert!(status.success());
    let run = std::fs::read_dir(&dir).unwrap().next().unwrap().unwrap().path();
    let mut found = vec![];
    for g in std::fs::read_dir(&run).unwrap() {
        let path = g.unwrap().path().join("guards.txt");
        if path.is_file() {
            found.push(std::fs::read_to_string(path).unwrap());
        }
    }
    assert_eq!(found.len(), 2, "one guards.txt per compiled graph of f");
    assert!(found.iter().any(|t| t.contains("bf16[4, 8]")), "{found:?}");
    assert!(found.iter().all(|t| t.contains("GRAPH_STRUCTURE") && t.contains("hash 0x")), "{found:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The guard check and cache lookup of a compiled GPT-2 block, per call (printed, not
/// asserted: timings are noisy).
#[test]
fn gpt2_block_cache_hit_overhead_is_measured() {
    // Counts compiles: tier 0's background compiles would land in the count at any time.
    coil::set_eager_tier(false);
    coil::manual_seed(3);
    let block = Block::new(32, 2);
    let x = randn(&[2, 8, 32], DType::F32);
    let f = coil::compile(move |a: &[Tensor]| Ok(vec![block.forward(&a[0])?]));
    f.call(&[&x]).unwrap(); // compiles
    let warm = f.stats();
    let reps = 200;
    for _ in 0..reps {
        f.call(&[&x]).unwrap();
    }
    let s = f.stats();
    assert_eq!((f.compile_count(), s.graph_hits - warm.graph_hits), (1, reps));
    let per = |d: std::time::Duration, d0: std::time::Duration| (d - d0).as_secs_f64() * 1e6 / reps as f64;
    let (check, run, total) = (per(s.hit_check, warm.hit_check), per(s.run, warm.run), per(s.total, warm.total));
    let nodes = f.guards()[0].iter().find_map(|g| match g {
        coil::Guard::GraphStructure { nodes, .. } => Some(*nodes),
        _ => None,
    });
    println!("per-call overhead: {check:.1} us (guard check + cache lookup: capture, hash, confirm; {nodes:?} nodes)");
    println!(
        "per call: {total:.1} us in all = {:.1} us re-running the body to record + {check:.1} us lookup + {run:.1} us running the kernels",
        total - check - run
    );
}

/// Ops whose output shape depends on the data: each is one break, with its own reason and hint.
fn data_dependent(args: &[Tensor]) -> Result<Vec<Tensor>> {
    let x = args[0].exp()? - 1.0;
    let picked = x.masked_select(&x.gt(0.0)?)?;
    let distinct = (x.round()?).unique()?;
    Ok(vec![picked * 2.0, distinct.sum_all()?])
}

#[test]
fn data_dependent_shapes_are_graph_breaks_with_reason_and_hint() {
    coil::manual_seed(2);
    let x = randn(&[6, 5], DType::F32);
    let report = coil::explain(|| data_dependent(std::slice::from_ref(&x))).unwrap();
    assert_eq!(report.graph_break_count, 2, "{report}");
    assert_eq!(report.breaks[0].location_text(), line_above!(11));
    assert_eq!(report.breaks[1].location_text(), line_above!(11));
    for b in &report.breaks {
        assert_eq!(b.kind, BreakKind::DataDependentShape);
        assert!(b.reason.contains("output shape depends on the data"), "{b}");
        assert!(b.hint.contains("masked_fill"), "{b}");
    }
    let text = report.to_string();
    assert!(text.contains("output shape depends on the data"), "{text}");

    // Compiled, the pieces between the breaks agree with the interpreter; under
    // FailOnGraphBreak the op is an error at the user's line.
    let f = coil::compile(data_dependent);
    let expected = reference(data_dependent, std::slice::from_ref(&x));
    let out = f.call(&[&x]).unwrap();
    for (o, e) in out.iter().zip(&expected) {
        assert!(close(&o.to_vec::<f64>().unwrap(), e, 1e-5));
    }
    assert_eq!(f.graph_breaks().len(), 2);
    let before = coil::set_stance(Stance::FailOnGraphBreak);
    let e = coil::compile(data_dependent).call(&[&x]).unwrap_err();
    coil::set_stance(before);
    assert_eq!(e.kind, ErrorKind::Unsupported);
    assert!(e.to_string().contains("output shape depends on the data"), "{e}");
    assert!(e.to_string().contains(&report.breaks[0].location_text()), "{e}");
}
