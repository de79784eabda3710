//! The builtin tensor functions: one table of signatures (for argument
//! matching and suggestions) and the lowering of each call to IR operations.

use super::{positions, Binding, Lowerer, Operand};
use crate::codes::Code;
use crate::diag::{suggest, Diagnostic};
use crate::ir::*;
use crate::value::{unknown_name, Value};
use attnc_grammar::ast::{Arg, Expr, ExprKind, Ident, TypeKind};

pub struct Signature {
    pub name: &'static str,
    /// Parameter names, positional order; the first `required` must be given.
    pub params: &'static [&'static str],
    pub required: usize,
    pub summary: &'static str,
}

/// `attention`'s `mask =` values and what each means: `flat_causal` (causal
/// over the flattened positions) is the causal mask.
const MASKS: [(&str, MaskKind); 4] = [
    ("none", MaskKind::None),
    ("causal", MaskKind::Causal),
    ("flat_causal", MaskKind::Causal),
    ("token_causal", MaskKind::TokenCausal),
];

/// The builtin table as `docs/language.md` shows it (a test keeps that page current).
pub fn markdown_table() -> String {
    let mut out = String::from("| builtin | arguments (required first) | meaning |\n|---|---|---|\n");
    for b in BUILTINS {
        let args: Vec<String> = b
            .params
            .iter()
            .enumerate()
            .map(|(i, p)| if i < b.required { format!("`{p}`") } else { format!("`{p}`?") })
            .collect();
        out.push_str(&format!("| `{}` | {} | {} |\n", b.name, args.join(", "), b.summary.replace('|', "\\|")));
    }
    out
}

#[rustfmt::skip]
pub const BUILTINS: &[Signature] = &[
    Signature { name: "split_heads",  params: &["x", "heads"], required: 2, summary: "[.., S, H*d] -> [.., H, S, d]" },
    Signature { name: "merge_heads",  params: &["x"], required: 1, summary: "[.., H, S, d] -> [.., S, H*d]" },
    Signature { name: "mix_heads",    params: &["x", "alpha"], required: 2, summary: "x [B, M, S, d], alpha [M, H, P] -> [B, H, P, S, d]" },
    Signature { name: "interleave",   params: &["x"], required: 1, summary: "[B, H, P, S, d] -> [B, H, S*P, d], row s*P + j" },
    Signature { name: "deinterleave", params: &["x", "pseudo"], required: 2, summary: "[B, H, S*P, d] -> [B, H, P, S, d]" },
    Signature { name: "collapse",     params: &["x", "r", "mode"], required: 2, summary: "x [B, H', P, S, d], r [H, H'*P] -> [B, H, S, d]; mode global | per_head" },
    Signature { name: "rope",         params: &["x", "base", "offset"], required: 1, summary: "rotary embedding at position offset + row index; base none = identity; offset a size of dims (default 0)" },
    Signature { name: "concat",       params: &["a", "b", "axis"], required: 3, summary: "a and b joined along axis (negative counts from the end); their other axes equal" },
    Signature { name: "attention",    params: &["q", "k", "v", "mask", "window", "block", "scale", "score", "mix_logits", "mix_probs", "lengths", "window_left", "window_right", "pages"], required: 3, summary: "softmax(score(q kᵀ · scale) + mask) v; mask a name or a function of (b, h, i, j) to bool, score a function of (s, b, h, i, j); mix_logits [H_q, H_s] mixes heads' logits before the softmax, mix_probs [H_s, H_o] its probabilities after (Talking-Heads); lengths [B] each sequence's key count (its queries the last rows); window_left, window_right: keys p - left ..= p + right of query position p; pages [B, MP] a block table into k, v caches [NB, PS, H_kv, d]" },
    Signature { name: "sqrt",         params: &["x"], required: 1, summary: "elementwise square root" },
    Signature { name: "abs",          params: &["x"], required: 1, summary: "elementwise absolute value" },
    Signature { name: "exp",          params: &["x"], required: 1, summary: "elementwise e^x" },
    Signature { name: "log",          params: &["x"], required: 1, summary: "elementwise natural logarithm" },
    Signature { name: "log1p",        params: &["x"], required: 1, summary: "elementwise log(1 + x), exact near 0" },
    Signature { name: "tanh",         params: &["x"], required: 1, summary: "elementwise hyperbolic tangent" },
    Signature { name: "sigmoid",      params: &["x"], required: 1, summary: "elementwise 1 / (1 + e^-x)" },
    Signature { name: "softplus",     params: &["x"], required: 1, summary: "elementwise log(1 + e^x)" },
    Signature { name: "silu",         params: &["x"], required: 1, summary: "elementwise x * sigmoid(x)" },
    Signature { name: "gelu",         params: &["x", "approximate"], required: 1, summary: "elementwise x * Phi(x); approximate = none or tanh" },
    Signature { name: "erf",          params: &["x"], required: 1, summary: "elementwise error function" },
    Signature { name: "sin",          params: &["x"], required: 1, summary: "elementwise sine" },
    Signature { name: "cos",          params: &["x"], required: 1, summary: "elementwise cosine" },
    Signature { name: "floor",        params: &["x"], required: 1, summary: "elementwise round down" },
    Signature { name: "ceil",         params: &["x"], required: 1, summary: "elementwise round up" },
    Signature { name: "sign",         params: &["x"], required: 1, summary: "elementwise -1, 0 or 1" },
    Signature { name: "pow",          params: &["a", "b"], required: 2, summary: "elementwise a^b, broadcasting" },
    Signature { name: "clamp",        params: &["x", "lo", "hi"], required: 3, summary: "elementwise min(max(x, lo), hi), broadcasting" },
    Signature { name: "maximum",      params: &["a", "b"], required: 2, summary: "elementwise maximum, broadcasting" },
    Signature { name: "minimum",      params: &["a", "b"], required: 2, summary: "elementwise minimum, broadcasting" },
    Signature { name: "where",        params: &["cond", "a", "b"], required: 3, summary: "elementwise cond != 0 ? a : b, broadcasting" },
    Signature { name: "sum",          params: &["x", "axis", "keepdim"], required: 2, summary: "sum over an axis (or `all`)" },
    Signature { name: "mean",         params: &["x", "axis", "keepdim"], required: 2, summary: "mean over an axis (or `all`)" },
    Signature { name: "max",          params: &["x", "axis", "keepdim"], required: 2, summary: "maximum over an axis (or `all`)" },
    Signature { name: "min",          params: &["x", "axis", "keepdim"], required: 2, summary: "minimum over an axis (or `all`)" },
    Signature { name: "count",        params: &["x", "axis", "keepdim"], required: 2, summary: "number of non-zero entries over an axis (or `all`)" },
    Signature { name: "var",          params: &["x", "axis", "bessel", "keepdim"], required: 2, summary: "variance over an axis; bessel divides by n - 1" },
    Signature { name: "std",          params: &["x", "axis", "bessel", "keepdim"], required: 2, summary: "standard deviation over an axis; bessel divides by n - 1" },
    Signature { name: "loo_mean",     params: &["x", "axis"], required: 2, summary: "leave-one-out mean along an axis (needs 2 or more entries)" },
    Signature { name: "thresholds",   params: &["x", "levels"], required: 2, summary: "ratings 1..K -> [.., K-1] indicators 1[x >= tau], tau = 2..K" },
    Signature { name: "eye",          params: &["rows", "cols", "offset"], required: 1, summary: "a constant [rows, cols] matrix (cols = rows by default), 1 where col = row + offset (0 by default), else 0" },
    Signature { name: "vector",       params: &["values", "length", "fill"], required: 2, summary: "a constant vector: `values`, or `length` copies of `fill` when values is none" },
];

/// The arguments of one call, matched to the signature's parameters.
struct Args<'e> {
    func: &'static Signature,
    values: Vec<Option<(Operand, &'e Expr)>>,
    /// Arguments given as functions (`|a, b| …`), where `FUNCTION_PARAMS` allows.
    functions: Vec<Option<&'e Expr>>,
    /// Arguments that are sizes of dims (`(N - 1) * P`), where `SIZE_PARAMS` allows.
    sizes: Vec<Option<&'e Expr>>,
}

/// The (builtin, parameter) pairs that take a size of dims, kept symbolic.
const SIZE_PARAMS: [(&str, &str); 1] = [("rope", "offset")];

/// The (builtin, parameter) pairs that take a function.
const FUNCTION_PARAMS: [(&str, &str); 2] = [("attention", "mask"), ("attention", "score")];

/// `attention`'s `lengths =` (argument 10) or `pages =` (13): an input of
/// integers (the host checks its values before a run), `[B]` or `[B, MP]`
/// with `q`'s batch `B`.
fn serving_table(l: &mut Lowerer, args: &Args, i: usize, q: NodeId) -> Option<NodeId> {
    let t = args.tensor(l, i)?;
    let (span, name) = (args.values[i].as_ref().unwrap().1.span, args.func.params[i]);
    let node = &l.nodes[t.0 as usize];
    let declared = |l: &Lowerer| match node.op {
        Op::Input { index } => matches!(l.inputs[index].domain, Domain::Integers { .. }),
        _ => false,
    };
    let (example, what) = match i {
        10 => ("input lengths: [B] in integers(0, N)", "one key count a sequence"),
        _ => ("input pages: [B, MP] in integers(0, NB - 1)", "a row of page indices a sequence"),
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
    let rank = if i == 10 { 1 } else { 2 };
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

pub(crate) fn lower_call(l: &mut Lowerer, call: &Expr, func: &Ident, args: &[Arg]) -> Option<Operand> {
    let Some(sig) = BUILTINS.iter().find(|s| s.name == func.name) else {
        let mut d = Diagnostic::error(Code::UnknownFunction, format!("unknown function `{}`", func.name))
            .at(func.span, "not a builtin");
        if let Some(s) = suggest(&func.name, BUILTINS.iter().map(|s| s.name)) {
            d = d.hint(format!("did you mean `{s}`?"));
        }
        l.diags.push(d);
        return None;
    };
    let args = match_args(l, call, func, sig, args)?;
    let out = match sig.name {
        "split_heads" => {
            let (x, heads) = (args.tensor(l, 0), args.size(l, 1));
            l.add(Op::SplitHeads { x: x?, heads: heads? }, call.span, &args.spans(&[0]))
        }
        "merge_heads" => {
            let x = args.tensor(l, 0)?;
            l.add(Op::MergeHeads { x }, call.span, &args.spans(&[0]))
        }
        "mix_heads" => {
            let (x, alpha) = (args.tensor(l, 0), args.tensor(l, 1));
            l.add(Op::MixHeads { x: x?, alpha: alpha? }, call.span, &args.spans(&[0, 1]))
        }
        "concat" => {
            let (a, b) = (args.tensor(l, 0), args.tensor(l, 1));
            let (a, b) = (a?, b?);
            let rank = l.nodes[a.0 as usize].shape.rank();
            let axis = args.axes(l, 2, rank)?;
            match axis[..] {
                [axis] => l.add(Op::Concat { a, b, axis }, call.span, &args.spans(&[0, 1])),
                _ => {
                    args.wrong(l, 2, "a single axis");
                    None
                }
            }
        }
        "interleave" => {
            let x = args.tensor(l, 0)?;
            l.add(Op::Interleave { x }, call.span, &args.spans(&[0]))
        }
        "deinterleave" => {
            let (x, pseudo) = (args.tensor(l, 0), args.size(l, 1));
            l.add(Op::Deinterleave { x: x?, pseudo: pseudo? }, call.span, &args.spans(&[0]))
        }
        "collapse" => {
            let (x, r) = (args.tensor(l, 0), args.tensor(l, 1));
            let mode = args.choice(l, 2, &["global", "per_head"]).unwrap_or(Some("global"));
            let (x, r, mode) = (x?, r?, mode?);
            let r = if mode == "per_head" {
                let pseudo = l.nodes[x.0 as usize].shape.0.get(2).and_then(Dim::as_known).unwrap_or(0);
                l.add(Op::BlockDiag { r, block: pseudo }, call.span, &args.spans(&[1]))?
            } else {
                r
            };
            l.add(Op::Collapse { x, r }, call.span, &args.spans(&[0, 1]))
        }
        "rope" => {
            let (x, offset) = (args.tensor(l, 0), args.dim(l, 2));
            let (x, offset) = (x?, offset?);
            match args.opt_float(l, 1)? {
                None => Some(x),
                Some(base) if base > 0.0 => l.add(Op::Rope { x, base, offset }, call.span, &args.spans(&[0])),
                Some(base) => {
                    let span = args.values[1].as_ref().unwrap().1.span;
                    l.diags.push(
                        Diagnostic::error(Code::BadSize, format!("the rope base must be positive, not {base}"))
                            .at(span, "this base"),
                    );
                    None
                }
            }
        }
        "attention" => {
            let (q, k, v) = (args.tensor(l, 0), args.tensor(l, 1), args.tensor(l, 2));
            let mut captures = vec![];
            let mask_fn = args.function(l, 3, FuncKind::Mask, &mut captures);
            let score_fn = args.function(l, 7, FuncKind::Score, &mut captures);
            let mask = match mask_fn {
                Some(Some(_)) => Some("none"),
                _ => args.choice(l, 3, &MASKS.map(|(name, _)| name)).unwrap_or(Some("none")),
            };
            let window = args.opt_size(l, 4);
            let block = if args.values[5].is_some() { args.size(l, 5) } else { Some(1) };
            let scale = args.opt_float(l, 6);
            let (q, k, v, mask, window, block, scale) = (q?, k?, v?, mask?, window?, block?, scale?);
            let (mask_fn, score_fn) = (mask_fn?, score_fn?);
            // Head mixing: the matrices are captures, as the functions' reads.
            let mut mix = HeadMix::default();
            for (slot, i) in [(&mut mix.logits, 8), (&mut mix.probs, 9)] {
                if args.values[i].is_some() {
                    let t = args.tensor(l, i)?;
                    if captures.contains(&t) {
                        let span = args.values[i].as_ref().unwrap().1.span;
                        l.diags.push(
                            Diagnostic::error(Code::TypeMismatch, "this tensor is already read by this attention")
                                .at(span, "read again here")
                                .hint("a tensor may be one of `mix_logits`, `mix_probs` and a function's reads, not two: pass a copy (`x * 1.0`)"),
                        );
                        return None;
                    }
                    captures.push(t);
                    *slot = Some(captures.len() - 1);
                }
            }
            let (left, right) = (args.opt_count(l, 11)?, args.opt_count(l, 12)?);
            for (w, given) in [(4, window.is_some()), (11, left.is_some()), (12, right.is_some())] {
                if let (Some(_), true) = (&mask_fn, given) {
                    let span = args.values[w].as_ref().unwrap().1.span;
                    l.diags.push(
                        Diagnostic::error(Code::TypeMismatch, "a window applies to the built-in masks")
                            .at(span, "with a mask function")
                            .hint("write the window into the mask function, e.g. `i - j < 128`"),
                    );
                    return None;
                }
            }
            // `choice` accepted one of MASKS' names.
            let kind = MASKS.iter().find(|(name, _)| *name == mask)?.1;
            let lengths = match args.values[10] {
                Some(_) => {
                    let t = serving_table(l, &args, 10, q)?;
                    Some(captures.iter().position(|c| *c == t).unwrap_or_else(|| {
                        captures.push(t);
                        captures.len() - 1
                    }))
                }
                None => None,
            };
            // A paged cache: its rows gathered in sequence order (`Op::Paged`).
            let (k, v) = match args.values[13] {
                Some(_) => {
                    let t = serving_table(l, &args, 13, q)?;
                    let spans = args.spans(&[1, 13]);
                    let k = l.add(Op::Paged { cache: k, pages: t }, call.span, &spans)?;
                    let spans = args.spans(&[2, 13]);
                    (k, l.add(Op::Paged { cache: v, pages: t }, call.span, &spans)?)
                }
                None => (k, v),
            };
            let pos = positions::Positions { lengths, left, right };
            let (mut mask, mut mask_fn) = (Mask { kind, window, block }, mask_fn);
            if pos.any() {
                if block != 1 {
                    let span = args.values[5].as_ref().unwrap().1.span;
                    l.diags.push(
                        Diagnostic::error(
                            Code::TypeMismatch,
                            "`lengths`, `window_left` and `window_right` count rows one a token",
                        )
                        .at(span, "with blocks of rows")
                        .hint("drop `block`, or write the positions into a mask function"),
                    );
                    return None;
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
            let fns = (mask_fn.is_some() || score_fn.is_some() || mixes)
                .then(|| Box::new(AttnFns { score: score_fn, mask: mask_fn, captures, mix, lengths }));
            l.add(Op::Attention { q, k, v, mask, scale, fns }, call.span, &args.spans(&[0, 1, 2]))
        }
        "gelu" => {
            let x = args.tensor(l, 0);
            let form = args.choice(l, 1, &["none", "tanh"]).unwrap_or(Some("none"));
            let op = if form? == "tanh" { UnaryOp::GeluTanh } else { UnaryOp::Gelu };
            l.add(Op::Unary { op, x: x? }, call.span, &args.spans(&[0]))
        }
        name if UnaryOp::ALL.iter().any(|op| op.name() == name) => {
            let op = *UnaryOp::ALL.iter().find(|op| op.name() == name)?;
            let x = args.tensor(l, 0)?;
            l.add(Op::Unary { op, x }, call.span, &args.spans(&[0]))
        }
        "maximum" | "minimum" | "pow" => {
            let op = match sig.name {
                "maximum" => BinaryOp::Max,
                "minimum" => BinaryOp::Min,
                "pow" => BinaryOp::Pow,
                other => unreachable!("`{other}` is not in this arm's pattern"),
            };
            let (a, b) = (args.number_or_tensor(l, 0), args.number_or_tensor(l, 1));
            l.add(Op::Binary { op, a: a?, b: b? }, call.span, &args.spans(&[0, 1]))
        }
        "clamp" => {
            let (x, lo, hi) = (args.number_or_tensor(l, 0), args.number_or_tensor(l, 1), args.number_or_tensor(l, 2));
            let spans = args.spans(&[0, 1, 2]);
            let low = l.add(Op::Binary { op: BinaryOp::Max, a: x?, b: lo? }, call.span, &spans[..2])?;
            l.add(Op::Binary { op: BinaryOp::Min, a: low, b: hi? }, call.span, &[spans[0], spans[2]])
        }
        "where" => {
            let (c, a, b) = (args.number_or_tensor(l, 0), args.number_or_tensor(l, 1), args.number_or_tensor(l, 2));
            l.add(Op::Where { cond: c?, a: a?, b: b? }, call.span, &args.spans(&[0, 1, 2]))
        }
        "sum" | "mean" | "max" | "min" | "count" | "var" | "std" => {
            let x = args.tensor(l, 0)?;
            let rank = l.nodes[x.0 as usize].shape.rank();
            let axes = args.axes(l, 1, rank);
            let has_bessel = matches!(sig.name, "var" | "std");
            let bessel = if has_bessel { args.opt_bool(l, 2, false) } else { Some(false) };
            let keepdim = args.opt_bool(l, if has_bessel { 3 } else { 2 }, true);
            let (axes, bessel, keepdim) = (axes?, bessel?, keepdim?);
            let kind = match sig.name {
                "sum" => ReduceKind::Sum,
                "mean" => ReduceKind::Mean,
                "max" => ReduceKind::Max,
                "min" => ReduceKind::Min,
                "count" => ReduceKind::Count,
                _ => ReduceKind::Var { bessel },
            };
            let r = l.add(Op::Reduce { x, kind, axes, keepdim }, call.span, &args.spans(&[0]))?;
            if sig.name == "std" {
                l.add(Op::Unary { op: UnaryOp::Sqrt, x: r }, call.span, &[])
            } else {
                Some(r)
            }
        }
        "loo_mean" => {
            let x = args.tensor(l, 0)?;
            let rank = l.nodes[x.0 as usize].shape.rank();
            match args.axes(l, 1, rank)?.as_slice() {
                [axis] => l.add(Op::LooMean { x, axis: *axis }, call.span, &args.spans(&[0])),
                _ => {
                    args.wrong(l, 1, "a single axis");
                    None
                }
            }
        }
        "thresholds" => {
            let (x, levels) = (args.tensor(l, 0), args.size(l, 1));
            l.add(Op::Thresholds { x: x?, levels: levels? }, call.span, &args.spans(&[0]))
        }
        "vector" => {
            let length = args.size(l, 1)?;
            let fill = args.opt_float(l, 2)?.unwrap_or(1.0);
            let (v, e) = args.values[0].clone()?;
            let values = match v {
                Operand::Const(Value::None) => vec![fill; length as usize],
                Operand::Const(Value::List(items)) if items.iter().all(|i| i.as_f64().is_some()) => {
                    if items.len() as u64 != length {
                        l.diags.push(
                            Diagnostic::error(
                                Code::ShapeMismatch,
                                format!("`vector` needs {length} values, but the list has {}", items.len()),
                            )
                            .at(e.span, format!("{} values", items.len())),
                        );
                        return None;
                    }
                    items.iter().filter_map(Value::as_f64).collect()
                }
                _ => {
                    args.wrong(l, 0, "a list of numbers or `none`");
                    return None;
                }
            };
            let shape = vec![values.len() as u64];
            l.add(Op::Constant { values, shape }, call.span, &[])
        }
        "eye" => {
            let rows = args.size(l, 0)?;
            let cols = if args.values[1].is_some() { args.size(l, 1)? } else { rows };
            let offset = match args.values[2].as_ref() {
                None => 0,
                Some((Operand::Const(Value::Int(v)), _)) => *v,
                Some(_) => {
                    args.wrong(l, 2, "an integer (the diagonal's offset)");
                    return None;
                }
            };
            let values = (0..rows * cols).map(|x| f64::from((x % cols) as i64 == (x / cols) as i64 + offset)).collect();
            l.add(Op::Constant { values, shape: vec![rows, cols] }, call.span, &[])
        }
        other => unreachable!("builtin `{other}` has a signature but no lowering"),
    };
    out.map(Operand::Tensor)
}

fn match_args<'e>(
    l: &mut Lowerer,
    call: &Expr,
    func: &Ident,
    sig: &'static Signature,
    args: &'e [Arg],
) -> Option<Args<'e>> {
    let mut values: Vec<Option<(Operand, &Expr)>> = vec![None; sig.params.len()];
    let mut functions: Vec<Option<&Expr>> = vec![None; sig.params.len()];
    let mut sizes: Vec<Option<&Expr>> = vec![None; sig.params.len()];
    let mut given = vec![false; sig.params.len()];
    let mut ok = true;
    let mut positional = 0;
    for a in args {
        let slot = match &a.name {
            None => {
                positional += 1;
                if positional > sig.params.len() {
                    l.diags.push(
                        Diagnostic::error(
                            Code::TooManyArguments,
                            format!(
                                "`{}` takes at most {} argument{}",
                                sig.name,
                                sig.params.len(),
                                if sig.params.len() == 1 { "" } else { "s" }
                            ),
                        )
                        .at(a.value.span, "extra argument")
                        .note(format!(
                            "`{}({})`: {}",
                            sig.name,
                            sig.params.join(", "),
                            sig.summary
                        )),
                    );
                    ok = false;
                    continue;
                }
                positional - 1
            }
            Some(name) => match sig.params.iter().position(|p| *p == name.name) {
                Some(i) => i,
                None => {
                    let mut d = Diagnostic::error(
                        Code::UnknownArgument,
                        format!("`{}` has no argument `{}`", sig.name, name.name),
                    )
                    .at(name.span, "unknown argument");
                    if let Some(s) = suggest(&name.name, sig.params.iter().copied()) {
                        d = d.hint(format!("did you mean `{s}`?"));
                    }
                    l.diags.push(d.note(format!("`{}({})`", sig.name, sig.params.join(", "))));
                    ok = false;
                    continue;
                }
            },
        };
        if given[slot] {
            l.diags.push(
                Diagnostic::error(
                    Code::RepeatedArgument,
                    format!("argument `{}` of `{}` is given twice", sig.params[slot], sig.name),
                )
                .at(a.value.span, "given again here"),
            );
            ok = false;
            continue;
        }
        given[slot] = true;
        // A bare undeclared name is an enum literal (`mask = causal`); the
        // accessors report it as an unknown name where a value was needed.
        let value = match &a.value.kind {
            ExprKind::Name(n) if !l.scope.contains_key(n) => Some(Operand::Const(Value::Enum(n.clone()))),
            _ if SIZE_PARAMS.contains(&(sig.name, sig.params[slot])) => {
                sizes[slot] = Some(&a.value);
                continue;
            }
            ExprKind::Lambda { .. } if FUNCTION_PARAMS.contains(&(sig.name, sig.params[slot])) => {
                functions[slot] = Some(&a.value);
                continue;
            }
            ExprKind::Lambda { .. } => {
                l.diags.push(
                    Diagnostic::error(
                        Code::WrongKind,
                        format!("argument `{}` of `{}` is not a function", sig.params[slot], sig.name),
                    )
                    .at(a.value.span, "a function")
                    .note("functions are arguments of `attention` only: `score = |s, b, h, i, j| ...`, `mask = |b, h, i, j| ...`"),
                );
                ok = false;
                continue;
            }
            _ => l.operand(&a.value),
        };
        match value {
            Some(v) => values[slot] = Some((v, &a.value)),
            None => ok = false,
        }
    }
    for (i, p) in sig.params.iter().enumerate().take(sig.required) {
        if !given[i] {
            l.diags.push(
                Diagnostic::error(Code::MissingArgument, format!("`{}` needs argument `{p}`", sig.name))
                    .at(call.span, "in this call")
                    .with(func.span, format!("`{}({})`", sig.name, sig.params.join(", "))),
            );
            ok = false;
        }
    }
    ok.then_some(Args { func: sig, values, functions, sizes })
}

impl Args<'_> {
    fn spans(&self, which: &[usize]) -> Vec<attnc_grammar::ast::Span> {
        which.iter().map(|&i| self.values[i].as_ref().map_or(Default::default(), |v| v.1.span)).collect()
    }

    fn wrong(&self, l: &mut Lowerer, i: usize, want: &str) {
        let (v, e) = self.values[i].as_ref().unwrap();
        if let (Operand::Const(Value::Enum(n)), ExprKind::Name(_)) = (v, &e.kind) {
            if !l.scope.contains_key(n) {
                let d = unknown_name(n, e.span, l);
                l.diags.push(d);
                return;
            }
        }
        let found = match v {
            Operand::Tensor(_) => "a tensor".to_string(),
            Operand::Const(c) => format!("{} `{c}`", c.type_name()),
        };
        let code = if matches!(v, Operand::Tensor(_)) || want.contains("tensor") {
            Code::WrongKind
        } else {
            Code::TypeMismatch
        };
        l.diags.push(
            Diagnostic::error(
                code,
                format!("argument `{}` of `{}` must be {want}, found {found}", self.func.params[i], self.func.name),
            )
            .at(e.span, "this argument"),
        );
    }

    /// An optional function of `kind`: `Some(None)` when the argument is
    /// not a function (a score must be; a mask may be a name instead);
    /// `None` when the function has errors (reported).
    fn function(&self, l: &mut Lowerer, i: usize, kind: FuncKind, captures: &mut Vec<NodeId>) -> Option<Option<Func>> {
        match (self.functions[i], &self.values[i]) {
            (Some(e), _) => super::func::lower_func(l, kind, e, captures).map(Some),
            (None, Some(_)) if kind == FuncKind::Score => {
                self.wrong(l, i, "a function `|s, b, h, i, j| ...`");
                None
            }
            _ => Some(None),
        }
    }

    /// An optional size of dims (absent: 0); `None` when it has errors (reported).
    fn dim(&self, l: &mut Lowerer, i: usize) -> Option<Dim> {
        match self.sizes[i] {
            None => Some(Dim::known(0)),
            Some(e) => l.dim_expr(e),
        }
    }

    fn tensor(&self, l: &mut Lowerer, i: usize) -> Option<NodeId> {
        match self.values[i].as_ref()? {
            (Operand::Tensor(id), _) => Some(*id),
            _ => {
                self.wrong(l, i, "a tensor");
                None
            }
        }
    }

    fn number_or_tensor(&self, l: &mut Lowerer, i: usize) -> Option<NodeId> {
        let (v, e) = self.values[i].clone()?;
        l.materialize(v, e)
    }

    /// A required integer of at least 1.
    fn size(&self, l: &mut Lowerer, i: usize) -> Option<u64> {
        match self.values[i].as_ref()? {
            (Operand::Const(Value::Int(v)), _) if *v >= 1 => Some(*v as u64),
            (Operand::Const(Value::Int(v)), e) => {
                l.diags.push(
                    Diagnostic::error(
                        Code::BadSize,
                        format!(
                            "argument `{}` of `{}` must be at least 1, not {v}",
                            self.func.params[i], self.func.name
                        ),
                    )
                    .at(e.span, "this size"),
                );
                None
            }
            _ => {
                self.wrong(l, i, "an integer");
                None
            }
        }
    }

    /// An optional count (an integer of at least 0): absent or `none` gives
    /// `Some(None)`; an error gives `None`.
    fn opt_count(&self, l: &mut Lowerer, i: usize) -> Option<Option<u64>> {
        match self.values[i].as_ref() {
            None | Some((Operand::Const(Value::None), _)) => Some(None),
            Some((Operand::Const(Value::Int(v)), _)) if *v >= 0 => Some(Some(*v as u64)),
            Some(_) => {
                self.wrong(l, i, "an integer of at least 0");
                None
            }
        }
    }

    /// An optional size: absent or `none` gives `Some(None)`; an error gives `None`.
    fn opt_size(&self, l: &mut Lowerer, i: usize) -> Option<Option<u64>> {
        match self.values[i].as_ref() {
            None | Some((Operand::Const(Value::None), _)) => Some(None),
            Some(_) => self.size(l, i).map(Some),
        }
    }

    fn opt_bool(&self, l: &mut Lowerer, i: usize, default: bool) -> Option<bool> {
        match self.values[i].as_ref() {
            None => Some(default),
            Some((Operand::Const(Value::Bool(b)), _)) => Some(*b),
            Some(_) => {
                self.wrong(l, i, "true or false");
                None
            }
        }
    }

    /// Reduction axes: an axis (negative counts from the end) or `all`.
    fn axes(&self, l: &mut Lowerer, i: usize, rank: usize) -> Option<Vec<usize>> {
        match self.values[i].as_ref()? {
            (Operand::Const(Value::Enum(n)), _) if n == "all" => Some((0..rank).collect()),
            (Operand::Const(Value::Int(a)), e) => {
                let axis = if *a < 0 { *a + rank as i64 } else { *a };
                if (0..rank as i64).contains(&axis) {
                    Some(vec![axis as usize])
                } else {
                    l.diags.push(
                        Diagnostic::error(
                            Code::RankMismatch,
                            format!("axis {a} is out of range for a tensor with {rank} axes"),
                        )
                        .at(e.span, "this axis"),
                    );
                    None
                }
            }
            _ => {
                self.wrong(l, i, "an axis (an integer or `all`)");
                None
            }
        }
    }

    fn opt_float(&self, l: &mut Lowerer, i: usize) -> Option<Option<f64>> {
        match self.values[i].as_ref() {
            None | Some((Operand::Const(Value::None), _)) => Some(None),
            Some((Operand::Const(c), _)) if c.as_f64().is_some() => Some(c.as_f64()),
            Some(_) => {
                self.wrong(l, i, "a number or `none`");
                None
            }
        }
    }

    /// One of `allowed`. When the argument is an enum parameter, every variant of its
    /// type must be allowed, so `check` catches values not bound by the defaults.
    /// `None`: reported error; `Some(None)` would not occur; absent gives the caller's default.
    fn choice(&self, l: &mut Lowerer, i: usize, allowed: &[&'static str]) -> Option<Option<&'static str>> {
        let (v, e) = self.values[i].as_ref()?;
        let list = allowed.join(", ");
        if let ExprKind::Name(n) = &e.kind {
            if let Some((Binding::Param { ty, .. }, decl)) = l.scope.get(n).cloned() {
                if let TypeKind::Enum(variants) = &ty.kind {
                    let mut ok = true;
                    for var in variants {
                        if !allowed.contains(&var.name.as_str()) {
                            l.diags.push(
                                Diagnostic::error(
                                    Code::UnknownVariant,
                                    format!(
                                        "`{}` of parameter `{n}` is not a valid `{}` of `{}`",
                                        var.name, self.func.params[i], self.func.name
                                    ),
                                )
                                .at(var.span, "this variant")
                                .with(e.span, "passed here")
                                .with(decl, "parameter declared here")
                                .note(format!("`{}` accepts {{{list}}}", self.func.params[i])),
                            );
                            ok = false;
                        }
                    }
                    if !ok {
                        return None;
                    }
                }
            }
        }
        match v {
            Operand::Const(Value::Enum(name)) => match allowed.iter().find(|a| **a == name) {
                Some(a) => Some(Some(*a)),
                None => {
                    let mut d = Diagnostic::error(
                        Code::UnknownVariant,
                        format!("`{name}` is not a valid `{}` of `{}`", self.func.params[i], self.func.name),
                    )
                    .at(e.span, "unknown variant")
                    .note(format!("`{}` accepts {{{list}}}", self.func.params[i]));
                    if let Some(s) = suggest(name, allowed.iter().copied()) {
                        d = d.hint(format!("did you mean `{s}`?"));
                    }
                    l.diags.push(d);
                    None
                }
            },
            Operand::Const(Value::None) if allowed.contains(&"none") => Some(Some("none")),
            _ => {
                self.wrong(l, i, &format!("one of {{{list}}}"));
                None
            }
        }
    }
}
