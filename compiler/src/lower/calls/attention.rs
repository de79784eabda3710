//! `attention(…)` lowered to `Op::Attention` (with
//! `Op::Paged` gathers for a paged cache and a mask function for lengths and
//! asymmetric windows).

use super::args::Args;
use crate::builtins::attention::*;
use crate::builtins::{MaskName, WeightsName};
use crate::codes::Code;
use crate::diag::Diagnostic;
use crate::ir::*;
use crate::lower::{positions, Lowerer};
use attnc_grammar::ast::Expr;

/// `lengths =` or `pages =`: an input of integers (the host checks its
/// values before a run), `[B]` or `[B, MP]` with `q`'s batch `B`.
fn serving_table(l: &mut Lowerer, args: &Args, i: usize, q: NodeId) -> Option<NodeId> {
    let t = args.tensor(l, i)?;
    let (span, name) = (args.span(i), args.sig.params[i].name);
    let node = &l.nodes[t.0 as usize];
    let declared = |l: &Lowerer| match node.op {
        Op::Input { index } => matches!(l.inputs[index].domain, Domain::Integers { .. }),
        _ => false,
    };
    let lengths = i == LENGTHS;
    let (example, what) = if lengths {
        ("input lengths: [B] in integers(0, N)", "one key count a sequence")
    } else {
        ("input pages: [B, MP] in integers(0, NB - 1)", "a row of page indices a sequence")
    };
    if !declared(l) {
        l.diags.push(
            Diagnostic::error(
                Code::WrongKind,
                format!("`{name}` must be an input of integers, checked before the run"),
            )
            .at(span, "not an input declared `in integers(lo, hi)`")
            .hint(format!("declare it: `{example}`")),
        );
        return None;
    }
    let batch = l.nodes[q.0 as usize].shape.0.first().cloned();
    let rank = if lengths { 1 } else { 2 };
    if batch.as_ref().is_none_or(|b| node.shape.rank() != rank || node.shape.0[0] != *b) {
        let want = batch.map_or("B".to_string(), |b| b.to_string());
        let want = if rank == 1 { format!("[{want}]") } else { format!("[{want}, MP]") };
        l.diags.push(
            Diagnostic::error(
                Code::ShapeMismatch,
                format!("`{name}` has shape {}, but attention's batch wants {want}", node.shape),
            )
            .at(span, what)
            .hint(format!("declare it: `{example}`")),
        );
        return None;
    }
    Some(t)
}

/// Reports `message` at argument `at` and gives `None`.
fn refuse(l: &mut Lowerer, args: &Args, at: usize, message: &str, label: &str, hint: &str) -> Option<NodeId> {
    l.diags.push(Diagnostic::error(Code::TypeMismatch, message).at(args.span(at), label).hint(hint));
    None
}

pub(super) fn lower(l: &mut Lowerer, call: &Expr, args: &Args) -> Option<NodeId> {
    let (q, k, v) = (args.tensor(l, Q), args.tensor(l, KEYS), args.tensor(l, VALUES));
    let mut captures = vec![];
    let mask_fn = args.function(l, MASK, &mut captures);
    let score_fn = args.function(l, SCORE, &mut captures);
    let mask = args.choice::<MaskName>(l, MASK).map(|m| m.unwrap_or(MaskName::None));
    let window = args.opt_size(l, WINDOW);
    let block = if args.given(BLOCK) { args.size(l, BLOCK) } else { Some(1) };
    let scale = args.opt_float(l, SCALE);
    let (q, k, v, mask, window, block, scale) = (q?, k?, v?, mask?, window?, block?, scale?);
    let (mask_fn, score_fn) = (mask_fn?, score_fn?);
    // Head mixing: the matrices are captures, as the functions' reads.
    let mut mix = HeadMix::default();
    for (slot, i) in [(&mut mix.logits, MIX_LOGITS), (&mut mix.probs, MIX_PROBS)] {
        if args.given(i) {
            let t = args.tensor(l, i)?;
            if captures.contains(&t) {
                return refuse(
                    l,
                    args,
                    i,
                    "this tensor is already read by this attention",
                    "read again here",
                    "a tensor may be one of `mix_logits`, `mix_probs` and a function's reads, not two: pass a copy (`x * 1.0`)",
                );
            }
            captures.push(t);
            *slot = Some(captures.len() - 1);
        }
    }
    // The weighting, and a softmax's sink (a capture, as the mixing matrices).
    let weights = args.choice::<WeightsName>(l, WEIGHTS)?.map_or(Weights::Softmax, WeightsName::weights);
    if !weights.is_softmax() && !mix.is_identity() {
        let at = if mix.logits.is_some() { MIX_LOGITS } else { MIX_PROBS };
        return refuse(
            l,
            args,
            at,
            &format!(
                "head mixing inside attention mixes a softmax's logits and probabilities, not `weights = {}`'s",
                weights.name()
            ),
            "head mixing here",
            "use `weights = softmax` with `mix_logits`/`mix_probs`, or mix the heads outside attention",
        );
    }
    let sink = match args.given(SINK) {
        true if !mix.is_identity() => {
            return refuse(
                l,
                args,
                SINK,
                "`sink` joins one head's softmax denominator, and head mixing inside attention mixes the \
                 heads' logits and probabilities around their softmaxes",
                "a sink here",
                "drop `sink`, or mix the heads outside attention",
            );
        }
        true if !weights.is_softmax() => {
            return refuse(
                l,
                args,
                SINK,
                &format!("`sink` joins a softmax's denominator, but this attention has `weights = {}`", weights.name()),
                "a sink here",
                "drop `sink`, or use `weights = softmax`",
            );
        }
        true => {
            let t = args.tensor(l, SINK)?;
            Some(captures.iter().position(|c| *c == t).unwrap_or_else(|| {
                captures.push(t);
                captures.len() - 1
            }))
        }
        false => None,
    };
    let (left, right) = (args.opt_count(l, WINDOW_LEFT)?, args.opt_count(l, WINDOW_RIGHT)?);
    for (w, given) in [(WINDOW, window.is_some()), (WINDOW_LEFT, left.is_some()), (WINDOW_RIGHT, right.is_some())] {
        if mask_fn.is_some() && given {
            return refuse(
                l,
                args,
                w,
                "a window applies to the built-in masks",
                "with a mask function",
                "write the window into the mask function, e.g. `i - j < 128`",
            );
        }
    }
    let lengths = match args.given(LENGTHS) {
        true => {
            let t = serving_table(l, args, LENGTHS, q)?;
            Some(captures.iter().position(|c| *c == t).unwrap_or_else(|| {
                captures.push(t);
                captures.len() - 1
            }))
        }
        false => None,
    };
    // A paged cache: its rows gathered in sequence order (`Op::Paged`).
    let (k, v) = match args.given(PAGES) {
        true => {
            let t = serving_table(l, args, PAGES, q)?;
            let k = l.add(Op::Paged { cache: k, pages: t }, call.span, &args.spans(&[KEYS, PAGES]))?;
            (k, l.add(Op::Paged { cache: v, pages: t }, call.span, &args.spans(&[VALUES, PAGES]))?)
        }
        false => (k, v),
    };
    let pos = positions::Positions { lengths, left, right };
    let (mut mask, mut mask_fn) = (Mask { kind: mask.kind(), window, block }, mask_fn);
    if pos.any() {
        if block != 1 {
            return refuse(
                l,
                args,
                BLOCK,
                "`lengths`, `window_left` and `window_right` count rows one a token",
                "with blocks of rows",
                "drop `block`, or write the positions into a mask function",
            );
        }
        // Ranks below 2 are left to attention's shape rules to report.
        let rows = |t: NodeId| l.nodes[t.0 as usize].shape.0.iter().rev().nth(1).cloned();
        if let (Some(m), Some(n)) = (rows(q), rows(k)) {
            mask_fn = Some(positions::mask_function(mask, &pos, &m, &n, mask_fn));
            mask = Mask { kind: MaskKind::None, window: None, block };
        }
    }
    let scale = match scale {
        Some(s) => s,
        None => match l.nodes[q.0 as usize].shape.0.last().and_then(Dim::as_known) {
            Some(d) => 1.0 / (d as f64).sqrt(),
            None => {
                l.diags.push(
                    Diagnostic::error(
                        Code::MissingArgument,
                        "the head width is symbolic, so the default scale 1/√d is unknown",
                    )
                    .at(call.span, "here")
                    .hint("pass `scale = ...`"),
                );
                return None;
            }
        },
    };
    let mixes = mix.logits.is_some() || mix.probs.is_some();
    let reweights = !weights.is_softmax() || sink.is_some();
    let fns = (mask_fn.is_some() || score_fn.is_some() || mixes || reweights)
        .then(|| Box::new(AttnFns { score: score_fn, mask: mask_fn, captures, mix, lengths, weights, sink }));
    l.add(Op::Attention { q, k, v, mask, scale, fns }, call.span, &args.spans(&[Q, KEYS, VALUES]))
}
