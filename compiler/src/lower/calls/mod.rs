//! A builtin call lowered to IR operations, one arm a [`Builtin`]: `args`
//! matches the call's arguments to the builtin's signature, `attention`
//! lowers `attention(…)`.

mod args;
mod attention;

use crate::builtins::{Builtin, CollapseMode, GeluForm, Reduction};
use crate::codes::Code;
use crate::diag::{suggest, Diagnostic};
use crate::ir::*;
use crate::lower::{Lowerer, Operand};
use args::{match_args, Args};
use attnc_grammar::ast::{Arg, Expr, Ident};

pub(crate) fn lower_call(l: &mut Lowerer, call: &Expr, func: &Ident, args: &[Arg]) -> Option<Operand> {
    let Some(builtin) = Builtin::from_name(&func.name) else {
        let mut d = Diagnostic::error(Code::UnknownFunction, format!("unknown function `{}`", func.name))
            .at(func.span, "not a builtin");
        if let Some(s) = suggest(&func.name, Builtin::ALL.iter().map(|b| b.name())) {
            d = d.hint(format!("did you mean `{s}`?"));
        }
        l.diags.push(d);
        return None;
    };
    let args = match_args(l, call, func, builtin.signature(), args)?;
    lower(l, call, builtin, &args).map(Operand::Tensor)
}

fn lower(l: &mut Lowerer, call: &Expr, builtin: Builtin, args: &Args) -> Option<NodeId> {
    let span = call.span;
    match builtin {
        Builtin::SplitHeads => {
            let (x, heads) = (args.tensor(l, 0), args.size(l, 1));
            l.add(Op::SplitHeads { x: x?, heads: heads? }, span, &args.spans(&[0]))
        }
        Builtin::MergeHeads => {
            let x = args.tensor(l, 0)?;
            l.add(Op::MergeHeads { x }, span, &args.spans(&[0]))
        }
        Builtin::MixHeads => {
            let (x, alpha) = (args.tensor(l, 0), args.tensor(l, 1));
            l.add(Op::MixHeads { x: x?, alpha: alpha? }, span, &args.spans(&[0, 1]))
        }
        Builtin::Concat => {
            let (a, b) = (args.tensor(l, 0), args.tensor(l, 1));
            let (a, b) = (a?, b?);
            let rank = l.nodes[a.0 as usize].shape.rank();
            let axis = args.axis(l, 2, rank)?;
            l.add(Op::Concat { a, b, axis }, span, &args.spans(&[0, 1]))
        }
        Builtin::Interleave => {
            let x = args.tensor(l, 0)?;
            l.add(Op::Interleave { x }, span, &args.spans(&[0]))
        }
        Builtin::Deinterleave => {
            let (x, pseudo) = (args.tensor(l, 0), args.size(l, 1));
            l.add(Op::Deinterleave { x: x?, pseudo: pseudo? }, span, &args.spans(&[0]))
        }
        Builtin::Collapse => {
            let (x, r) = (args.tensor(l, 0), args.tensor(l, 1));
            let mode = args.choice::<CollapseMode>(l, 2).map(|m| m.unwrap_or(CollapseMode::Global));
            let (x, r, mode) = (x?, r?, mode?);
            let r = match mode {
                CollapseMode::PerHead => {
                    let pseudo = l.nodes[x.0 as usize].shape.0.get(2).and_then(Dim::as_known).unwrap_or(0);
                    l.add(Op::BlockDiag { r, block: pseudo }, span, &args.spans(&[1]))?
                }
                CollapseMode::Global => r,
            };
            l.add(Op::Collapse { x, r }, span, &args.spans(&[0, 1]))
        }
        Builtin::Rope => {
            let (x, offset) = (args.tensor(l, 0), args.dim(l, 2));
            let (x, offset) = (x?, offset?);
            match args.opt_float(l, 1)? {
                None => Some(x),
                Some(base) if base > 0.0 => l.add(Op::Rope { x, base, offset }, span, &args.spans(&[0])),
                Some(base) => {
                    l.diags.push(
                        Diagnostic::error(Code::BadSize, format!("the rope base must be positive, not {base}"))
                            .at(args.span(1), "this base"),
                    );
                    None
                }
            }
        }
        Builtin::Attention => attention::lower(l, call, args),
        Builtin::Gelu => {
            let x = args.tensor(l, 0);
            let form = args.choice::<GeluForm>(l, 1).map(|f| f.unwrap_or(GeluForm::None));
            let op = match form? {
                GeluForm::None => UnaryOp::Gelu,
                GeluForm::Tanh => UnaryOp::GeluTanh,
            };
            l.add(Op::Unary { op, x: x? }, span, &args.spans(&[0]))
        }
        Builtin::Math(m) => {
            let x = args.tensor(l, 0)?;
            l.add(Op::Unary { op: m.op(), x }, span, &args.spans(&[0]))
        }
        Builtin::Pairwise(f) => {
            let (a, b) = (args.number_or_tensor(l, 0), args.number_or_tensor(l, 1));
            l.add(Op::Binary { op: f.op(), a: a?, b: b? }, span, &args.spans(&[0, 1]))
        }
        Builtin::Clamp => {
            let (x, lo, hi) = (args.number_or_tensor(l, 0), args.number_or_tensor(l, 1), args.number_or_tensor(l, 2));
            let spans = args.spans(&[0, 1, 2]);
            let low = l.add(Op::Binary { op: BinaryOp::Max, a: x?, b: lo? }, span, &spans[..2])?;
            l.add(Op::Binary { op: BinaryOp::Min, a: low, b: hi? }, span, &[spans[0], spans[2]])
        }
        Builtin::Where => {
            let (c, a, b) = (args.number_or_tensor(l, 0), args.number_or_tensor(l, 1), args.number_or_tensor(l, 2));
            l.add(Op::Where { cond: c?, a: a?, b: b? }, span, &args.spans(&[0, 1, 2]))
        }
        Builtin::Reduce(r) => {
            let x = args.tensor(l, 0)?;
            let rank = l.nodes[x.0 as usize].shape.rank();
            let axes = args.axes(l, 1, rank);
            let bessel = if r.has_bessel() { args.opt_bool(l, 2, false) } else { Some(false) };
            let keepdim = args.opt_bool(l, if r.has_bessel() { 3 } else { 2 }, true);
            let (axes, bessel, keepdim) = (axes?, bessel?, keepdim?);
            let reduced = l.add(Op::Reduce { x, kind: r.kind(bessel), axes, keepdim }, span, &args.spans(&[0]))?;
            match r {
                Reduction::Std => l.add(Op::Unary { op: UnaryOp::Sqrt, x: reduced }, span, &[]),
                _ => Some(reduced),
            }
        }
        Builtin::LooMean => {
            let x = args.tensor(l, 0)?;
            let rank = l.nodes[x.0 as usize].shape.rank();
            let axis = args.axis(l, 1, rank)?;
            l.add(Op::LooMean { x, axis }, span, &args.spans(&[0]))
        }
        Builtin::Thresholds => {
            let (x, levels) = (args.tensor(l, 0), args.size(l, 1));
            l.add(Op::Thresholds { x: x?, levels: levels? }, span, &args.spans(&[0]))
        }
        Builtin::Vector => {
            let length = args.size(l, 1)?;
            let fill = args.opt_float(l, 2)?.unwrap_or(1.0);
            let values = match args.numbers(l, 0)? {
                None => vec![fill; length as usize],
                Some((values, _)) if values.len() as u64 == length => values,
                Some((values, at)) => {
                    l.diags.push(
                        Diagnostic::error(
                            Code::ShapeMismatch,
                            format!("`vector` needs {length} values, but the list has {}", values.len()),
                        )
                        .at(at, format!("{} values", values.len())),
                    );
                    return None;
                }
            };
            let shape = vec![values.len() as u64];
            l.add(Op::Constant { values, shape }, span, &[])
        }
        Builtin::Eye => {
            let rows = args.size(l, 0)?;
            let cols = if args.given(1) { args.size(l, 1)? } else { rows };
            let offset = args.opt_int(l, 2)?.unwrap_or(0);
            let values = (0..rows * cols).map(|x| f64::from((x % cols) as i64 == (x / cols) as i64 + offset)).collect();
            l.add(Op::Constant { values, shape: vec![rows, cols] }, span, &[])
        }
    }
}
