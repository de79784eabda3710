//! A call's arguments matched to a builtin's [`Signature`], and typed
//! accessors that report an argument of the wrong kind at its span.

use crate::builtins::{function_params, Choice, ParamKind, Signature};
use crate::codes::Code;
use crate::diag::{suggest, Diagnostic};
use crate::ir::*;
use crate::lower::{Binding, Lowerer, Operand};
use crate::value::{unknown_name, Value};
use attnc_grammar::ast::{Arg, Expr, ExprKind, Ident, Span, TypeKind};

/// The arguments of one call, matched to the signature's parameters.
pub(super) struct Args<'e> {
    pub sig: Signature,
    pub values: Vec<Option<(Operand, &'e Expr)>>,
    /// Arguments given as functions (`|a, b| …`), where the parameter's kind allows.
    functions: Vec<Option<&'e Expr>>,
    /// Arguments that are sizes of dims (`(N - 1) * P`): `ParamKind::DimSize`.
    sizes: Vec<Option<&'e Expr>>,
}

pub(super) fn match_args<'e>(
    l: &mut Lowerer,
    call: &Expr,
    func: &Ident,
    sig: Signature,
    args: &'e [Arg],
) -> Option<Args<'e>> {
    let n = sig.params.len();
    let mut values: Vec<Option<(Operand, &Expr)>> = vec![None; n];
    let mut functions: Vec<Option<&Expr>> = vec![None; n];
    let mut sizes: Vec<Option<&Expr>> = vec![None; n];
    let mut given = vec![false; n];
    let mut ok = true;
    let mut positional = 0;
    for a in args {
        let slot = match &a.name {
            None => {
                positional += 1;
                if positional > n {
                    l.diags.push(
                        Diagnostic::error(
                            Code::TooManyArguments,
                            format!("`{}` takes at most {n} argument{}", sig.name, if n == 1 { "" } else { "s" }),
                        )
                        .at(a.value.span, "extra argument")
                        .note(format!("`{}`: {}", sig.call(), sig.summary)),
                    );
                    ok = false;
                    continue;
                }
                positional - 1
            }
            Some(name) => match sig.params.iter().position(|p| p.name == name.name) {
                Some(i) => i,
                None => {
                    let mut d = Diagnostic::error(
                        Code::UnknownArgument,
                        format!("`{}` has no argument `{}`", sig.name, name.name),
                    )
                    .at(name.span, "unknown argument");
                    if let Some(s) = suggest(&name.name, sig.params.iter().map(|p| p.name)) {
                        d = d.hint(format!("did you mean `{s}`?"));
                    }
                    l.diags.push(d.note(format!("`{}`", sig.call())));
                    ok = false;
                    continue;
                }
            },
        };
        let param = sig.params[slot];
        if given[slot] {
            l.diags.push(
                Diagnostic::error(
                    Code::RepeatedArgument,
                    format!("argument `{}` of `{}` is given twice", param.name, sig.name),
                )
                .at(a.value.span, "given again here"),
            );
            ok = false;
            continue;
        }
        given[slot] = true;
        let takes_function = matches!(param.kind, ParamKind::Function(_) | ParamKind::ChoiceOrFunction(..));
        // A bare undeclared name is an enum literal (`mask = causal`); the
        // accessors report it as an unknown name where a value was needed.
        let value = match &a.value.kind {
            ExprKind::Name(n) if !l.scope.contains_key(n) => Some(Operand::Const(Value::Enum(n.clone()))),
            _ if param.kind == ParamKind::DimSize => {
                sizes[slot] = Some(&a.value);
                continue;
            }
            ExprKind::Lambda { .. } if takes_function => {
                functions[slot] = Some(&a.value);
                continue;
            }
            ExprKind::Lambda { .. } => {
                l.diags.push(
                    Diagnostic::error(
                        Code::WrongKind,
                        format!("argument `{}` of `{}` is not a function", param.name, sig.name),
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
                Diagnostic::error(Code::MissingArgument, format!("`{}` needs argument `{}`", sig.name, p.name))
                    .at(call.span, "in this call")
                    .with(func.span, format!("`{}`", sig.call())),
            );
            ok = false;
        }
    }
    ok.then_some(Args { sig, values, functions, sizes })
}

impl Args<'_> {
    pub fn given(&self, i: usize) -> bool {
        self.values[i].is_some()
    }

    /// Argument `i`'s span (the default span when it was not given).
    pub fn span(&self, i: usize) -> Span {
        self.values[i].as_ref().map_or(Default::default(), |v| v.1.span)
    }

    pub fn spans(&self, which: &[usize]) -> Vec<Span> {
        which.iter().map(|&i| self.span(i)).collect()
    }

    fn name(&self, i: usize) -> &'static str {
        self.sig.params[i].name
    }

    /// Accessors read the parameters their kind allows (a check on the
    /// lowering against its signature).
    fn expect(&self, i: usize, kinds: &[ParamKind]) {
        debug_assert!(
            kinds.contains(&self.sig.params[i].kind),
            "`{}`'s argument `{}` is declared {:?}",
            self.sig.name,
            self.name(i),
            self.sig.params[i].kind
        );
    }

    pub fn wrong(&self, l: &mut Lowerer, i: usize, want: &str) {
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
                format!("argument `{}` of `{}` must be {want}, found {found}", self.name(i), self.sig.name),
            )
            .at(e.span, "this argument"),
        );
    }

    /// An optional function: `Some(None)` when the argument is absent or not
    /// a function (a score must be; a mask may be a name instead); `None`
    /// when the function has errors (reported).
    pub fn function(&self, l: &mut Lowerer, i: usize, captures: &mut Vec<NodeId>) -> Option<Option<Func>> {
        let kind = match self.sig.params[i].kind {
            ParamKind::Function(k) | ParamKind::ChoiceOrFunction(_, k) => k,
            other => unreachable!("`{}` is declared {other:?}, not a function", self.name(i)),
        };
        match (self.functions[i], &self.values[i]) {
            (Some(e), _) => crate::lower::func::lower_func(l, kind, e, captures).map(Some),
            (None, Some(_)) if self.sig.params[i].kind.names().is_none() => {
                self.wrong(l, i, &format!("a function `|{}| ...`", function_params(kind)));
                None
            }
            _ => Some(None),
        }
    }

    /// An optional size of dims (absent: 0); `None` when it has errors (reported).
    pub fn dim(&self, l: &mut Lowerer, i: usize) -> Option<Dim> {
        self.expect(i, &[ParamKind::DimSize]);
        match self.sizes[i] {
            None => Some(Dim::known(0)),
            Some(e) => l.dim_expr(e),
        }
    }

    pub fn tensor(&self, l: &mut Lowerer, i: usize) -> Option<NodeId> {
        self.expect(i, &[ParamKind::Tensor]);
        match self.values[i].as_ref()? {
            (Operand::Tensor(id), _) => Some(*id),
            _ => {
                self.wrong(l, i, "a tensor");
                None
            }
        }
    }

    pub fn number_or_tensor(&self, l: &mut Lowerer, i: usize) -> Option<NodeId> {
        self.expect(i, &[ParamKind::Operand]);
        let (v, e) = self.values[i].clone()?;
        l.materialize(v, e)
    }

    /// A required integer of at least 1.
    pub fn size(&self, l: &mut Lowerer, i: usize) -> Option<u64> {
        self.expect(i, &[ParamKind::Size]);
        match self.values[i].as_ref()? {
            (Operand::Const(Value::Int(v)), _) if *v >= 1 => Some(*v as u64),
            (Operand::Const(Value::Int(v)), e) => {
                l.diags.push(
                    Diagnostic::error(
                        Code::BadSize,
                        format!("argument `{}` of `{}` must be at least 1, not {v}", self.name(i), self.sig.name),
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
    pub fn opt_count(&self, l: &mut Lowerer, i: usize) -> Option<Option<u64>> {
        self.expect(i, &[ParamKind::Count]);
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
    pub fn opt_size(&self, l: &mut Lowerer, i: usize) -> Option<Option<u64>> {
        match self.values[i].as_ref() {
            None | Some((Operand::Const(Value::None), _)) => Some(None),
            Some(_) => self.size(l, i).map(Some),
        }
    }

    /// An optional integer: absent gives `Some(None)`; an error gives `None`.
    pub fn opt_int(&self, l: &mut Lowerer, i: usize) -> Option<Option<i64>> {
        self.expect(i, &[ParamKind::Int]);
        match self.values[i].as_ref() {
            None => Some(None),
            Some((Operand::Const(Value::Int(v)), _)) => Some(Some(*v)),
            Some(_) => {
                self.wrong(l, i, "an integer");
                None
            }
        }
    }

    pub fn opt_bool(&self, l: &mut Lowerer, i: usize, default: bool) -> Option<bool> {
        self.expect(i, &[ParamKind::Bool]);
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
    pub fn axes(&self, l: &mut Lowerer, i: usize, rank: usize) -> Option<Vec<usize>> {
        self.expect(i, &[ParamKind::Axes]);
        match self.values[i].as_ref()? {
            (Operand::Const(Value::Enum(n)), _) if n == "all" => Some((0..rank).collect()),
            _ => self.axis_of(l, i, rank, "an axis (an integer or `all`)").map(|a| vec![a]),
        }
    }

    /// One axis (negative counts from the end).
    pub fn axis(&self, l: &mut Lowerer, i: usize, rank: usize) -> Option<usize> {
        self.expect(i, &[ParamKind::Axis]);
        self.axis_of(l, i, rank, "a single axis (an integer)")
    }

    fn axis_of(&self, l: &mut Lowerer, i: usize, rank: usize, want: &str) -> Option<usize> {
        match self.values[i].as_ref()? {
            (Operand::Const(Value::Int(a)), e) => {
                let axis = if *a < 0 { *a + rank as i64 } else { *a };
                if (0..rank as i64).contains(&axis) {
                    Some(axis as usize)
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
                self.wrong(l, i, want);
                None
            }
        }
    }

    /// An optional number: absent or `none` gives `Some(None)`; an error gives `None`.
    pub fn opt_float(&self, l: &mut Lowerer, i: usize) -> Option<Option<f64>> {
        self.expect(i, &[ParamKind::Number]);
        match self.values[i].as_ref() {
            None | Some((Operand::Const(Value::None), _)) => Some(None),
            Some((Operand::Const(c), _)) if c.as_f64().is_some() => Some(c.as_f64()),
            Some(_) => {
                self.wrong(l, i, "a number or `none`");
                None
            }
        }
    }

    /// A list of numbers, or `none` (`Some(None)`); absent or an error gives `None`.
    pub fn numbers(&self, l: &mut Lowerer, i: usize) -> Option<Option<(Vec<f64>, Span)>> {
        self.expect(i, &[ParamKind::Numbers]);
        match self.values[i].as_ref()? {
            (Operand::Const(Value::None), _) => Some(None),
            (Operand::Const(Value::List(items)), e) if items.iter().all(|i| i.as_f64().is_some()) => {
                Some(Some((items.iter().filter_map(Value::as_f64).collect(), e.span)))
            }
            _ => {
                self.wrong(l, i, "a list of numbers or `none`");
                None
            }
        }
    }

    /// One of `C`'s names: absent gives `Some(None)`, an error (reported)
    /// `None`. When the argument is an enum parameter of the spec, every
    /// variant of its type must be one of the names, so `check` catches
    /// values the defaults do not bind.
    pub fn choice<C: Choice>(&self, l: &mut Lowerer, i: usize) -> Option<Option<C>> {
        let allowed = C::NAMES;
        debug_assert_eq!(self.sig.params[i].kind.names(), Some(allowed), "`{}`'s names", self.name(i));
        let Some((v, e)) = self.values[i].as_ref() else { return Some(None) };
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
                                        var.name,
                                        self.name(i),
                                        self.sig.name
                                    ),
                                )
                                .at(var.span, "this variant")
                                .with(e.span, "passed here")
                                .with(decl, "parameter declared here")
                                .note(format!("`{}` accepts {{{list}}}", self.name(i))),
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
        let name = match v {
            Operand::Const(Value::Enum(name)) => name.as_str(),
            Operand::Const(Value::None) if allowed.contains(&"none") => "none",
            _ => {
                self.wrong(l, i, &format!("one of {{{list}}}"));
                return None;
            }
        };
        match allowed.iter().position(|a| *a == name) {
            Some(at) => Some(Some(C::ALL[at])),
            None => {
                let mut d = Diagnostic::error(
                    Code::UnknownVariant,
                    format!("`{name}` is not a valid `{}` of `{}`", self.name(i), self.sig.name),
                )
                .at(e.span, "unknown variant")
                .note(format!("`{}` accepts {{{list}}}", self.name(i)));
                if let Some(s) = suggest(name, allowed.iter().copied()) {
                    d = d.hint(format!("did you mean `{s}`?"));
                }
                l.diags.push(d);
                None
            }
        }
    }
}
