//! Automatic dynamic shapes for realizations outside compiled functions: a program realized
//! again at other sizes compiles once for symbolic sizes, which then serves every size (no C
//! compiler run per shape), and a size that keeps coming back gets a static compilation of its
//! own. Compiled functions decide the same in `dynamo` (per function); this is the process-wide
//! counterpart for `realize` and in-place updates.

use crate::compile::{compile_dynamic, Compiled};
use crate::dynamo::dynamic::DynamicSpec;
use crate::logs;
use coil_ir::config::Config;
use coil_ir::kernel::Donation;
use coil_ir::{Graph, Result};
use coil_runtime::Device;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Compilations for symbolic sizes made so far (for [`crate::compile::compile_count`]).
pub(crate) fn compiled() -> usize {
    generalized().lock().map(|g| g.compiled()).unwrap_or(0)
}

/// Programs realized at more than one size: each program (by its hash without sizes) with the
/// graphs compiled for it at symbolic sizes, and whether it was found not to generalize.
#[derive(Default)]
struct Generalized {
    by_erased: HashMap<u64, Vec<Program>>,
}

/// A program seen by [`compile_donating`]: the first graph compiled for it (static sizes), then
/// its compilations for symbolic sizes.
struct Program {
    first: Arc<Graph>,
    device: Device,
    /// The configuration its graphs compile under (one that changes code is another program).
    config: Arc<Config>,
    dynamic: Vec<(DynamicSpec, Arc<Compiled>)>,
    /// Why it cannot be compiled for symbolic sizes, once that is known (static from then on).
    stays_static: Option<String>,
    /// Calls served by `dynamic`, per exact graph (its structural hash with sizes): a size
    /// that keeps coming back is compiled for itself ([`SPECIALIZE_AFTER`]).
    served: HashMap<u64, u32>,
}

/// Calls of one size a symbolic-size compilation serves before that size gets a compilation
/// of its own: static sizes give the C compiler and the scheduler constant loop bounds (the
/// layer norm of a 64 x 256 input ran 2.3x faster static than symbolic on the CPU). A loop
/// over one shape pays one more compile; a pass over new shapes, none.
const SPECIALIZE_AFTER: u32 = 3;

impl Generalized {
    fn compiled(&self) -> usize {
        self.by_erased.values().flatten().map(|p| p.dynamic.len()).sum()
    }

    fn program(&mut self, erased: u64, graph: &Graph, device: Device, config: &Config) -> Option<&mut Program> {
        let same = |p: &&mut Program| {
            p.device == device && p.config.same_code(config) && coil_ir::dynamic::same_up_to_sizes(&p.first, graph)
        };
        self.by_erased.get_mut(&erased)?.iter_mut().find(same)
    }
}

fn generalized() -> &'static Mutex<Generalized> {
    static GENERALIZED: OnceLock<Mutex<Generalized>> = OnceLock::new();
    GENERALIZED.get_or_init(Default::default)
}

/// The compilation for symbolic sizes that serves `captured`, if one was made (counted as a
/// call it serves: a size that keeps coming back gets `None` after [`SPECIALIZE_AFTER`]
/// calls, to be compiled for itself). Compiles nothing.
pub(crate) fn lookup(captured: &Graph, device: Device) -> Option<Arc<Compiled>> {
    let erased = crate::dynamo::guards::erased_hash(captured, device);
    let config = coil_ir::config::current();
    let mut all = generalized().lock().expect("generalized programs");
    let program = all.program(erased, captured, device, &config)?;
    serve(program, captured, device)
}

/// The compilation of `program` that serves `captured`, counting the call.
fn serve(program: &mut Program, captured: &Graph, device: Device) -> Option<Arc<Compiled>> {
    let (_, hit) = program.dynamic.iter().find(|(spec, _)| spec.bind(captured).is_some())?;
    let calls = program.served.entry(crate::dynamo::structural_hash(captured, device)).or_default();
    *calls += 1;
    (*calls <= SPECIALIZE_AFTER).then(|| hit.clone())
}

/// The compilation of `captured` for symbolic sizes when the same program was compiled before
/// at other sizes (automatic dynamic shapes, as compiled functions do on a second size): a
/// loop over new shapes compiles twice, not once per shape. With `at_once` (a compile that
/// runs while tier 0 serves the realization, [`crate::tiered`]), a program's first size
/// compiles for symbolic sizes already, every input dim of 2 or more symbolic: once, for
/// every later size. `None`: compile for static sizes (a first size without `at_once`, a
/// graph with donations, or one that does not generalize; `COIL_LOGS=recompiles` says why).
pub(crate) fn compile_generalized(
    captured: &Graph,
    device: Device,
    donations: &[Donation],
    at_once: bool,
) -> Result<Option<Arc<Compiled>>> {
    if !donations.is_empty() {
        return Ok(None);
    }
    let erased = crate::dynamo::guards::erased_hash(captured, device);
    let config = coil_ir::config::current();
    let mut all = generalized().lock().expect("generalized programs");
    let first_size = all.program(erased, captured, device, &config).is_none();
    if first_size {
        let first = Arc::new(captured.clone());
        let (dynamic, served) = (Vec::new(), HashMap::new());
        let program = Program { first, device, config: config.clone(), dynamic, stays_static: None, served };
        all.by_erased.entry(erased).or_default().push(program);
        if !at_once {
            return Ok(None);
        }
    }
    let program = all.program(erased, captured, device, &config).expect("programs are never removed");
    if !program.dynamic.is_empty() && program.dynamic.iter().any(|(spec, _)| spec.bind(captured).is_some()) {
        return Ok(serve(program, captured, device));
    }
    if program.stays_static.is_some() {
        return Ok(None);
    }
    // The input dims that differ from the first graph's (or were symbolic before) are symbolic;
    // at once, every input dim of 2 or more.
    let mut dims: Vec<(usize, usize)> = Vec::new();
    for (j, (&a, &b)) in program.first.inputs.iter().zip(&captured.inputs).enumerate() {
        let (old, new) = (&program.first.meta(a).shape, &captured.meta(b).shape);
        let differs = |d: usize| (first_size || old[d] != new[d]) && new[d] >= 2 && old[d] >= 2;
        dims.extend((0..new.len()).filter(|&d| differs(d)).map(|d| (j, d)));
    }
    for (spec, _) in &program.dynamic {
        dims.extend(spec.symbols.iter().map(|s| (s.input, s.dim)));
    }
    dims.sort_unstable();
    dims.dedup();
    let spec = match crate::dynamo::dynamic::resolve(captured, &dims) {
        Ok(spec) if !dims.is_empty() => spec,
        Ok(_) => return Ok(None), // only sizes 0 and 1 changed: those specialize
        Err(why) => {
            logs::recompile(&format!("realize: sizes kept static: {why}"));
            program.stays_static = Some(why);
            return Ok(None);
        }
    };
    drop(all); // (another thread may realize meanwhile; at worst both compile)
    let compiled = compile_dynamic(captured, device, &spec);
    let mut all = generalized().lock().expect("generalized programs");
    let program = all.program(erased, captured, device, &config).expect("programs are never removed");
    match compiled {
        Ok(compiled) => {
            logs::recompile(&format!("realize: compiled for dynamic sizes: {}", spec.symbol_text()));
            program.dynamic.push((spec, compiled.clone()));
            Ok(Some(compiled))
        }
        Err(e) if e.kind == coil_ir::ErrorKind::Unsupported => {
            logs::recompile(&format!("realize: sizes kept static: {}", e.message));
            program.stays_static = Some(e.message);
            Ok(None)
        }
        Err(e) => Err(e),
    }
}
