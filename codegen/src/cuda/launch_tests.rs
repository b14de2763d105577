//! The launch heuristic and its alternatives: plans for each kernel shape, clusters of
//! blocks for long rows, and the autotuner's candidates and tunings.

use super::tests::*;
use super::*;
use crate::testutil::*;
use crate::tile::build_kernel;
use crate::tile::tests::{online, Online};
use coil_ir::kernel::FusedKernel;
use coil_ir::loops::LoopProgram;
use coil_ir::DType;

#[test]
fn launch_heuristic() {
    let plan_of = |p: &LoopProgram, k: &FusedKernel| launch::plan(&build_kernel(p, k), &GpuTarget::h100());
    let (p, k) = pointwise_n(1 << 20, DType::BF16);
    let pl = plan_of(&p, &k);
    assert_eq!((pl.vec, pl.launch.block, pl.launch.grid), (8, 256, 512));
    // short rows: a warp each, 8 rows per block once there are enough blocks
    let (p, k) = softmax(8192, 64, KernelKind::PersistentReduction, "s");
    let pl = plan_of(&p, &k);
    assert_eq!((pl.vec, pl.lanes, pl.rows_per_block, pl.chunks, pl.launch.grid), (2, 32, 8, 1, 1024));
    // an odd row up to 1024 long: a warp, scalar groups; with few rows per SM a block of 128
    let (p, k) = softmax(40000, 333, KernelKind::PersistentReduction, "s");
    let pl = plan_of(&p, &k);
    assert_eq!((pl.vec, pl.lanes, pl.chunks), (1, 32, 11));
    let (p, k) = softmax(4, 333, KernelKind::PersistentReduction, "s");
    let pl = plan_of(&p, &k);
    assert_eq!((pl.vec, pl.lanes, pl.rows_per_block, pl.chunks), (1, 128, 1, 3));
    // a layer norm over 8192 rows of 768 f32 (62 per SM): 128 threads, 192 groups of 4 (half
    // the threads take two); f32 rows of 256 (64 groups): 64 threads
    let (p, k) = layer_norm(8192, 768, KernelKind::PersistentReduction);
    let pl = plan_of(&p, &k);
    assert_eq!((pl.vec, pl.lanes, pl.chunks, pl.launch.grid), (4, 128, 2, 8192));
    let (p, k) = softmax(300, 256, KernelKind::PersistentReduction, "s");
    assert_eq!(plan_of(&p, &k).lanes, 64);
    // a longer row, and fewer rows than SMs: a block of up to 1024 threads, two groups each
    let (p, k) = softmax(4, 1333, KernelKind::PersistentReduction, "s");
    let pl = plan_of(&p, &k);
    assert_eq!((pl.vec, pl.lanes, pl.chunks), (1, 672, 2));
    let (p, k) = softmax(4, 1 << 16, KernelKind::LoopedReduction, "s");
    let pl = plan_of(&p, &k);
    assert_eq!((pl.vec, pl.lanes, pl.launch.grid), (4, 1024, 4));
    assert_eq!(pl.cluster, 1);
    // a row too long for one block: clusters of 8 blocks of 128 threads, 64 values each
    let (p, k) = softmax(1024, 1 << 16, KernelKind::PersistentReduction, "s");
    let pl = plan_of(&p, &k);
    assert_eq!((pl.vec, pl.lanes, pl.cluster, pl.chunks), (4, 128, 8, 16));
    assert_eq!((pl.launch.grid, pl.launch.cluster, pl.launch.per_block), (8192, 8, 1));
    // an odd row just over a block's: two blocks of scalar groups, at most 32 per thread, the
    // last chunk partial
    let (p, k) = softmax(3, 12289, KernelKind::PersistentReduction, "s");
    let pl = plan_of(&p, &k);
    assert_eq!((pl.vec, pl.lanes, pl.cluster, pl.chunks, pl.launch.grid), (1, 224, 2, 28, 6));
    // a column sum with outputs for 128 blocks of 64: 16 threads across, 4 outputs each (one
    // 16-byte load per row), 64 along the column; fewer outputs keep one warp per block
    let (p, k) = col_sum(8192, 8192, KernelKind::PersistentReduction);
    let pl = plan_of(&p, &k);
    assert_eq!((pl.col, pl.rows_per_block, pl.col_vec, pl.lanes), (true, 64, 4, 64));
    assert_eq!((pl.col_threads(), pl.chunks, pl.launch.block, pl.launch.grid), (16, 128, 1024, 128));
    let (p, k) = col_sum(8192, 4096, KernelKind::PersistentReduction);
    let pl = plan_of(&p, &k);
    assert_eq!((pl.rows_per_block, pl.lanes, pl.launch.grid), (32, 32, 128));
    let (p, k) = col_sum(8192, 8192, KernelKind::LoopedReduction);
    assert_eq!(plan_of(&p, &k).rows_per_block, 32);
    // a grid of whole clusters, also when capped
    let l = Launch { grid: 0, block: 256, shared_bytes: 0, per_block: 1, max_grid: 0, cluster: 8 };
    assert_eq!((l.grid_for(5), l.grid_for(0)), (40, 8));
    assert_eq!(Launch { max_grid: 20, ..l }.grid_for(5), 16);
}

/// The rules that depend on the GPU give an A100 (108 SMs, 40 MiB of L2) plans of its own;
/// the H100's are those of [`launch_heuristic`].
#[test]
fn launch_plans_follow_the_target() {
    let (h100, a100) = (GpuTarget::h100(), GpuTarget::a100());
    let on = |(p, k): &(LoopProgram, FusedKernel), target: &GpuTarget| launch::plan(&build_kernel(p, k), target);
    // Rows of a warp, 8 to a block, fewer while that leaves under two blocks per SM: 500
    // blocks of 2 rows on 132 SMs, 250 of 4 on 108.
    let warp_rows = softmax(1000, 128, KernelKind::PersistentReduction, "s");
    assert_eq!((on(&warp_rows, &h100).rows_per_block, on(&warp_rows, &h100).launch.grid), (2, 500));
    assert_eq!((on(&warp_rows, &a100).rows_per_block, on(&warp_rows, &a100).launch.grid), (4, 250));
    // Fewer rows than SMs get blocks of up to 1024 threads: 120 rows are fewer than the
    // H100's SMs, not the A100's.
    let few_rows = softmax(120, 4096, KernelKind::PersistentReduction, "s");
    assert_eq!((on(&few_rows, &h100).lanes, on(&few_rows, &a100).lanes), (512, 256));
    // A looped kernel reading its rows twice keeps 12/25 of the L2 in rows: 24 MiB of rows of
    // 64 KiB on the H100 (384 rows), 19.2 MiB on the A100 (307), as whole blocks per SM; at
    // least a block per SM.
    let reread = softmax(4096, 1 << 14, KernelKind::LoopedReduction, "s");
    assert_eq!((launch::l2_row_budget(&h100), on(&reread, &h100).launch.max_grid), (24 << 20, 264));
    assert_eq!(on(&reread, &a100).launch.max_grid, 216);
    let reread_long = softmax(4096, 1 << 16, KernelKind::LoopedReduction, "s");
    assert_eq!((on(&reread_long, &h100).launch.max_grid, on(&reread_long, &a100).launch.max_grid), (132, 108));
    // The occupancy hint of a wide looped PTX kernel: blocks of 1024 of the SM's threads.
    let sm_86 = GpuTarget { compute_capability: (8, 6), max_threads_per_sm: 1536, ..a100 };
    let k = build_kernel(&reread.0, &reread.1);
    let hint = |target: &GpuTarget| {
        let src = ptx::emit_ptx(&k, target, &Tuning { looped_threads: Some(512), ..Tuning::default() }).unwrap().source;
        src.lines().find(|l| l.starts_with(".minnctapersm")).map(str::to_string)
    };
    assert_eq!((hint(&h100).as_deref(), hint(&sm_86).as_deref()), (Some(".minnctapersm 4"), Some(".minnctapersm 3")));
}

#[test]
fn cluster_rows_meet_in_distributed_shared_memory() {
    let (p, k) = softmax(1024, 1 << 16, KernelKind::PersistentReduction, "s");
    let (src, _) = emit_cuda_kernel(&build_kernel(&p, &k)).unwrap();
    for want in [
        "__cluster_dims__(8, 1, 1) __launch_bounds__(128)",
        "const int rlane = (int)(blockIdx.x % 8) * 128 + threadIdx.x;",
        "__shared__ float smem1[5];",
        // 1024 rows in 8192 blocks: one row per cluster, no grid-stride loop
        "const int xindex = (int)(blockIdx.x / 8);\n    {",
        "const int rchunk = k * 1024 + rlane;",
        "coil_reduce_cluster<8, 4>(acc1, coil_max_f32(), smem1)",
    ] {
        assert!(src.contains(want), "{want} missing in\n{src}");
    }
    // besides the one in each reduction, a cluster barrier at the end of each row
    assert_eq!(src.matches("coil_cluster_sync();").count(), 1, "{src}");
    let module = emit_cuda(&[build_kernel(&p, &k)]).unwrap();
    assert!(module.source.contains("mapa.u64") && module.source.contains("barrier.cluster.arrive.release"));
}

/// A GPU without thread-block clusters never gets a cluster plan, even for a row past
/// `BLOCK_ROW_MAX` or with a cluster override (its assembler refuses `.reqnctapercluster`).
#[test]
fn gpus_without_clusters_get_no_cluster_plans() {
    let (p, k) = softmax(64, 1 << 14, KernelKind::PersistentReduction, "s");
    let tile = build_kernel(&p, &k);
    let a100 = GpuTarget::a100();
    assert!(!a100.clusters);
    for tuning in [Tuning::default(), Tuning { cluster: Some(4), ..Tuning::default() }] {
        assert_eq!(launch::plan_with(&tile, &tuning, &a100).cluster, 1);
        let src = ptx::emit_ptx(&tile, &a100, &tuning).unwrap().source;
        assert!(!src.contains(".reqnctapercluster"), "{src}");
    }
    assert_eq!(launch::plan_with(&tile, &Tuning::default(), &GpuTarget::h100()).cluster, 2);
}

#[test]
fn long_rows_stay_on_chip_only_where_the_loop_would_read_them_twice() {
    use coil_ir::kernel::Schedule;
    let settle = |p: &LoopProgram, k: FusedKernel| {
        let mut s = Schedule { kernels: vec![k], refusals: vec![], memory: Default::default() };
        launch::settle_row_kinds(p, &mut s, &GpuTarget::h100());
        let k = s.kernels.pop().unwrap();
        (k.kind, k.name)
    };
    let persistent = |mut k: FusedKernel| {
        k.kind = KernelKind::PersistentReduction;
        k.name = k.name.replacen("red_", "per_", 1);
        k
    };
    // a softmax loops twice over its rows: a cluster holds them
    let (p, k) = online(64, Some(1 << 16), DType::F32, Online::Softmax, false);
    assert_eq!(settle(&p, persistent(k)), (KernelKind::PersistentReduction, "per_fused_softmax_0".into()));
    // ... unless there are rows enough for every SM (16 each): the second pass reads the L2
    let (p, k) = online(132 * 16, Some(1 << 16), DType::F32, Online::Softmax, false);
    assert_eq!(settle(&p, persistent(k)).0, KernelKind::LoopedReduction);
    let (p, k) = online(132 * 16 - 1, Some(1 << 16), DType::F32, Online::Softmax, false);
    assert_eq!(settle(&p, persistent(k)).0, KernelKind::PersistentReduction);
    // a logsumexp loops once: looped
    let (p, k) = online(64, Some(50304), DType::BF16, Online::LogSumExp, false);
    assert_eq!(settle(&p, persistent(k)), (KernelKind::LoopedReduction, "red_fused_logsumexp_0".into()));
    // a row one block holds stays persistent
    let (p, k) = online(64, Some(8192), DType::BF16, Online::LogSumExp, false);
    assert_eq!(settle(&p, persistent(k)).0, KernelKind::PersistentReduction);
}

#[test]
fn tunings_read_back_from_their_text() {
    use launch::Tuning;
    let t = Tuning { row_threads: Some(512), cluster: Some(4), ..Tuning::default() };
    assert_eq!(t.to_string(), "row_threads=512 cluster=4");
    assert_eq!("row_threads=512 cluster=4".parse::<Tuning>(), Ok(t));
    assert_eq!(Tuning::default().to_string(), "heuristic");
    assert_eq!(" heuristic\n".parse::<Tuning>(), Ok(Tuning::default()));
    let all = Tuning {
        row_threads: Some(96),
        cluster: Some(2),
        looped_threads: Some(1024),
        looped_grid: Some(0),
        pointwise_vec: Some(16),
    };
    assert_eq!(all.to_string().parse::<Tuning>(), Ok(all));
    // each knob's range, unknown knobs, and text that sets nothing are refused
    for bad in ["row_threads=33", "row_threads=2048", "cluster=3", "cluster=16", "pointwise_vec=64", "speed=9", "", "x"]
    {
        assert!(bad.parse::<Tuning>().is_err(), "{bad:?} accepted");
    }
}

#[test]
fn plan_with_overrides_the_heuristic() {
    use launch::{plan_with, Tuning};
    let heuristic = Tuning::default();
    // a block per row: threads per row, and the chunks follow
    let (p, k) = layer_norm(37, 1536, KernelKind::PersistentReduction);
    let t = build_kernel(&p, &k);
    assert_eq!(plan_with(&t, &heuristic, &GpuTarget::h100()), launch::plan(&t, &GpuTarget::h100()));
    let pl = plan_with(&t, &Tuning { row_threads: Some(96), ..heuristic }, &GpuTarget::h100());
    assert_eq!((pl.lanes, pl.chunks, pl.launch.block, pl.launch.grid), (96, 4, 96, 37));
    // a value outside the knob's range is ignored, as the environment's are
    assert_eq!(
        plan_with(&t, &Tuning { row_threads: Some(100), ..heuristic }, &GpuTarget::h100()),
        launch::plan(&t, &GpuTarget::h100())
    );
    // a cluster of 8 halved, with twice the threads: the same threads per row
    let (p, k) = softmax(1024, 1 << 16, KernelKind::PersistentReduction, "s");
    let t = build_kernel(&p, &k);
    let pl = plan_with(&t, &Tuning { row_threads: Some(512), cluster: Some(4), ..heuristic }, &GpuTarget::h100());
    assert_eq!((pl.lanes, pl.cluster, pl.row_threads(), pl.chunks), (512, 4, 2048, 8));
    assert_eq!((pl.launch.block, pl.launch.cluster, pl.launch.grid), (512, 4, 4096));
    // looped rows: threads per row and the grid cap
    let (p, k) = softmax(3, 2000, KernelKind::LoopedReduction, "s");
    let t = build_kernel(&p, &k);
    let pl =
        plan_with(&t, &Tuning { looped_threads: Some(1024), looped_grid: Some(2), ..heuristic }, &GpuTarget::h100());
    assert_eq!((pl.lanes, pl.launch.block, pl.launch.max_grid, pl.launch.grid), (1024, 1024, 2, 2));
    // 2 blocks for 3 rows: the grid-stride loop stays (a grid that covers every row has none)
    let tuned = crate::cuda::emit_cuda_with(
        std::slice::from_ref(&t),
        &Tuning { looped_grid: Some(2), ..heuristic },
        &GpuTarget::h100(),
    );
    let src = tuned.unwrap().source;
    assert!(src.contains("for (int xindex = (int)blockIdx.x; xindex < xnumel; xindex += (int)gridDim.x) {"), "{src}");
    // the heuristic's threads per looped row: fewer where the last pass would idle
    // (6288 groups of 4: 7 passes of 1024 leave 14% idle, 13 of 512 6%)
    for (cols, lanes) in [(25152, 512), (1 << 16, 1024), (50257, 1024)] {
        let (p, k) = softmax(8, cols, KernelKind::LoopedReduction, "s");
        assert_eq!(launch::plan(&build_kernel(&p, &k), &GpuTarget::h100()).lanes, lanes, "{cols}");
    }
    // the persistent knobs leave looped kernels alone, and the other way round
    assert_eq!(plan_with(&t, &Tuning { row_threads: Some(512), ..heuristic }, &GpuTarget::h100()).lanes, 256);
    let (p, k) = pointwise_n(1 << 20, DType::BF16);
    let t = build_kernel(&p, &k);
    assert_eq!(
        plan_with(&t, &Tuning { looped_threads: Some(512), ..heuristic }, &GpuTarget::h100()),
        launch::plan(&t, &GpuTarget::h100())
    );
    let pl = plan_with(&t, &Tuning { pointwise_vec: Some(2), ..heuristic }, &GpuTarget::h100());
    assert_eq!((pl.vec, pl.launch.block, pl.launch.grid), (2, 256, 2048));
}

#[test]
fn autotuning_candidates_only_where_the_heuristic_is_unsure() {
    use launch::{candidates, Tuning};
    let tunings =
        |k: &TileKernel| -> Vec<String> { candidates(k, &GpuTarget::h100()).iter().map(Tuning::to_string).collect() };
    let of = |(p, k): (LoopProgram, FusedKernel)| build_kernel(&p, &k);
    // none: pointwise, a warp per row of at most 32 groups, column reductions
    assert_eq!(tunings(&of(pointwise_n(1 << 20, DType::BF16))), ["heuristic"]);
    assert_eq!(tunings(&of(softmax(300, 128, KernelKind::PersistentReduction, "s"))), ["heuristic"]);
    // rows of more groups than a warp's lanes: a warp per row, 64 and 128 threads (each with
    // fewer than two threads per group)
    assert_eq!(tunings(&of(softmax(300, 256, KernelKind::PersistentReduction, "s"))), ["heuristic", "row_threads=32"]);
    let many = of(softmax(40000, 768, KernelKind::PersistentReduction, "s"));
    assert_eq!(tunings(&many), ["heuristic", "row_threads=64", "row_threads=128"]);
    assert_eq!(tunings(&of(col_sum(8192, 64, KernelKind::PersistentReduction))), ["heuristic"]);
    assert_eq!(tunings(&of(col_sum(3000, 96, KernelKind::LoopedReduction))), ["heuristic"]);
    // a block per row (192 threads): half (whole warps) and double
    let ln = of(layer_norm(37, 1536, KernelKind::PersistentReduction));
    assert_eq!(tunings(&ln), ["heuristic", "row_threads=96", "row_threads=384"]);
    // a cluster of 8 x 128: half and double the threads, and half the cluster with double
    let cl = of(softmax(1024, 1 << 16, KernelKind::PersistentReduction, "s"));
    assert_eq!(tunings(&cl), ["heuristic", "row_threads=64", "row_threads=256", "row_threads=256 cluster=4"]);
    // a cluster of 2 x 224 threads: half and double the threads, and one block of double
    let odd = of(softmax(3, 12289, KernelKind::PersistentReduction, "s"));
    assert_eq!(tunings(&odd), ["heuristic", "row_threads=128", "row_threads=448", "row_threads=448 cluster=1"]);
    // looped rows: the other two of 256, 512, 1024 (also for a row of symbolic length)
    let looped = of(softmax(3, 2000, KernelKind::LoopedReduction, "s"));
    assert_eq!(tunings(&looped), ["heuristic", "looped_threads=512", "looped_threads=1024"]);
    let (p, k) = online(64, None, DType::F32, Online::Softmax, false);
    assert_eq!(tunings(&build_kernel(&p, &k)), ["heuristic", "looped_threads=256", "looped_threads=512"]);

    // Every candidate generates (distinct source for each, the g++ check on them all) and is
    // a valid plan: whole warps, at most 1024 threads, every row element covered.
    let mut all = Vec::new();
    for (n, k) in
        [ln, cl, odd, looped, of(layer_norm(5, 20000, KernelKind::PersistentReduction))].into_iter().enumerate()
    {
        let mut sources = Vec::new();
        for (i, t) in candidates(&k, &GpuTarget::h100()).iter().enumerate() {
            let pl = launch::plan_with(&k, t, &GpuTarget::h100());
            let groups = k.rnumel.unwrap().const_value().unwrap() as usize / pl.vec;
            assert!(pl.lanes.is_multiple_of(32) && pl.launch.block <= 1024, "{} with {t}: {pl:?}", k.name);
            if k.kind == KernelKind::PersistentReduction {
                assert!(pl.chunks * pl.row_threads() >= groups && pl.row_threads() <= groups, "{} with {t}", k.name);
            }
            let mut renamed = k.clone();
            renamed.name = format!("{}_{n}_{i}", k.name);
            sources.push(emit_cuda_with(std::slice::from_ref(&k), t, &GpuTarget::h100()).unwrap().source);
            let unit = emit_cuda_with(std::slice::from_ref(&renamed), t, &GpuTarget::h100()).unwrap().source;
            // the kernel without its unit's prelude: one prelude for them all
            all.push(unit[unit.find(&format!("\n/* {}:", renamed.name)).expect("a kernel header")..].to_string());
        }
        let mut distinct = sources.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), sources.len(), "{}", k.name);
        assert!(sources.len() <= 1 + launch::MAX_CANDIDATES);
        // the heuristic's candidate is what `emit_cuda` generates
        assert_eq!(sources[0], emit_cuda(std::slice::from_ref(&k)).unwrap().source);
    }
    syntax_check(&format!("{}{}", prelude(), all.concat()));
}
