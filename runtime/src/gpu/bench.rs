//! `attnc bench`: median wall-clock time per kernel and per run after
//! warm-up, next to each kernel's roofline (FLOPs, bytes, and the fraction of
//! the target's ceiling reached), and the same numbers for CubeCL's library
//! kernels on the same device: cubek-attention for plain attention,
//! cubek-matmul for every GEMM; head mixing's forward, and attention
//! weighted otherwise than by a softmax or with a sink, against our plain
//! attention of the same sizes, timed in the same run.

use super::baseline::{time_cubek_attention, time_cubek_matmul};
use super::exec::{Gpu, GpuError};
use crate::tensor::Tensor;
use attnc_compiler::ir::MaskKind;
use attnc_compiler::opt::cost::{OpCost, Target};
use attnc_compiler::opt::format_seconds;
use attnc_compiler::plan::{AttnShape, KernelSpec, MixPass, Plan};
use std::collections::BTreeMap;
use std::fmt::Write;

pub struct KernelTiming {
    pub name: String,
    pub kind: &'static str,
    pub median: f64,
    pub work: OpCost,
    /// Prepares the weights: run once, not per call.
    pub once: bool,
}

pub struct Baseline {
    pub shape: [usize; 4],
    pub causal: bool,
    /// cubek's strategy timed (`Unit`, or `BlackboxAccelerated` on tensor cores).
    pub strategy: &'static str,
    pub ours: f64,
    pub cubek: f64,
    pub work: OpCost,
}

/// One GEMM launch against cubek-matmul at its `[m, k, n]`.
pub struct GemmBaseline {
    pub launch: String,
    pub mkn: [usize; 3],
    pub ours: f64,
    pub cubek: Result<f64, String>,
    pub work: OpCost,
}

/// An attention forward that computes more than plain attention (head
/// mixing, a weighting other than the softmax, a sink) against plain
/// attention of the same sizes, timed in the same run (`attnc bench`
/// fills it: [`plain_attention_source`]).
pub struct PlainBaseline {
    pub launch: String,
    pub ours: f64,
    /// The plain attention's kernel median, or why it was not timed.
    pub plain: Result<f64, String>,
    pub what: String,
    /// What the launch computes beyond plain attention ([`PlainSource::beyond`]).
    pub beyond: &'static str,
}

/// Plain attention of a launch's sizes: [`plain_attention_source`].
pub struct PlainSource {
    pub launch: String,
    /// A spec of plain attention alone.
    pub source: String,
    /// Its sizes, mask and window in words.
    pub what: String,
    /// What the launch computes beyond it: `head mixing`, `sink`, `sigmoid`,
    /// `linear` or `hard`.
    pub beyond: &'static str,
}

pub struct BenchReport {
    pub device: String,
    pub kernels: Vec<KernelTiming>,
    /// Median of whole calls with the weights prepared (upload of the
    /// activations, per-call launches, read-back).
    pub total: f64,
    /// Preparing the weights once (upload of weights and constants, preparation launches).
    pub prepare: f64,
    pub baseline: Option<Result<Baseline, String>>,
    pub gemms: Vec<GemmBaseline>,
    pub plain: Option<PlainBaseline>,
}

/// The backward's attention kernels: a log-sum-exp launch where the forward
/// does not write it, `dQ`, `dK` and `dV` apart or in one launch, and the
/// two launches of a tensor a score function reads.
const BACKWARD_ATTENTION: [&str; 7] = [
    "attention_lse",
    "attention_grad_q",
    "attention_grad_k",
    "attention_grad_v",
    "attention_grad_kv",
    "attention_grad_read",
    "attention_grad_read_sum",
];

impl BenchReport {
    /// The backward attention kernels' time (the log-sum-exp and the three
    /// gradients) over the forward attention kernels', and both times, in
    /// a gradient program.
    pub fn backward_ratio(&self) -> Option<(f64, f64, f64)> {
        let time = |kinds: &[&str]| -> f64 {
            self.kernels.iter().filter(|k| !k.once && kinds.contains(&k.kind)).map(|k| k.median).sum()
        };
        let (backward, forward) = (time(&BACKWARD_ATTENTION), time(&["attention"]));
        (backward > 0.0 && forward > 0.0).then_some((backward / forward, backward, forward))
    }

    /// Our attention's time over cubek-attention's, when measured.
    pub fn attention_ratio(&self) -> Option<f64> {
        match &self.baseline {
            Some(Ok(b)) => Some(b.ours / b.cubek),
            _ => None,
        }
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// The first attention forward in `plan` that computes more than plain
/// attention: head mixing (`KernelSpec::MixedAttention`), or attention
/// whose only function is its weighting or sink (docs/semantics.md §9);
/// with a spec of plain attention of the same sizes (batch, query and key
/// heads, lengths, widths, built-in mask and window; values on the key
/// heads; a softmax, no functions), where plain attention can take them.
pub fn plain_attention_source(plan: &Plan) -> Option<PlainSource> {
    plan.launches.iter().find_map(|l| {
        let (shape, beyond) = match &l.spec {
            KernelSpec::MixedAttention { shape, pass: MixPass::Forward, .. } => (shape, "head mixing"),
            KernelSpec::Attention { shape, kv: None, paged: None, .. } => {
                let f = shape.fns.as_ref()?;
                let only_weights = f.score.is_none() && f.mask.is_none() && f.mix.is_identity();
                let beyond = if f.sink.is_some() { "sink" } else { f.weights.name() };
                if !only_weights || beyond == "softmax" {
                    return None;
                }
                (shape, beyond)
            }
            _ => return None,
        };
        let AttnShape { batch, h, hk, s, sk, d, e, mask, window, block, .. } = *shape;
        if h % hk != 0 || block != 1 {
            return None;
        }
        let mask = match mask {
            MaskKind::Causal => "causal",
            MaskKind::None => "none",
            MaskKind::TokenCausal => return None,
        };
        let window = window.map_or(String::new(), |w| format!(", window = {w}"));
        let source = format!(
            "spec plain\ninput q: [{batch}, {h}, {s}, {d}]\ninput k: [{batch}, {hk}, {sk}, {d}]\n\
             input v: [{batch}, {hk}, {sk}, {e}]\noutput o = attention(q, k, v, mask = {mask}{window})\n"
        );
        let what = format!("B={batch} H={h} H_kv={hk} S={s} S_k={sk} d={d} e={e}, mask = {mask}{window}");
        Some(PlainSource { launch: l.name.clone(), source, what, beyond })
    })
}

/// Each launch's times: a median of `iters` runs after `warmup`, for the
/// launches that prepare the weights their one run, and the median of
/// whole calls; also the time to prepare the weights.
struct Timed {
    per: Vec<f64>,
    total: f64,
    prepare: f64,
}

/// How often a benchmark runs: `warmup` runs untimed, then `iters` timed.
#[derive(Clone, Copy, Debug)]
pub struct Reps {
    pub warmup: usize,
    pub iters: usize,
}

/// The medians of `plan`'s launches on `inputs` (see [`Timed`]).
fn time_launches(gpu: &Gpu, plan: &Plan, inputs: &BTreeMap<String, Tensor>, reps: Reps) -> Result<Timed, GpuError> {
    let (warmup, iters) = (reps.warmup, reps.iters.max(1));
    // The weights are prepared once (a first time to build its kernels).
    gpu.prepare(plan, inputs, None)?;
    let mut once = vec![];
    let start = std::time::Instant::now();
    let prepared = gpu.prepare(plan, inputs, Some(&mut once))?;
    gpu.sync()?;
    let prepare = start.elapsed().as_secs_f64();
    for _ in 0..warmup {
        gpu.run_prepared(plan, &prepared, inputs, None)?;
    }
    let mut per: Vec<Vec<f64>> = once.into_iter().map(|t| vec![t]).collect();
    per.resize(plan.launches.len(), vec![]);
    for _ in 0..iters {
        let mut times = vec![];
        gpu.run_prepared(plan, &prepared, inputs, Some(&mut times))?;
        for (slot, t) in per[plan.prepared()..].iter_mut().zip(times) {
            slot.push(t);
        }
    }
    let mut totals = vec![];
    for _ in 0..iters {
        let start = std::time::Instant::now();
        gpu.run_prepared(plan, &prepared, inputs, None)?;
        totals.push(start.elapsed().as_secs_f64());
    }
    Ok(Timed { per: per.into_iter().map(median).collect(), total: median(totals), prepare })
}

/// The plain attention kernel's median on `plan` (a spec of plain attention
/// alone), on `inputs`.
pub fn time_plain_attention(
    gpu: &Gpu,
    plan: &Plan,
    inputs: &BTreeMap<String, Tensor>,
    reps: Reps,
) -> Result<f64, String> {
    let timed = time_launches(gpu, plan, inputs, reps).map_err(|e| e.to_string())?;
    let at = plan.launches.iter().position(|l| matches!(l.spec, KernelSpec::Attention { .. }));
    at.map(|i| timed.per[i]).ok_or_else(|| "no attention launch in its plan".to_string())
}

pub fn bench(gpu: &Gpu, plan: &Plan, inputs: &BTreeMap<String, Tensor>, reps: Reps) -> Result<BenchReport, GpuError> {
    let Timed { per, total, prepare } = time_launches(gpu, plan, inputs, reps)?;
    let (warmup, iters) = (reps.warmup, reps.iters.max(1));
    let kernels: Vec<KernelTiming> = plan
        .launches
        .iter()
        .zip(per)
        .map(|(l, median)| KernelTiming {
            name: l.name.clone(),
            kind: l.spec.kind(),
            median,
            work: OpCost { flops: l.flops, bytes: l.bytes, launches: 1 },
            once: l.prepare,
        })
        .collect();
    // Plain attention (one query head per key/value head, no window, token-sized
    // rows, as many queries as keys, a softmax without a sink: other weightings
    // are timed against attnc's own softmax, `plain`).
    let baseline = plan.launches.iter().zip(&kernels).find_map(|(l, k)| match &l.spec {
        KernelSpec::Attention {
            shape: AttnShape { batch, h, hk, s, sk, d, e, mask, window: None, block: 1, fns, .. },
            ..
        } if h == hk
            && d == e
            && s == sk
            && *mask != MaskKind::TokenCausal
            && fns.as_ref().is_none_or(|f| f.weights.is_softmax() && f.sink.is_none()) =>
        {
            let shape = [*batch, *h, *s, *d];
            let causal = *mask == MaskKind::Causal;
            Some(
                time_cubek_attention(gpu, shape, causal, plan.dtype, warmup.max(1), iters)
                    .map(|(t, strategy)| Baseline {
                        shape,
                        causal,
                        strategy,
                        ours: k.median,
                        cubek: median(t),
                        work: k.work,
                    })
                    .map_err(|e| e.to_string()),
            )
        }
        _ => None,
    });
    // Every GEMM against cubek-matmul at its shape (each shape timed once).
    let mut cubek: BTreeMap<[usize; 3], Result<f64, String>> = BTreeMap::new();
    let mut gemms = vec![];
    for (l, k) in plan.launches.iter().zip(&kernels) {
        if let KernelSpec::MatMul { rows, k: kk, f, .. } = l.spec {
            let mkn = [rows, kk, f];
            let theirs = cubek
                .entry(mkn)
                .or_insert_with(|| {
                    time_cubek_matmul(gpu, mkn, plan.dtype, warmup.max(1), iters).map(median).map_err(|e| e.to_string())
                })
                .clone();
            gemms.push(GemmBaseline { launch: l.name.clone(), mkn, ours: k.median, cubek: theirs, work: k.work });
        }
    }
    Ok(BenchReport {
        device: format!("{} ({})", gpu.adapter, gpu.backend),
        kernels,
        total,
        prepare,
        baseline,
        gemms,
        plain: None,
    })
}

fn roofline(w: &OpCost, t: &Target) -> f64 {
    (w.flops / t.peak_flops).max(w.bytes / t.bandwidth)
}

impl BenchReport {
    /// A table: per kernel, median time, work, roofline time and the fraction of it reached.
    pub fn render(&self, target: &Target, iters: usize) -> String {
        let mut out = format!(
            "device: {}\nroofline: {} profile ({:.1} GFLOP/s f32, {:.1} GB/s); medians of {iters} runs after warm-up\n\n",
            self.device,
            target.name,
            target.peak_flops / 1e9,
            target.bandwidth / 1e9
        );
        let _ = writeln!(
            out,
            "{:<34} {:>12} {:>12} {:>12} {:>12} {:>9}",
            "kernel", "median", "GFLOP", "MB", "roofline", "of roof"
        );
        let mut sum = 0.0;
        let mut work = OpCost::default();
        for k in &self.kernels {
            if !k.once {
                sum += k.median;
                work.add(k.work);
            }
            let _ = writeln!(
                out,
                "{:<34} {:>12} {:>12.6} {:>12.6} {:>12} {:>8.2}%{}",
                k.name,
                format_seconds(k.median),
                k.work.flops / 1e9,
                k.work.bytes / 1e6,
                format_seconds(roofline(&k.work, target)),
                100.0 * roofline(&k.work, target) / k.median,
                if k.once { "  (once, prepares the weights)" } else { "" }
            );
        }
        let _ = writeln!(
            out,
            "{:<34} {:>12} {:>12.6} {:>12.6} {:>12} {:>9}",
            "all kernels per call",
            format_seconds(sum),
            work.flops / 1e9,
            work.bytes / 1e6,
            format_seconds(roofline(&work, target)),
            // A program whose work is all preparation launches nothing per call.
            if sum > 0.0 { format!("{:.2}%", 100.0 * roofline(&work, target) / sum) } else { "-".to_string() }
        );
        let _ = writeln!(
            out,
            "per call with the weights prepared (upload activations, launches, read-back): {}",
            format_seconds(self.total)
        );
        if let Some((r, backward, forward)) = self.backward_ratio() {
            let _ = writeln!(
                out,
                "backward/forward attention time ratio {r:.2} ({} in the backward's attention kernels, {} in attention)",
                format_seconds(backward),
                format_seconds(forward)
            );
        }
        let prepared = self.kernels.iter().filter(|k| k.once).count();
        let _ = writeln!(
            out,
            "preparing the weights, once (upload weights and constants, {prepared} launches): {}",
            format_seconds(self.prepare)
        );
        match &self.baseline {
            None => {}
            Some(Ok(b)) => {
                let _ = writeln!(
                    out,
                    "\ncubek-attention 0.3.1 ({}) on [B, H, S, d] = {:?}, causal = {}: attnc {} ({:.3} GFLOP/s), cubek {} ({:.3} GFLOP/s)",
                    b.strategy,
                    b.shape,
                    b.causal,
                    format_seconds(b.ours),
                    b.work.flops / b.ours / 1e9,
                    format_seconds(b.cubek),
                    b.work.flops / b.cubek / 1e9
                );
                let _ = writeln!(out, "baseline cubek-attention: attnc/cubek time ratio {:.3}", b.ours / b.cubek);
            }
            Some(Err(e)) => {
                let _ = writeln!(out, "\nbaseline: cubek-attention failed: {e}");
            }
        }
        match &self.plain {
            None => {}
            Some(PlainBaseline { launch, ours, plain: Ok(t), what, beyond }) => {
                let without = if *beyond == "head mixing" { "no mixing" } else { "a softmax, no sink" };
                let _ = writeln!(out, "\nplain attention of the same sizes ({what}; {without}), timed in this run:");
                let _ = writeln!(
                    out,
                    "{launch}: {} against plain attention's {}: {beyond}/plain attention time ratio {:.3}",
                    format_seconds(*ours),
                    format_seconds(*t),
                    ours / t
                );
            }
            Some(PlainBaseline { plain: Err(e), .. }) => {
                let _ = writeln!(out, "\nplain attention of the same sizes failed: {e}");
            }
        }
        if !self.gemms.is_empty() {
            let _ = writeln!(out, "\ncubek-matmul 0.3.1 (Strategy::Auto), per GEMM launch:");
        }
        for g in &self.gemms {
            let [m, k, n] = g.mkn;
            match &g.cubek {
                Ok(t) => {
                    let _ = writeln!(
                        out,
                        "{}: attnc {} ({:.3} GFLOP/s), cubek {} ({:.3} GFLOP/s)",
                        g.launch,
                        format_seconds(g.ours),
                        g.work.flops / g.ours / 1e9,
                        format_seconds(*t),
                        g.work.flops / t / 1e9
                    );
                    let _ =
                        writeln!(out, "baseline cubek-matmul ({m}x{k}x{n}): attnc/cubek time ratio {:.3}", g.ours / t);
                }
                Err(e) => {
                    let _ = writeln!(out, "baseline cubek-matmul ({m}x{k}x{n}) failed: {e}");
                }
            }
        }
        out
    }
}
