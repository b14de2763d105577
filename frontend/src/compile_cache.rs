//! The in-process compile cache: compiled graphs by structural hash (confirmed node by node and
//! by the configuration's code settings), and each thread's recently run graphs, compared with a
//! new capture before it is hashed.

use super::*;
/// Compiled graphs by structural hash; each keeps its graph (and the donations it was compiled
/// with) to confirm a hit (no false hits).
type Cache = HashMap<u64, Vec<CacheEntry>>;

/// A compiled graph as the cache keeps it: the captured graph, its device and donations, and
/// the configuration it was compiled under.
#[derive(Clone)]
struct CacheEntry {
    graph: Arc<Graph>,
    device: Device,
    donations: Vec<Donation>,
    config: Arc<Config>,
    compiled: Arc<Compiled>,
}

impl CacheEntry {
    /// Whether this entry serves a graph compiled for `device` with `donations` under `config`
    /// (the graphs themselves compared apart).
    fn serves(&self, device: Device, donations: &[Donation], config: &Arc<Config>) -> bool {
        self.device == device
            && self.donations == donations
            && (Arc::ptr_eq(&self.config, config) || self.config.same_code(config))
    }
}

/// A recently run graph: its cache entry and its layout for comparisons with walks.
#[derive(Clone)]
struct Recent {
    entry: CacheEntry,
    expected: Arc<Expected>,
}

/// How many of its most recently run graphs a thread compares a new capture with before
/// hashing it ([`compiled_walk`]): a training step's few graphs.
const RECENT: usize = 8;

thread_local! {
    /// This thread's most recently run compiled graphs, most recent first.
    static RECENTLY_RUN: std::cell::RefCell<Vec<Recent>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The compiled form of the graph `walk` captures (with `donations`), and that graph. A program
/// realized again (the next step of a training loop) is one of the graphs this thread ran
/// recently: compared with them node by node ([`Walk::matches`]: a mismatch shows within the
/// first few nodes), it costs no graph and no hash. Anything else goes through
/// [`compile_donating`]'s cache.
pub(crate) fn compiled_walk(walk: &Walk, donations: &[Donation]) -> Result<(Arc<Compiled>, Arc<Graph>)> {
    let config = coil_ir::config::current();
    if let Some(e) = recent_hit(walk, donations, &config) {
        return Ok((e.compiled, e.graph));
    }
    let t = Instant::now();
    let graph = Arc::new(walk.graph());
    profile::spent(t, |t| &mut t.capture);
    compile_walked(graph, walk.device(), donations)
}

/// [`compiled_walk`]'s compile of a graph no recent run matched: through [`compile_cached`]
/// (with generalization), then kept among this thread's recent graphs unless compiled for
/// symbolic sizes.
pub(crate) fn compile_walked(
    graph: Arc<Graph>,
    device: Device,
    donations: &[Donation],
) -> Result<(Arc<Compiled>, Arc<Graph>)> {
    let (compiled, symbolic) = compile_cached(&graph, device, donations, true)?;
    if !symbolic {
        // Not kept for walks when symbolic: the next call at this size goes through the counts
        // of `crate::generalize`, which specializes a recurring size.
        remember(&graph, device, donations, &compiled);
    }
    Ok((compiled, graph))
}

/// The compiled graph of one of this thread's recent runs that `walk` matches, moved to the
/// front of the list.
fn recent_hit(walk: &Walk, donations: &[Donation], config: &Arc<Config>) -> Option<CacheEntry> {
    let device = walk.device();
    let t = Instant::now();
    let recent = RECENTLY_RUN.with(|r| {
        let mut r = r.borrow_mut();
        let i = r.iter().position(|x| x.entry.serves(device, donations, config) && walk.matches(&x.expected))?;
        let x = r.remove(i);
        r.insert(0, x.clone());
        Some(x.entry)
    });
    profile::spent(t, |t| &mut t.confirm);
    recent
}

/// Keeps a compiled graph among this thread's recent runs ([`compiled_walk`]).
fn remember(graph: &Arc<Graph>, device: Device, donations: &[Donation], compiled: &Arc<Compiled>) {
    let config = coil_ir::config::current();
    let entry =
        CacheEntry { graph: graph.clone(), device, donations: donations.to_vec(), config, compiled: compiled.clone() };
    let expected = Arc::new(Expected::new(graph));
    RECENTLY_RUN.with(|r| {
        let mut r = r.borrow_mut();
        r.insert(0, Recent { entry, expected });
        r.truncate(RECENT);
    });
}

/// What this process compiled before for the graph `walk` captures (no donations), without
/// compiling anything: a recent run's graph, the compile cache's, or a compilation for
/// symbolic sizes that serves it ([`crate::generalize`]). Else the captured graph, for the
/// caller to run some other way ([`crate::tiered`]).
pub(crate) fn find_walk(walk: &Walk) -> std::result::Result<(Arc<Compiled>, Arc<Graph>), Arc<Graph>> {
    let config = coil_ir::config::current();
    if let Some(e) = recent_hit(walk, &[], &config) {
        return Ok((e.compiled, e.graph));
    }
    let t = Instant::now();
    let graph = Arc::new(walk.graph());
    profile::spent(t, |t| &mut t.capture);
    let device = walk.device();
    if let Some(hit) = cache_lookup(&graph, device, &[], &config) {
        remember(&graph, device, &[], &hit);
        return Ok((hit, graph));
    }
    match crate::generalize::lookup(&graph, device) {
        Some(dynamic) => Ok((dynamic, graph)),
        None => Err(graph),
    }
}

/// Compiles `graph` for a realization that did not wait for it ([`crate::tiered`]): for
/// symbolic sizes at once where the program generalizes (so one compile serves every later
/// size; a program compiled before at this size is specialized as [`crate::generalize`]
/// decides), else for its static sizes; the result goes to the process's caches, where
/// [`find_walk`] finds it.
pub(crate) fn compile_ahead(graph: &Graph, device: Device) -> Result<()> {
    if crate::generalize::compile_generalized(graph, device, &[], true)?.is_some() {
        return Ok(());
    }
    compile_cached(graph, device, &[], false).map(|_| ())
}

fn cache() -> &'static Mutex<Cache> {
    static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// Number of graphs compiled by this process for [`crate::realize()`] (cache misses of its
/// compiled-graph cache, shared by every thread), for tests and reports. A program realized
/// again (the next step of a training loop, with new data and new random numbers) is a hit.
///
/// ```
/// use coil_frontend::{compile::compile_count, Tensor};
/// let x = Tensor::from_vec(vec![1.0f32; 64], &[64]).unwrap();
/// let step = || x.dropout(0.5, true).unwrap().to_vec::<f32>().unwrap();
/// let first = step();
/// let before = compile_count();
/// let second = step(); // the same graph: no compile (in this single-threaded example)
/// assert_eq!(compile_count(), before);
/// assert_ne!(first, second); // new numbers
/// ```
pub fn compile_count() -> usize {
    let fixed = cache().lock().map(|c| c.values().map(Vec::len).sum()).unwrap_or(0);
    fixed + crate::generalize::compiled()
}

/// Compiles a captured graph for a device, or returns the cached compilation of an identical
/// one.
pub fn compile(captured: &Graph, device: Device) -> Result<Arc<Compiled>> {
    compile_donating(captured, device, &[])
}

/// [`compile`], with each of `donations` asking for an output to be written over the buffer of
/// an input the caller will not read again (honoured where the schedule allows:
/// [`coil_passes::donate`]; `ir_post_fusion.txt` lists each one taken or refused, and why).
pub fn compile_donating(captured: &Graph, device: Device, donations: &[Donation]) -> Result<Arc<Compiled>> {
    compile_cached(captured, device, donations, false).map(|(compiled, _)| compiled)
}

/// [`compile_donating`]; with `generalize` (realizations), a program compiled before at other
/// sizes compiles for symbolic sizes ([`crate::generalize`]). Also says whether the result
/// is such a compilation for symbolic sizes.
fn compile_cached(
    captured: &Graph,
    device: Device,
    donations: &[Donation],
    generalize: bool,
) -> Result<(Arc<Compiled>, bool)> {
    let config = coil_ir::config::current();
    if let Some(hit) = cache_lookup(captured, device, donations, &config) {
        return Ok((hit, false));
    }
    let key = crate::dynamo::structural_hash(captured, device);
    if generalize {
        if let Some(dynamic) = crate::generalize::compile_generalized(captured, device, donations, false)? {
            return Ok((dynamic, true));
        }
    }
    let t = Instant::now();
    let compiled = Arc::new(compile_uncached(captured, device, None, donations)?);
    profile::spent(t, |t| &mut t.compile);
    let graph = Arc::new(captured.clone());
    let entry = CacheEntry { graph, device, donations: donations.to_vec(), config, compiled: compiled.clone() };
    cache().lock().expect("compile cache").entry(key).or_default().push(entry);
    Ok((compiled, false))
}

/// The compile cache's graph for `captured` (with `donations`, under `config`), if any.
fn cache_lookup(
    captured: &Graph,
    device: Device,
    donations: &[Donation],
    config: &Arc<Config>,
) -> Option<Arc<Compiled>> {
    let t = Instant::now();
    let key = crate::dynamo::structural_hash(captured, device);
    profile::spent(t, |t| &mut t.hash);
    let same =
        |e: &&CacheEntry| e.serves(device, donations, config) && crate::dynamo::same_structure(&e.graph, captured);
    let t = Instant::now();
    let hit =
        cache().lock().expect("compile cache").get(&key).and_then(|v| v.iter().find(same)).map(|e| e.compiled.clone());
    profile::spent(t, |t| &mut t.confirm);
    hit
}

/// Compiles a captured graph without looking in this process's cache of compiled graphs (the
/// disk caches, of kernels and of whole graphs, still apply): what another process pays to
/// compile it. With a warm disk cache that is the warm-start compile time (`times.total`; a
/// graph-cache hit, `times.graph_cache`, unless the configuration's `graph_cache` is off).
pub fn compile_fresh(captured: &Graph, device: Device) -> Result<Compiled> {
    compile_uncached(captured, device, None, &[])
}

/// Compiles a captured graph for every size its symbols can take (see
/// [`crate::dynamo::dynamic`]): one set of kernels, the sizes passed to them at run time. An
/// error of kind `Unsupported` says why the graph cannot be compiled that way (the caller then
/// compiles it for static sizes). Not cached here: compiled functions keep their own cache.
pub fn compile_dynamic(captured: &Graph, device: Device, spec: &DynamicSpec) -> Result<Arc<Compiled>> {
    let t = Instant::now();
    let compiled = compile_uncached(captured, device, Some(spec), &[]).map(Arc::new);
    profile::spent(t, |t| &mut t.compile);
    compiled
}
