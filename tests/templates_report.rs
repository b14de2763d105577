//! The template stage's report where a user reads it: `templates.txt` and the `templates`
//! counts of `summary.json` in the debug dump, and the attention lines of `explain`.

use coil::{Config, DType, Result, Tensor};
use coil_runtime::Device;

/// A tensor of `shape` with varied values (no randomness: the graph is what is tested).
fn values(shape: &[usize], seed: usize) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| ((i * 37 + seed * 11) % 101) as f32 / 50.0 - 1.0).collect();
    Tensor::from_vec(v, shape).unwrap()
}

/// Causal attention over `[1, 2, t, 16]` f32 as a user writes it (`q @ k^T * 0.25`, the
/// `tril` mask as `masked_fill(mask == 0, -inf)`, softmax, `@ v`): its output and its
/// probabilities, recorded at the caller's line.
#[track_caller]
fn attention(t: usize, seed: usize) -> Result<(Tensor, Tensor)> {
    let shape = [1, 2, t, 16];
    attention_of(&values(&shape, seed), &values(&shape, seed + 1), &values(&shape, seed + 2))
}

/// [`attention`] of given q, k, v.
#[track_caller]
fn attention_of(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
    let t = q.shape()[2];
    let s = q.matmul(&k.transpose(-2, -1)?)? * 0.25;
    let mask = Tensor::ones(&[t, t], DType::Bool).tril(0)?;
    let p = s.masked_fill(&mask.eq(0)?, f64::NEG_INFINITY)?.softmax(-1)?;
    Ok((p.matmul(v)?, p))
}

/// Three chains: the first's probabilities are private (the template replaces it); the
/// second's and third's are an output too, at 256 tokens (where the template, recomputing
/// them, would cost less than reading them: refused) and at 32 (kept written out, cheaper);
/// the line of each.
fn three_chains() -> Result<(Vec<Tensor>, [u32; 3])> {
    let (y1, _) = attention(32, 0)?;
    let first = line!() - 1;
    let (y2, p2) = attention(256, 3)?;
    let (y3, p3) = attention(32, 6)?;
    Ok((vec![y1, y2, p2, y3, p3], [first, first + 2, first + 3]))
}

/// This thread's configuration with dumps under `dir` (or none) and the graph cache off (a
/// graph read from it has no template report).
fn config(dir: Option<std::path::PathBuf>) -> Config {
    Config { debug_dir: dir, graph_cache: false, ..(*coil::config()).clone() }
}

#[test]
fn the_dump_has_the_template_report_and_its_counts() {
    if coil_runtime::testing::c_compiler().is_none() {
        return;
    }
    let (outputs, [first, second, third]) = three_chains().unwrap();
    let captured = coil::capture(&outputs.iter().collect::<Vec<_>>()).graph;
    let dir = std::env::temp_dir().join(format!("coil-templates-report-{}", std::process::id()));
    // Compiled twice, without the process's cache: the same text both times.
    let dumps: Vec<(String, serde_json::Value)> = (0..2)
        .map(|_| {
            let compiled = coil::with_config(config(Some(dir.clone())), || {
                coil_frontend::compile::compile_fresh(&captured, Device::Cpu)
            })
            .unwrap();
            let at = compiled.dump_dir.clone().expect("dumps are on");
            let text = std::fs::read_to_string(at.join("templates.txt")).unwrap();
            let summary = std::fs::read_to_string(at.join("summary.json")).unwrap();
            assert_eq!(compiled.templates.as_ref().map(|t| t.to_string()).as_ref(), Some(&text));
            (text, serde_json::from_str(&summary).unwrap())
        })
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(dumps[0].0, dumps[1].0, "deterministic");
    let (text, summary) = &dumps[0];
    // A CPU compile costs at the CPU's rates.
    assert!(text.contains("cost model: 20.0 GB/s, 0.2 TFLOP/s,"), "{text}");
    let file = file!();
    assert!(
        text.contains(&format!("{file}:{first}: replaced by the attention template (causal, scale 0.25)")),
        "{text}"
    );
    assert!(text.contains(&format!("{file}:{second}: refused: %")), "{text}");
    assert!(text.contains(&format!("softmax at {file}:{second} is an output of the graph; the template")), "{text}");
    assert!(text.contains(&format!("{file}:{third}: kept written out: %")), "{text}");
    assert!(text.contains(&format!("softmax at {file}:{third} is an output of the graph, and the product")), "{text}");
    let t = &summary["templates"];
    assert_eq!(
        (&t["chosen"], &t["refused"], &t["kept"], &t["not_matched"]),
        (&1.into(), &1.into(), &1.into(), &0.into())
    );
    assert_eq!(t["stop_reason"], "saturated");
    insta::assert_snapshot!(text);
}

#[test]
fn explain_says_what_became_of_each_attention_chain() {
    coil::set_eager_tier(false);
    let lines = std::cell::Cell::new([0; 3]);
    let report = coil::with_config(config(None), || {
        coil::explain(|| {
            let (outputs, at) = three_chains()?;
            lines.set(at);
            Ok(outputs)
        })
    })
    .unwrap();
    let [first, second, third] = lines.get();
    let text = report.to_string();
    let file = file!();
    let section = text.split("Attention Templates:\n").nth(1).expect("the section").split("Out Guards:").next();
    let section: Vec<&str> = section.unwrap().lines().collect();
    assert_eq!(section.len(), 4, "{text}");
    assert_eq!(section[0], "  Graph 1:");
    assert!(
        section[1]
            .ends_with(&format!(" matmul at {file}:{first}: replaced by the attention template (causal, scale 0.25)")),
        "{text}"
    );
    assert!(section[2].contains(&format!(" matmul at {file}:{second}: refused: %")), "{text}");
    assert!(section[2].contains(&format!(" softmax at {file}:{second} is an output of the graph;")), "{text}");
    assert!(section[3].contains(&format!(" matmul at {file}:{third}: kept written out: %")), "{text}");
    // The same report in the structure.
    let chains = &report.graphs[0].templates.as_ref().expect("compiled").chains;
    assert_eq!(chains.len(), 3);
}

#[test]
fn a_dynamic_compile_reports_its_templates_too() {
    if coil_runtime::testing::c_compiler().is_none() {
        return;
    }
    let shape = [1, 3, 32, 16];
    let (q, k, v) = (values(&shape, 0), values(&shape, 1), values(&shape, 2));
    // The heads dim symbolic: the stage runs at the probes' sizes.
    [&q, &k, &v].iter().for_each(|x| x.mark_dynamic(1).unwrap());
    let (y, _) = attention_of(&q, &k, &v).unwrap();
    let compiled = coil::with_config(config(None), || coil::inspect(&[&y])).unwrap();
    assert!(compiled.pre_fusion.starts_with("symbol s0"), "compiled for every size:\n{}", compiled.pre_fusion);
    let report = compiled.templates.as_ref().expect("the stage ran");
    assert_eq!((report.chosen, report.chains.len()), (1, 1), "{report}");
    assert_eq!(report.model, Some(coil_passes::rewrite::CostModel::cpu()), "a CPU compile costs at the CPU's rates");
}

#[test]
fn a_graph_read_from_the_graph_cache_has_its_template_report_too() {
    if coil_runtime::testing::c_compiler().is_none() {
        return;
    }
    let (outputs, _) = three_chains().unwrap();
    let captured = coil::capture(&outputs.iter().collect::<Vec<_>>()).graph;
    let dir = std::env::temp_dir().join(format!("coil-templates-cached-{}", std::process::id()));
    let cached =
        Config { cache_dir: dir.join("cache"), graph_cache: true, debug_dir: Some(dir.join("dump")), ..config(None) };
    let compile =
        || coil::with_config(cached.clone(), || coil_frontend::compile::compile_fresh(&captured, Device::Cpu));
    let (first, second) = (compile().unwrap(), compile().unwrap());
    let names = [first.times.graph_cache.name(), second.times.graph_cache.name()];
    let read = |c: &coil::Compiled| std::fs::read_to_string(c.dump_dir.as_ref().unwrap().join("templates.txt"));
    let texts = (read(&first), read(&second));
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(second.dump_dir.as_ref().unwrap().join("summary.json")).unwrap())
            .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(names, ["miss", "hit"]);
    let (first_text, second_text) = (texts.0.unwrap(), texts.1.expect("the hit's dump has templates.txt"));
    assert_eq!(first_text, second_text, "the stage run again on a hit says the same");
    assert_eq!(summary["templates"]["chosen"], 1);
    assert_eq!(second.templates.as_ref().map(|t| t.to_string()), Some(second_text));
}

/// A training graph's attention chains are decided where `value_and_grad` decomposes the
/// forward (the gradient graph compiled after it holds template nodes, no chains): `explain`
/// names the call's line with each chain's fate, and the debug dump has the forward and its
/// report under `grad_<n>/`.
#[test]
fn explain_and_the_dump_show_what_value_and_grad_made_of_each_chain() {
    coil::set_eager_tier(false);
    let dir = std::env::temp_dir().join(format!("coil-templates-grad-{}", std::process::id()));
    let lines = std::cell::Cell::new((0, 0));
    let report = coil::with_config(config(Some(dir.clone())), || {
        coil::explain(|| {
            let shape = [1, 2, 32, 16];
            let (q, k, v) = (values(&shape, 0), values(&shape, 1), values(&shape, 2));
            let (y, _) = attention_of(&q, &k, &v)?;
            let chain = line!() - 1;
            let (loss, grads) = coil::value_and_grad(&y.sum_all()?, &[&q, &k, &v])?;
            lines.set((chain, line!() - 1));
            Ok([vec![loss], grads].concat())
        })
    })
    .unwrap();
    let (chain, call) = lines.get();
    let file = file!();
    let text = report.to_string();
    let section = text.split("Attention Templates:\n").nth(1).expect("the section").split("Out Guards:").next();
    let section: Vec<&str> = section.unwrap().lines().collect();
    assert_eq!(section.len(), 2, "{text}");
    assert_eq!(section[0], format!("  value_and_grad at {file}:{call}:"));
    let replaced = format!(" matmul at {file}:{chain}: replaced by the attention template (causal, scale 0.25)");
    assert!(section[1].ends_with(&replaced), "{text}");
    assert_eq!(report.differentiations.len(), 1);
    assert_eq!(report.differentiations[0].location.line(), call);
    // The dump: the forward graph and the same report.
    let runs: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()).collect();
    let grad = runs
        .iter()
        .flat_map(|r| std::fs::read_dir(r).unwrap().flatten().map(|e| e.path()))
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("grad_")));
    let grad = grad.expect("a grad_<n> folder");
    let dumped = std::fs::read_to_string(grad.join("templates.txt")).unwrap();
    let forward = std::fs::read_to_string(grad.join("graph_forward.txt")).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(dumped.contains(&format!("{file}:{chain}: replaced by the attention template")), "{dumped}");
    assert!(forward.contains("softmax"), "{forward}");
}
