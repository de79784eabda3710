//! The optimizer: the IR goes into an e-graph, the rule table rewrites it
//! (folding IHA's head mixing into projection weights and its collapse into
//! the output weight, merging projections), and extraction picks the program
//! the cost model predicts cheapest on a target.
//!
//! **Architecture Invariant:** optimisation never changes meaning: every rule
//! is sound alone, the analysis asserts shapes agree when classes merge, and the
//! chosen program is never predicted slower than the original.

pub mod analysis;
pub mod cost;
mod extract;
pub mod lang;
pub mod rules;

use crate::ir::{NodeId, Program};
use analysis::{TensorAnalysis, TensorGraph};
use cost::{program_cost, Mode, ProgramCost, Target};
use egg::{Id, Runner, StopReason};
use lang::TensorLang;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

pub type DimValues = BTreeMap<String, u64>;

/// How to optimise. Limits bound every run; there is no time limit, so the
/// result never depends on the machine's speed.
#[derive(Clone, Debug)]
pub struct Config {
    pub target: Target,
    pub mode: Mode,
    pub iter_limit: usize,
    pub node_limit: usize,
    /// Record why the chosen program equals the original (slower).
    pub explain: bool,
    /// The fraction of the original's predicted time a rewritten program
    /// must save to be chosen: a roofline is not exact, so a predicted gain
    /// within its error (on lavapipe, merged projections predicted 1–2%
    /// faster at N ≥ 512 measured 7% slower) keeps the program as written.
    pub min_gain: f64,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            target: cost::H200,
            mode: Mode::Inference,
            iter_limit: 16,
            node_limit: 20_000,
            explain: false,
            min_gain: 0.05,
        }
    }
}

pub struct Optimized {
    pub original: Program,
    pub chosen: Program,
    pub original_cost: ProgramCost,
    pub chosen_cost: ProgramCost,
    /// Each rule that fired, with how many times, in name order.
    pub rules_fired: Vec<(String, usize)>,
    pub iterations: usize,
    pub egraph_nodes: usize,
    pub egraph_classes: usize,
    /// Why rewriting stopped; `hit_limit` when a limit, not saturation, stopped it.
    pub stop: String,
    pub hit_limit: bool,
    pub explanation: Option<String>,
}

struct Coster<'a> {
    dims: &'a DimValues,
    target: Target,
    mode: Mode,
    /// Whether head mixing after a GEMM's head split costs only its epilogue.
    fused: bool,
}

impl extract::NodeCost for Coster<'_> {
    fn cost(&self, g: &TensorGraph, class: Id, node: &TensorLang) -> f64 {
        if self.mode == Mode::Inference && g[class].data.weight_only {
            return 0.0;
        }
        let num = |id: Id| g[id].data.num.unwrap_or(0);
        let Some(op) = lang::to_op(node, &g.analysis.original, num, |id| NodeId(usize::from(id) as u32)) else {
            return 0.0;
        };
        let concrete = |id: Id| -> Vec<usize> {
            analysis::shape(g, id)
                .0
                .iter()
                .map(|d| d.eval(&|n| self.dims.get(n).copied()).unwrap_or(1) as usize)
                .collect()
        };
        let operands: Vec<Vec<usize>> = op.operands().iter().map(|n| concrete(Id::from(n.0 as usize))).collect();
        let mut c = cost::op_cost(&op, &concrete(class), &operands);
        if let TensorLang::MixHeads([x, _]) = node {
            if self.fused && mixes_in_gemm_epilogue(g, *x, &operands[0]) {
                // The plan mixes in the epilogue of the GEMM before the head
                // split: no launch, and the product is never read back.
                let y = operands[0].iter().product::<usize>() as f64;
                c = cost::OpCost { flops: c.flops, bytes: (c.bytes - 8.0 * y).max(0.0), launches: 0 };
            }
        }
        c.time(&self.target)
    }
}

/// Whether `mix_heads` of class `x` can be planned in a GEMM's epilogue: `x`
/// is a head split of a product (see `plan::MixEpilogue`).
fn mixes_in_gemm_epilogue(g: &TensorGraph, x: Id, x_shape: &[usize]) -> bool {
    x_shape.get(1).is_some_and(|&m| m <= crate::plan::MixEpilogue::MAX_HEADS)
        && g[x].nodes.iter().any(|n| match n {
            TensorLang::SplitHeads([y, _]) => g[*y].nodes.iter().any(|n| matches!(n, TensorLang::MatMul(_))),
            _ => false,
        })
}

pub fn optimize(p: &Program, dims: &DimValues, cfg: &Config) -> Optimized {
    let expr = lang::to_expr(p);
    let mut runner: Runner<TensorLang, TensorAnalysis> = Runner::new(TensorAnalysis::new(p))
        .with_iter_limit(cfg.iter_limit)
        .with_node_limit(cfg.node_limit)
        .with_time_limit(Duration::from_secs(1 << 32));
    if cfg.explain {
        runner = runner.with_explanations_enabled();
    }
    let mut runner = runner.with_expr(&expr).run(&rules::rules());
    let root = runner.roots[0];
    // Two extractions: one that knows the plan mixes heads in a GEMM's
    // epilogue, one that does not (the e-graph cannot see whether the plan
    // will find the GEMM right before the split). The plan's cost decides.
    let original_cost = program_cost(p, dims, &cfg.target, cfg.mode);
    // In training, a program is judged by its whole step: the cost of its
    // gradient program (forward and backward), where it has one.
    let judged = |prog: &Program, forward: &ProgramCost| -> f64 {
        match training_step_cost(prog, dims, cfg) {
            Some(step) => step.seconds,
            None => forward.seconds,
        }
    };
    let original_judged = judged(p, &original_cost);
    // Never worse than what we were given, and only a clear gain replaces it.
    let bar = original_judged * (1.0 - cfg.min_gain);
    let (mut chosen, mut chosen_cost, mut chosen_expr) = (p.clone(), original_cost.clone(), expr.clone());
    let mut chosen_judged = original_judged;
    for fused in [true, false] {
        let coster = Coster { dims, target: cfg.target, mode: cfg.mode, fused };
        let (candidate_expr, _) = extract::extract(&runner.egraph, root, &coster);
        let candidate = lang::from_expr(&candidate_expr, p);
        let candidate_cost = program_cost(&candidate, dims, &cfg.target, cfg.mode);
        let candidate_judged = judged(&candidate, &candidate_cost);
        if candidate_judged < chosen_judged.min(bar) {
            (chosen, chosen_cost, chosen_expr) = (candidate, candidate_cost, candidate_expr);
            chosen_judged = candidate_judged;
        }
    }

    let mut fired: BTreeMap<String, usize> = BTreeMap::new();
    for it in &runner.iterations {
        for (rule, n) in &it.applied {
            *fired.entry(rule.to_string()).or_default() += n;
        }
    }
    let (stop, hit_limit) = match runner.stop_reason.as_ref() {
        Some(StopReason::Saturated) => (format!("saturated after {} iterations", runner.iterations.len()), false),
        Some(StopReason::IterationLimit(n)) => {
            (format!("iteration limit ({n}) reached; best program found so far"), true)
        }
        Some(StopReason::NodeLimit(n)) => (format!("node limit ({n}) reached; best program found so far"), true),
        Some(StopReason::TimeLimit(_)) => ("time limit reached; best program found so far".into(), true),
        Some(StopReason::Other(s)) => (s.clone(), true),
        None => ("not run".into(), true),
    };
    let explanation = cfg.explain.then(|| runner.explain_equivalence(&expr, &chosen_expr).get_flat_string());
    Optimized {
        original: p.clone(),
        chosen,
        original_cost,
        chosen_cost,
        rules_fired: fired.into_iter().collect(),
        iterations: runner.iterations.len(),
        egraph_nodes: runner.egraph.total_number_of_nodes(),
        egraph_classes: runner.egraph.number_of_classes(),
        stop,
        hit_limit,
        explanation,
    }
}

/// In training mode, the cost of `p`'s gradient program (every continuous
/// input; `grad.rs`), priced by the launches of its plan as every program
/// is (weights' preparation charged per step): a training step. `None` in
/// inference, or for a program without a gradient.
pub fn training_step_cost(p: &Program, dims: &DimValues, cfg: &Config) -> Option<ProgramCost> {
    if cfg.mode != Mode::Training {
        return None;
    }
    let g = crate::grad::differentiate(p, &[]).ok()?;
    Some(cost::program_cost(&g, dims, &cfg.target, Mode::Training))
}

/// Extraction that prefers one kind of node over every other, to pull
/// rewritten forms out of the e-graph.
struct Prefer(fn(&TensorLang) -> bool);

impl extract::NodeCost for Prefer {
    fn cost(&self, _: &TensorGraph, _: Id, node: &TensorLang) -> f64 {
        match node {
            TensorLang::Num(_) | TensorLang::Input(_) | TensorLang::Outputs(_) => 0.0,
            n if (self.0)(n) => 1.0,
            _ => 2.0,
        }
    }
}

/// Programs equal to `p` by the rules, extracted to favour each rewritten
/// form in turn (folded weights, column maps, merged projections). Soundness
/// tests check every one against the interpreter.
pub fn alternatives(p: &Program, rules: &[rules::Rule]) -> Vec<Program> {
    let runner: Runner<TensorLang, TensorAnalysis> = Runner::new(TensorAnalysis::new(p))
        .with_iter_limit(12)
        .with_node_limit(5_000)
        .with_time_limit(Duration::from_secs(1 << 32))
        .with_expr(&lang::to_expr(p))
        .run(rules);
    let root = runner.roots[0];
    let prefs: [fn(&TensorLang) -> bool; 4] = [
        |n| matches!(n, TensorLang::MixCols(_) | TensorLang::CollapseRows(_)),
        |n| matches!(n, TensorLang::MixCols(_) | TensorLang::CollapseCols(_) | TensorLang::UnflattenHeads(_)),
        |n| matches!(n, TensorLang::ConcatCols(_) | TensorLang::SliceCols(_)),
        |n| matches!(n, TensorLang::MixHeads(_) | TensorLang::Collapse(_) | TensorLang::MatMul(_)),
    ];
    let mut out: Vec<Program> = Vec::new();
    for pref in prefs {
        let (expr, _) = extract::extract(&runner.egraph, root, &Prefer(pref));
        let alt = lang::from_expr(&expr, p);
        if !out.contains(&alt) {
            out.push(alt);
        }
    }
    out
}

/// Seconds in engineering units (`59.4 µs`).
pub fn format_seconds(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.3} s")
    } else if s >= 1e-3 {
        format!("{:.3} ms", s * 1e3)
    } else {
        format!("{:.3} µs", s * 1e6)
    }
}

fn summary(c: &ProgramCost) -> String {
    format!(
        "{} ({:.4} GFLOP, {:.4} MB, {} launches)",
        format_seconds(c.seconds),
        c.total.flops / 1e9,
        c.total.bytes / 1e6,
        c.total.launches
    )
}

fn costed_listing(p: &Program, c: &ProgramCost) -> String {
    let mut out = p.pretty();
    out.push_str("  cost per launch (its plan):\n");
    for (name, oc, t) in &c.launches {
        let (gf, mb) = (oc.flops / 1e9, oc.bytes / 1e6);
        let _ = writeln!(out, "    {name}: {gf:.6} GFLOP, {mb:.6} MB -> {}", format_seconds(*t));
        if let Some((_, note)) = c.tiling.iter().find(|(n, _)| n == name) {
            let _ = writeln!(out, "      tiles: {note}");
        }
    }
    for (name, oc, t) in &c.prepared {
        let (gf, mb) = (oc.flops / 1e9, oc.bytes / 1e6);
        let _ = writeln!(
            out,
            "    {name}: {gf:.6} GFLOP, {mb:.6} MB -> {} once, to prepare the weights",
            format_seconds(*t)
        );
    }
    out
}

impl Optimized {
    /// The report `attnc explain` prints.
    pub fn report(&self, target: &Target, mode: Mode, dim_values: &DimValues) -> String {
        let dims: Vec<String> = dim_values.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let mut out = format!(
            "target {} ({} mode), {}\n\n",
            target.name,
            if mode == Mode::Inference { "inference" } else { "training" },
            dims.join(" ")
        );
        let _ = writeln!(out, "original: {}", summary(&self.original_cost));
        out.push_str(&costed_listing(&self.original, &self.original_cost));
        let _ = writeln!(out, "\nchosen: {}", summary(&self.chosen_cost));
        out.push_str(&costed_listing(&self.chosen, &self.chosen_cost));
        let ratio =
            if self.chosen_cost.seconds > 0.0 { self.original_cost.seconds / self.chosen_cost.seconds } else { 1.0 };
        let _ = writeln!(out, "\npredicted speed-up: {ratio:.3}x");
        let fired: Vec<String> = self.rules_fired.iter().map(|(r, n)| format!("{r} x{n}")).collect();
        let _ = writeln!(out, "rules fired: {}", if fired.is_empty() { "none".to_string() } else { fired.join(", ") });
        let _ = writeln!(out, "e-graph: {} nodes in {} classes; {}", self.egraph_nodes, self.egraph_classes, self.stop);
        if mode == Mode::Training {
            out.push_str(&training_steps(&self.original, &self.chosen, dim_values, target));
        }
        if let Some(e) = &self.explanation {
            let _ = writeln!(out, "\nwhy the chosen program equals the original (egg explanation):\n{e}");
        }
        out
    }
}

/// Training steps: the gradient programs (`grad.rs`, every continuous
/// input) of the original and of the chosen program, which recompute the
/// forward, priced by their plans next to the forward priced the same way.
/// The optimizer chooses by these in training mode.
fn training_steps(original: &Program, chosen: &Program, dims: &DimValues, target: &Target) -> String {
    let cfg = Config { target: *target, mode: Mode::Training, ..Default::default() };
    let g = crate::grad::differentiate(original, &[]).ok();
    let grads: Vec<&str> =
        g.iter().flat_map(|g| g.outputs.iter().filter_map(|(n, _)| n.strip_prefix("grad_"))).collect();
    let mut out = format!("\ntraining: gradients of {}; the optimizer chooses by the step\n", grads.join(", "));
    for (what, p) in [("original", original), ("chosen", chosen)] {
        let Some(step) = training_step_cost(p, dims, &cfg) else {
            let why = crate::grad::differentiate(p, &[]).err().map(|e| e.message).unwrap_or_default();
            let _ = writeln!(out, "training step of the {what} program: none ({why})");
            continue;
        };
        let forward = cost::program_cost(p, dims, target, Mode::Training);
        let ratio = if forward.seconds > 0.0 { step.seconds / forward.seconds } else { 1.0 };
        let _ = writeln!(out, "training step of the {what} program (its gradient program's launches):");
        let _ = writeln!(out, "  forward: {}", summary(&forward));
        let _ = writeln!(out, "  forward + backward: {}", summary(&step));
        let _ = writeln!(out, "  the step costs {ratio:.2}x the forward");
    }
    out
}
