//! Lowering of score and mask functions (`|s, b, h, i, j| …`) to the typed
//! [`Func`] of `ir::func`: names resolve to the function's parameters, then
//! to the spec's parameters (constants), dims and tensors (which must be
//! indexed); every type error is a diagnostic at its span.

use super::{Binding, Lowerer};
use crate::builtins::{Builtin, Pairwise};
use crate::codes::Code;
use crate::diag::{suggest, Diagnostic};
use crate::ir::*;
use crate::value::{unknown_name, Value};
use attnc_grammar::ast::{BinOp, Expr, ExprKind, Ident, Span, UnOp};

/// Lowers `e`, which must be a function of `kind`'s parameters; tensors it
/// reads are added to `captures` (once each).
pub(crate) fn lower_func(l: &mut Lowerer, kind: FuncKind, e: &Expr, captures: &mut Vec<NodeId>) -> Option<Func> {
    let ExprKind::Lambda { params, body } = &e.kind else { unreachable!("only called on functions") };
    let want = kind.params().len();
    if params.len() != want {
        l.diags.push(
            Diagnostic::error(
                Code::TypeMismatch,
                format!("a {} function takes {want} parameters, this one takes {}", kind.name(), params.len()),
            )
            .at(e.span, format!("{} parameters", params.len()))
            .hint(format!("write `|{}| ...` (any names)", kind.param_names().join(", "))),
        );
        return None;
    }
    for (n, p) in params.iter().enumerate() {
        if let Some(first) = params[..n].iter().find(|q| q.name == p.name) {
            l.diags.push(
                Diagnostic::error(Code::Duplicate, format!("parameter `{}` is named twice", p.name))
                    .at(p.span, "again here")
                    .with(first.span, "first here"),
            );
            return None;
        }
    }
    let mut f = FuncLowerer { l, kind, params, captures };
    let (body_expr, ty) = f.expr(body)?;
    let body_expr = match (kind.result(), ty) {
        (FType::Float, FType::Int) => FExpr::ToFloat(Box::new(body_expr)),
        (want, got) if want == got => body_expr,
        (want, got) => {
            let hint = match kind {
                FuncKind::Score => "a score function returns the new score, a number",
                FuncKind::Mask => "a mask function returns true where query `i` sees key `j`, e.g. `j <= i`",
                FuncKind::Tile => unreachable!("tile functions are derived, not written"),
            };
            f.l.diags.push(
                Diagnostic::error(
                    Code::TypeMismatch,
                    format!("a {} function returns {}, this one {}", kind.name(), want.a(), got.a()),
                )
                .at(body.span, got.a())
                .hint(hint),
            );
            return None;
        }
    };
    Some(Func { kind, params: params.iter().map(|p| p.name.clone()).collect(), body: body_expr })
}

struct FuncLowerer<'a> {
    l: &'a mut Lowerer,
    kind: FuncKind,
    params: &'a [Ident],
    captures: &'a mut Vec<NodeId>,
}

type Typed = (FExpr, FType);

fn float((x, ty): Typed) -> FExpr {
    if ty == FType::Int {
        FExpr::ToFloat(Box::new(x))
    } else {
        x
    }
}

impl FuncLowerer<'_> {
    fn error(&mut self, code: Code, message: String, span: Span, label: &str) -> Option<Typed> {
        self.l.diags.push(Diagnostic::error(code, message).at(span, label));
        None
    }

    fn expr(&mut self, e: &Expr) -> Option<Typed> {
        match &e.kind {
            ExprKind::Int(v) => Some((FExpr::Int(*v), FType::Int)),
            ExprKind::Float(v) => Some((FExpr::Float(*v), FType::Float)),
            ExprKind::Bool(v) => Some((FExpr::Bool(*v), FType::Bool)),
            ExprKind::Name(n) => self.name(n, e.span),
            ExprKind::Index { base, indices } => self.read(base, indices, e.span),
            ExprKind::Unary(UnOp::Neg, x) => {
                let (x, ty) = self.expr(x)?;
                match ty {
                    FType::Bool => {
                        self.error(Code::TypeMismatch, "`-` needs a number, not a bool".into(), e.span, "here")
                    }
                    _ => Some((FExpr::Neg(Box::new(x)), ty)),
                }
            }
            ExprKind::Unary(UnOp::Not, x) => {
                let x = self.want(x, FType::Bool, "`not`")?;
                Some((FExpr::Not(Box::new(x)), FType::Bool))
            }
            ExprKind::Binary(op, a, b) => self.binary(*op, a, b, e.span),
            ExprKind::Call { func, args } => self.call(func, args, e.span),
            ExprKind::If(..) => self.error(
                Code::TypeMismatch,
                "`if` inside a function chooses per entry: write `where(cond, a, b)`".into(),
                e.span,
                "here",
            ),
            ExprKind::None | ExprKind::List(_) | ExprKind::Lambda { .. } => self.error(
                Code::TypeMismatch,
                format!("a {} function computes with numbers and bools only", self.kind.name()),
                e.span,
                "not a number or bool",
            ),
        }
    }

    /// `e` lowered and of type `ty` (ints promote to floats).
    fn want(&mut self, e: &Expr, ty: FType, what: &str) -> Option<FExpr> {
        let (x, got) = self.expr(e)?;
        match (ty, got) {
            (want, got) if want == got => Some(x),
            (FType::Float, FType::Int) => Some(FExpr::ToFloat(Box::new(x))),
            (want, got) => {
                self.l.diags.push(
                    Diagnostic::error(Code::TypeMismatch, format!("{what} needs {}, found {}", want.a(), got.a()))
                        .at(e.span, got.a()),
                );
                None
            }
        }
    }

    fn name(&mut self, n: &str, span: Span) -> Option<Typed> {
        if let Some(p) = self.params.iter().position(|p| p.name == n) {
            return Some((FExpr::Param(p), self.kind.params()[p]));
        }
        match self.l.scope.get(n).map(|b| b.0.clone()) {
            Some(Binding::Param { value, .. }) => match value {
                Value::Int(v) => Some((FExpr::Int(v), FType::Int)),
                Value::Float(v) => Some((FExpr::Float(v), FType::Float)),
                Value::Bool(v) => Some((FExpr::Bool(v), FType::Bool)),
                other => self.error(
                    Code::TypeMismatch,
                    format!("parameter `{n}` is {} `{other}`, not a number or bool", other.type_name()),
                    span,
                    "used here",
                ),
            },
            // A dim stays symbolic even with a default or a `--set` value:
            // input tensors may fix it differently, and the run's value is
            // substituted when the program runs.
            Some(Binding::Dim { .. }) => Some((FExpr::Dim(n.to_string()), FType::Int)),
            Some(Binding::Tensor { .. }) => {
                self.l.diags.push(
                    Diagnostic::error(Code::WrongKind, format!("`{n}` is a tensor: a function reads one entry of it"))
                        .at(span, "a whole tensor")
                        .hint(format!("index it, e.g. `{n}[h]` or `{n}[b, i]`")),
                );
                None
            }
            None => {
                let mut d = unknown_name(n, span, self.l);
                if let Some(s) = suggest(n, self.params.iter().map(|p| p.name.as_str())) {
                    d = d.hint(format!("did you mean the parameter `{s}`?"));
                }
                self.l.diags.push(d);
                None
            }
        }
    }

    fn read(&mut self, base: &Ident, indices: &[Expr], span: Span) -> Option<Typed> {
        let node = match self.l.scope.get(&base.name).map(|b| b.0.clone()) {
            Some(Binding::Tensor { node: Some(node) }) => node,
            Some(Binding::Tensor { node: None }) => return None,
            Some(_) => {
                return self.error(
                    Code::WrongKind,
                    format!("`{}` is not a tensor, so it cannot be indexed", base.name),
                    base.span,
                    "not a tensor",
                )
            }
            None => {
                let d = unknown_name(&base.name, base.span, self.l);
                self.l.diags.push(d);
                return None;
            }
        };
        if !matches!(self.l.nodes[node.0 as usize].op, Op::Input { .. }) {
            self.l.diags.push(
                Diagnostic::error(
                    Code::WrongKind,
                    format!("`{}` is computed by the spec; a function reads only inputs and weights", base.name),
                )
                .at(base.span, "computed with `let`")
                .hint("declare it as an `input` or `weight`"),
            );
            return None;
        }
        let rank = self.l.nodes[node.0 as usize].shape.rank();
        if indices.len() != rank {
            let shape = self.l.nodes[node.0 as usize].shape.clone();
            return self.error(
                Code::RankMismatch,
                format!("`{}` has shape {shape} ({rank} axes) but is read with {} indices", base.name, indices.len()),
                span,
                "this read",
            );
        }
        let mut idx = Vec::with_capacity(rank);
        for x in indices {
            idx.push(self.want(x, FType::Int, "an index")?);
        }
        let capture = match self.captures.iter().position(|c| *c == node) {
            Some(c) => c,
            None => {
                self.captures.push(node);
                self.captures.len() - 1
            }
        };
        Some((FExpr::Read { capture, indices: idx }, FType::Float))
    }

    fn binary(&mut self, op: BinOp, a: &Expr, b: &Expr, span: Span) -> Option<Typed> {
        let f = match op {
            BinOp::Add => FBin::Add,
            BinOp::Sub => FBin::Sub,
            BinOp::Mul => FBin::Mul,
            BinOp::Div => FBin::Div,
            BinOp::Rem => FBin::Rem,
            BinOp::Lt => FBin::Lt,
            BinOp::Le => FBin::Le,
            BinOp::Gt => FBin::Gt,
            BinOp::Ge => FBin::Ge,
            BinOp::Eq => FBin::Eq,
            BinOp::Ne => FBin::Ne,
            BinOp::And => FBin::And,
            BinOp::Or => FBin::Or,
            BinOp::MatMul => {
                return self.error(Code::TypeMismatch, "`@` multiplies tensors, not numbers".into(), span, "here")
            }
        };
        let (x, y) = (self.expr(a)?, self.expr(b)?);
        self.combine(f, x, y, span)
    }

    /// Types `op` on typed operands (promoting ints to floats where they mix).
    fn combine(&mut self, op: FBin, x: Typed, y: Typed, span: Span) -> Option<Typed> {
        let (tx, ty) = (x.1, y.1);
        let bin = |op, a, b| FExpr::Bin(op, Box::new(a), Box::new(b));
        match op {
            FBin::And | FBin::Or => {
                if tx != FType::Bool || ty != FType::Bool {
                    return self.mismatch(op, tx, ty, span, "bools");
                }
                Some((bin(op, x.0, y.0), FType::Bool))
            }
            FBin::Eq | FBin::Ne if tx == FType::Bool && ty == FType::Bool => Some((bin(op, x.0, y.0), FType::Bool)),
            _ if tx == FType::Bool || ty == FType::Bool => self.mismatch(op, tx, ty, span, "numbers"),
            FBin::FloorDiv | FBin::Rem => {
                if tx != FType::Int || ty != FType::Int {
                    return self.mismatch(op, tx, ty, span, "integers (use `floor` on floats)");
                }
                Some((bin(op, x.0, y.0), FType::Int))
            }
            _ if tx == FType::Int && ty == FType::Int && !matches!(op, FBin::Div | FBin::Pow) => {
                let out = if op.is_comparison() { FType::Bool } else { FType::Int };
                Some((bin(op, x.0, y.0), out))
            }
            _ => {
                let out = if op.is_comparison() { FType::Bool } else { FType::Float };
                Some((bin(op, float(x), float(y)), out))
            }
        }
    }

    fn mismatch(&mut self, op: FBin, a: FType, b: FType, span: Span, want: &str) -> Option<Typed> {
        self.error(
            Code::TypeMismatch,
            format!("`{}` takes {want}, not {} and {}", op.symbol(), a.a(), b.a()),
            span,
            "here",
        )
    }

    fn call(&mut self, func: &Ident, args: &[attnc_grammar::ast::Arg], span: Span) -> Option<Typed> {
        let Some(call) = Call::from_name(&func.name) else {
            let names = Builtin::ALL.iter().filter(|b| Call::of(**b).is_some()).map(|b| b.name()).chain(["floordiv"]);
            let mut d = Diagnostic::error(
                Code::UnknownFunction,
                format!("`{}` cannot be called inside a {} function", func.name, self.kind.name()),
            )
            .at(func.span, "not a function of numbers");
            if let Some(s) = suggest(&func.name, names) {
                d = d.hint(format!("did you mean `{s}`?"));
            }
            self.l.diags.push(d);
            return None;
        };
        let arity = call.arity();
        if let Some(a) = args.iter().find(|a| a.name.is_some()) {
            return self.error(
                Code::UnknownArgument,
                format!("functions called inside a {} function take positional arguments", self.kind.name()),
                a.value.span,
                "a keyword argument",
            );
        }
        if args.len() != arity {
            return self.error(
                Code::TooManyArguments,
                format!(
                    "`{}` takes {arity} argument{}, not {}",
                    func.name,
                    if arity == 1 { "" } else { "s" },
                    args.len()
                ),
                span,
                "this call",
            );
        }
        let mut xs = Vec::with_capacity(arity);
        for a in args {
            xs.push(self.expr(&a.value)?);
        }
        let mut xs = xs.into_iter();
        let mut next = || xs.next().unwrap();
        match call {
            Call::Unary(op) => {
                let (x, ty) = next();
                match (op, ty) {
                    (_, FType::Bool) => self.error(
                        Code::TypeMismatch,
                        format!("`{}` takes a number, not a bool", func.name),
                        args[0].value.span,
                        "a bool",
                    ),
                    (UnaryOp::Abs, FType::Int) => Some((FExpr::Unary(op, Box::new(x)), FType::Int)),
                    _ => Some((FExpr::Unary(op, Box::new(float((x, ty)))), FType::Float)),
                }
            }
            Call::Where => {
                let (c, a, b) = (next(), next(), next());
                if c.1 != FType::Bool {
                    return self.error(
                        Code::TypeMismatch,
                        format!("the condition of `where` is a bool, not {}", c.1.a()),
                        args[0].value.span,
                        "this condition",
                    );
                }
                let (a, b, ty) = match (a.1, b.1) {
                    (ta, tb) if ta == tb => (a.0, b.0, ta),
                    (FType::Bool, _) | (_, FType::Bool) => {
                        return self.error(
                            Code::TypeMismatch,
                            format!("`where` chooses between values of one type, not {} and {}", a.1.a(), b.1.a()),
                            span,
                            "here",
                        )
                    }
                    _ => (float(a), float(b), FType::Float),
                };
                Some((FExpr::Where(Box::new(c.0), Box::new(a), Box::new(b)), ty))
            }
            Call::Binary(op) => self.combine(op, next(), next(), span),
            Call::Clamp => {
                let (x, lo, hi) = (next(), next(), next());
                let low = self.combine(FBin::Max, x, lo, span)?;
                self.combine(FBin::Min, low, hi, span)
            }
        }
    }
}

/// What a score or mask function may call: the builtins that are
/// functions of numbers, and `floordiv`.
#[derive(Clone, Copy, Debug)]
enum Call {
    Unary(UnaryOp),
    Binary(FBin),
    Where,
    Clamp,
}

impl Call {
    fn of(builtin: Builtin) -> Option<Call> {
        Some(match builtin {
            Builtin::Math(m) => Call::Unary(m.op()),
            Builtin::Gelu => Call::Unary(UnaryOp::Gelu),
            Builtin::Pairwise(Pairwise::Maximum) => Call::Binary(FBin::Max),
            Builtin::Pairwise(Pairwise::Minimum) => Call::Binary(FBin::Min),
            Builtin::Pairwise(Pairwise::Pow) => Call::Binary(FBin::Pow),
            Builtin::Where => Call::Where,
            Builtin::Clamp => Call::Clamp,
            Builtin::SplitHeads
            | Builtin::MergeHeads
            | Builtin::MixHeads
            | Builtin::Interleave
            | Builtin::Deinterleave
            | Builtin::Collapse
            | Builtin::Rope
            | Builtin::Concat
            | Builtin::Attention
            | Builtin::Reduce(_)
            | Builtin::LooMean
            | Builtin::Thresholds
            | Builtin::Eye
            | Builtin::Vector => return None,
        })
    }

    fn from_name(name: &str) -> Option<Call> {
        match name {
            "floordiv" => Some(Call::Binary(FBin::FloorDiv)),
            _ => Builtin::from_name(name).and_then(Call::of),
        }
    }

    fn arity(self) -> usize {
        match self {
            Call::Unary(_) => 1,
            Call::Binary(_) => 2,
            Call::Where | Call::Clamp => 3,
        }
    }
}
