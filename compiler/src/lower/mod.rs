//! AST → IR. Parameters are bound first (defaults, then `--set` overrides),
//! then every statement is lowered with its shapes inferred. Problems are
//! collected, not thrown: one run reports every independent error.

mod calls;
mod func;
mod positions;
use crate::codes::Code;
use crate::diag::{suggest, Diagnostic};
use crate::ir::*;
use crate::value::{conform, eval, unknown_name, Scope, Value, SCALAR_FUNCTIONS};
use attnc_grammar::ast::{self, BinOp, Expr, ExprKind, ItemKind, Span, Type, UnOp};
use std::collections::{BTreeMap, HashSet};

/// A `--set NAME=VALUE` from the command line, before parsing.
#[derive(Clone, Debug)]
pub struct Setting {
    pub name: String,
    pub value: String,
}

impl Setting {
    /// Parses `NAME=VALUE`.
    pub fn parse(text: &str) -> Result<Setting, String> {
        let (name, value) =
            text.split_once('=').ok_or_else(|| format!("`--set {text}` must have the form NAME=VALUE"))?;
        Ok(Setting { name: name.trim().to_string(), value: value.trim().to_string() })
    }
}

/// A successfully lowered spec.
#[derive(Clone, Debug)]
pub struct Compiled {
    pub program: Program,
    /// Every parameter with its bound value, in declaration order.
    pub params: Vec<(String, Value)>,
    pub warnings: Vec<Diagnostic>,
}

#[derive(Clone, Debug)]
pub(crate) enum Binding {
    Param {
        value: Value,
        ty: Type,
    },
    Dim {
        value: Option<u64>,
    },
    /// `None` when lowering the tensor failed (its uses then report nothing more).
    Tensor {
        node: Option<NodeId>,
    },
}

/// What a tensor-level expression evaluates to.
#[derive(Clone, Debug)]
pub(crate) enum Operand {
    Tensor(NodeId),
    Const(Value),
}

pub(crate) struct Lowerer {
    pub scope: BTreeMap<String, (Binding, Span)>,
    pub diags: Vec<Diagnostic>,
    pub nodes: Vec<Node>,
    dims: Vec<DimDecl>,
    inputs: Vec<Input>,
    outputs: Vec<(String, NodeId)>,
    params: Vec<(String, Value)>,
}

impl Scope for Lowerer {
    fn lookup(&self, name: &str) -> Option<Value> {
        match &self.scope.get(name)?.0 {
            Binding::Param { value, .. } => Some(value.clone()),
            Binding::Dim { value: Some(v) } => Some(Value::Int(*v as i64)),
            _ => None,
        }
    }
    fn names(&self) -> Vec<String> {
        self.scope.keys().cloned().collect()
    }
}

/// Lower a parsed spec under the given settings.
pub fn lower(spec: &ast::Spec, settings: &[Setting]) -> Result<Compiled, Vec<Diagnostic>> {
    let mut l = Lowerer {
        scope: BTreeMap::new(),
        diags: vec![],
        nodes: vec![],
        dims: vec![],
        inputs: vec![],
        outputs: vec![],
        params: vec![],
    };
    let mut sets: BTreeMap<&str, (Value, &Setting)> = BTreeMap::new();
    let declared: Vec<&str> = spec
        .items
        .iter()
        .filter(|i| matches!(i.kind, ItemKind::Param { .. } | ItemKind::Dim { .. }))
        .filter_map(|i| i.kind.declared_name().map(|n| n.name.as_str()))
        .collect();
    for s in settings {
        if !declared.contains(&s.name.as_str()) {
            let mut d = Diagnostic::error(
                Code::BadSetting,
                format!("`--set {}`: the spec has no parameter or dim `{}`", s.name, s.name),
            );
            if let Some(x) = suggest(&s.name, declared.iter().copied()) {
                d = d.hint(format!("did you mean `{x}`?"));
            }
            l.diags.push(d.note(format!("parameters and dims: {}", declared.join(", "))));
            continue;
        }
        let parsed = attnc_grammar::parse_expr(&s.value)
            .map_err(|e| e.message)
            .and_then(|e| eval(&e, &EmptyScope).map_err(|d| d.message));
        match parsed {
            Ok(v) => {
                sets.insert(s.name.as_str(), (v, s));
            }
            Err(m) => l.diags.push(Diagnostic::error(Code::BadSetting, format!("`--set {}={}`: {m}", s.name, s.value))),
        }
    }

    for item in &spec.items {
        if let Some(name) = item.kind.declared_name() {
            if let Some((_, prev)) = l.scope.get(&name.name) {
                let prev = *prev;
                l.diags.push(
                    Diagnostic::error(Code::Duplicate, format!("`{}` is declared twice", name.name))
                        .at(name.span, "declared again here")
                        .with(prev, "first declared here"),
                );
                continue;
            }
        }
        match &item.kind {
            ItemKind::Param { name, ty, default } => {
                let value = match sets.get(name.name.as_str()) {
                    Some((v, s)) => conform(v.clone(), ty).map_err(|m| {
                        Diagnostic::error(Code::BadSetting, format!("`--set {}={}`: {m}", s.name, s.value))
                            .with(ty.span, "the parameter's type")
                    }),
                    None => match default {
                        None => {
                            Err(Diagnostic::error(Code::NoValue, format!("parameter `{}` has no value", name.name))
                                .at(name.span, "no default")
                                .hint(format!("give it a default or pass `--set {}=VALUE`", name.name)))
                        }
                        Some(d) => eval(d, &l).and_then(|v| {
                            conform(v, ty).map_err(|m| {
                                Diagnostic::error(Code::TypeMismatch, format!("default of `{}`: {m}", name.name))
                                    .at(d.span, "this value")
                                    .with(ty.span, "the declared type")
                            })
                        }),
                    },
                };
                match value {
                    Ok(v) => {
                        l.params.push((name.name.clone(), v.clone()));
                        l.scope.insert(name.name.clone(), (Binding::Param { value: v, ty: ty.clone() }, name.span));
                    }
                    Err(d) => {
                        l.diags.push(d);
                        // Bind a placeholder so later uses do not cascade.
                        l.scope.insert(name.name.clone(), (Binding::Tensor { node: None }, name.span));
                    }
                }
            }
            ItemKind::Dim { name, default } => {
                let value = match sets.get(name.name.as_str()) {
                    Some((v, _)) => Some(Ok((v.clone(), None))),
                    None => default.as_ref().map(|d| eval(d, &l).map(|v| (v, Some(d.span)))),
                };
                let value = match value {
                    None => None,
                    Some(Err(d)) => {
                        l.diags.push(d);
                        None
                    }
                    Some(Ok((Value::Int(v), _))) if v >= 1 => Some(v as u64),
                    Some(Ok((v, span))) => {
                        let d = Diagnostic::error(
                            Code::BadSize,
                            format!("dim `{}` must be an integer of at least 1, not `{v}`", name.name),
                        );
                        l.diags.push(match span {
                            Some(s) => d.at(s, "this value"),
                            None => d.at(name.span, "set on the command line"),
                        });
                        None
                    }
                };
                l.dims.push(DimDecl { name: name.name.clone(), default: value });
                l.scope.insert(name.name.clone(), (Binding::Dim { value }, name.span));
            }
            ItemKind::Input { name, weight, shape, domain, init, .. } => {
                let dims: Option<Vec<Dim>> =
                    shape.iter().map(|e| l.dim_expr(e)).collect::<Vec<_>>().into_iter().collect();
                let domain = l.domain(domain.as_ref());
                let init = domain.as_ref().and_then(|d| l.init(init.as_ref(), d));
                let node = match (dims, init, domain) {
                    (Some(dims), Some(init), Some(domain)) => {
                        let index = l.inputs.len();
                        let id = l.push(Node { op: Op::Input { index }, shape: Shape(dims) });
                        l.inputs.push(Input { name: name.name.clone(), node: id, init, domain, weight: *weight });
                        Some(id)
                    }
                    _ => None,
                };
                l.scope.insert(name.name.clone(), (Binding::Tensor { node }, name.span));
            }
            ItemKind::Let { name, value } | ItemKind::Output { name, value } => {
                let node = match l.operand(value) {
                    Some(Operand::Tensor(id)) => Some(id),
                    Some(Operand::Const(v)) => match v.as_f64() {
                        Some(x) => Some(l.push(Node { op: Op::Scalar { value: x }, shape: Shape(vec![]) })),
                        None => {
                            l.diags.push(
                                Diagnostic::error(
                                    Code::WrongKind,
                                    format!(
                                        "`{}` must be a tensor or a number, not {} `{v}`",
                                        name.name,
                                        v.type_name()
                                    ),
                                )
                                .at(value.span, "this value"),
                            );
                            None
                        }
                    },
                    None => None,
                };
                if let (ItemKind::Output { .. }, Some(id)) = (&item.kind, node) {
                    l.outputs.push((name.name.clone(), id));
                }
                l.scope.insert(name.name.clone(), (Binding::Tensor { node }, name.span));
            }
            ItemKind::Require { cond, message } => match eval(cond, &l) {
                Ok(Value::Bool(true)) => {}
                Ok(Value::Bool(false)) => {
                    let text = message
                        .clone()
                        .unwrap_or_else(|| format!("requirement `{}` does not hold", attnc_grammar::print_expr(cond)));
                    let mut d = Diagnostic::error(Code::RequirementFailed, text)
                        .at(cond.span, "false for the bound parameters");
                    let bound: Vec<String> = l.params.iter().map(|(n, v)| format!("{n} = {v}")).collect();
                    d = d.note(format!("bound parameters: {}", bound.join(", ")));
                    l.diags.push(d);
                }
                Ok(v) => l.diags.push(
                    Diagnostic::error(
                        Code::TypeMismatch,
                        format!("a requirement must be true or false, not {} `{v}`", v.type_name()),
                    )
                    .at(cond.span, "this condition"),
                ),
                Err(d) => l.diags.push(d),
            },
        }
    }

    if l.outputs.is_empty() && !l.diags.iter().any(Diagnostic::is_error) {
        l.diags.push(
            Diagnostic::error(Code::NoOutput, format!("spec `{}` declares no output", spec.name.name))
                .at(spec.name.span, "this spec")
                .hint("add `output NAME = EXPR`"),
        );
    }
    if l.diags.iter().any(Diagnostic::is_error) {
        // Unused-input warnings would only echo the errors that dropped a use.
        crate::diag::sort(&mut l.diags);
        return Err(l.diags);
    }
    let warnings = l.unused_input_warnings(spec);
    let program =
        Program { name: spec.name.name.clone(), dims: l.dims, nodes: l.nodes, inputs: l.inputs, outputs: l.outputs };
    let mut program = program;
    program.prune_dead();
    Ok(Compiled { program, params: l.params, warnings })
}

struct EmptyScope;
impl Scope for EmptyScope {
    fn lookup(&self, _: &str) -> Option<Value> {
        None
    }
    fn names(&self) -> Vec<String> {
        vec![]
    }
}

impl Lowerer {
    pub(crate) fn push(&mut self, node: Node) -> NodeId {
        self.nodes.push(node);
        NodeId(self.nodes.len() as u32 - 1)
    }

    /// Add `op`, inferring its shape; on a shape error, report it at `span`
    /// with the operands' shapes labelled at `operand_spans`.
    pub(crate) fn add(&mut self, op: Op, span: Span, operand_spans: &[Span]) -> Option<NodeId> {
        let operands = op.operands();
        let shape = {
            let nodes = &self.nodes;
            op.infer(&|id| nodes[id.0 as usize].shape.clone())
        };
        match shape {
            Ok(shape) => Some(self.push(Node { op, shape })),
            Err(e) => {
                let code = match e.kind {
                    ShapeErrorKind::Mismatch => Code::ShapeMismatch,
                    ShapeErrorKind::Rank => Code::RankMismatch,
                    ShapeErrorKind::NotDivisible => Code::NotDivisible,
                    ShapeErrorKind::BadSize => Code::BadSize,
                };
                let mut d = Diagnostic::error(code, e.message).at(span, "in this operation");
                for (id, s) in operands.iter().zip(operand_spans) {
                    d = d.with(*s, format!("shape {}", self.nodes[id.0 as usize].shape));
                }
                self.diags.push(d);
                None
            }
        }
    }

    /// A size expression of an input shape: sums and differences of products
    /// of dims and integer constants (`N * P`, `(N - 1) * P`, `2 * N - 1`).
    fn dim_expr(&mut self, e: &Expr) -> Option<Dim> {
        let bad = |l: &mut Lowerer, msg: String| {
            l.diags.push(
                Diagnostic::error(Code::BadShapeExpr, msg)
                    .at(e.span, "in this size")
                    .hint("sizes are sums and products of dims and integer parameters, e.g. `N * P` or `2 * N - 1`"),
            );
            None
        };
        match &e.kind {
            ExprKind::Name(n) => match self.scope.get(n).map(|b| b.0.clone()) {
                Some(Binding::Dim { .. }) => Some(Dim::sym(n)),
                Some(Binding::Tensor { node: None }) => None,
                _ => self.const_size(e).map(Dim::known),
            },
            ExprKind::Binary(BinOp::Mul, a, b) => {
                let (a, b) = (self.dim_expr(a)?, self.dim_expr(b)?);
                match a.mul(&b) {
                    Some(d) => Some(d),
                    None => bad(self, "size overflows 64 bits".into()),
                }
            }
            ExprKind::Binary(op @ (BinOp::Add | BinOp::Sub), a, b) => {
                let (a, b) = (self.dim_expr(a)?, self.dim_expr(b)?);
                Some(if *op == BinOp::Add { a.add(&b) } else { a.sub(&b) })
            }
            ExprKind::Binary(BinOp::Div, a, b) => {
                let a = self.dim_expr(a)?;
                let n = self.const_size(b)?;
                match a.div_exact(n) {
                    Some(d) => Some(d),
                    None => bad(self, format!("{a} is not divisible by {n}")),
                }
            }
            _ if self.mentions_dim(e) => {
                bad(self, format!("`{}` is not a sum of products of dims", attnc_grammar::print_expr(e)))
            }
            _ => self.const_size(e).map(Dim::known),
        }
    }

    /// A size of dims plus or minus a constant (`N`, `NB - 1`), for domains.
    fn size_plus(&mut self, e: &Expr) -> Option<Limit> {
        if let ExprKind::Binary(op @ (BinOp::Add | BinOp::Sub), a, b) = &e.kind {
            if self.mentions_dim(a) && !self.mentions_dim(b) {
                let size = self.dim_expr(a)?;
                let plus = match eval_strict(b, self) {
                    Ok(Value::Int(c)) if *op == BinOp::Add => c,
                    Ok(Value::Int(c)) => -c,
                    _ => {
                        self.diags.push(
                            Diagnostic::error(
                                Code::TypeMismatch,
                                "a domain's end must be a size plus or minus an integer",
                            )
                            .at(b.span, "not an integer")
                            .hint("e.g. `integers(0, NB - 1)`"),
                        );
                        return None;
                    }
                };
                return Some(Limit::Size { size, plus });
            }
        }
        Some(Limit::Size { size: self.dim_expr(e)?, plus: 0 })
    }

    fn mentions_dim(&self, e: &Expr) -> bool {
        let mut found = false;
        e.walk(&mut |x| {
            if let ExprKind::Name(n) = &x.kind {
                found |= matches!(self.scope.get(n), Some((Binding::Dim { .. }, _)));
            }
        });
        found
    }

    /// A constant size of at least 1.
    fn const_size(&mut self, e: &Expr) -> Option<u64> {
        match eval_strict(e, self) {
            Ok(Value::Int(v)) if v >= 1 => Some(v as u64),
            Ok(v) => {
                self.diags.push(
                    Diagnostic::error(Code::BadSize, format!("a size must be an integer of at least 1, not `{v}`"))
                        .at(e.span, "this size"),
                );
                None
            }
            Err(d) => {
                self.diags.push(d);
                None
            }
        }
    }

    /// The `in DOMAIN` of an input: `any` (the default), `finite`, `binary` or `integers(lo, hi)`.
    fn domain(&mut self, e: Option<&Expr>) -> Option<Domain> {
        let Some(e) = e else { return Some(Domain::Any) };
        let domain = match &e.kind {
            ExprKind::Name(n) if n == "any" => Some(Domain::Any),
            ExprKind::Name(n) if n == "finite" => Some(Domain::Finite),
            ExprKind::Name(n) if n == "binary" => Some(Domain::Binary),
            ExprKind::Call { func, args } if func.name == "integers" && args.len() == 2 => {
                let lo = eval_strict(&args[0].value, self);
                // A size of dims (plus a constant) stays symbolic: input
                // tensors may fix the dims.
                if self.mentions_dim(&args[1].value) {
                    let hi = self.size_plus(&args[1].value)?;
                    return match lo {
                        Ok(Value::Int(lo)) if lo <= hi.least() => Some(Domain::Integers { lo, hi }),
                        Err(d) => {
                            self.diags.push(d);
                            None
                        }
                        _ => {
                            self.diags.push(
                                Diagnostic::error(
                                    Code::TypeMismatch,
                                    "a domain up to a size must start at its least value or below",
                                )
                                .at(args[0].value.span, "here")
                                .hint("sizes are at least 1: use `integers(0, N)` or `integers(0, NB - 1)`"),
                            );
                            None
                        }
                    };
                }
                let hi = eval_strict(&args[1].value, self);
                match (lo, hi) {
                    (Ok(Value::Int(lo)), Ok(Value::Int(hi))) if lo <= hi => {
                        Some(Domain::Integers { lo, hi: Limit::Int(hi) })
                    }
                    (Err(d), _) | (_, Err(d)) => {
                        self.diags.push(d);
                        return None;
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        if domain.is_none() {
            self.diags.push(
                Diagnostic::error(Code::TypeMismatch, format!("`{}` is not a domain", attnc_grammar::print_expr(e)))
                    .at(e.span, "here")
                    .hint("use `any`, `finite`, `binary` or `integers(lo, hi)` with lo <= hi"),
            );
        }
        domain
    }

    /// The `~ DISTRIBUTION` of an input; by default drawn from the domain
    /// (`uniform(-1, 1)` for real numbers).
    fn init(&mut self, e: Option<&Expr>, domain: &Domain) -> Option<Init> {
        let Some(e) = e else {
            return Some(match domain {
                Domain::Integers { lo, hi } => Init::Integers { lo: *lo, hi: hi.clone() },
                Domain::Binary => Init::Bernoulli { p: 0.5 },
                Domain::Any | Domain::Finite => Init::Uniform { lo: -1.0, hi: 1.0 },
            });
        };
        let ExprKind::Call { func, args } = &e.kind else {
            self.diags.push(
                Diagnostic::error(Code::TypeMismatch, "an input's distribution must be a call such as `normal(0, 1)`")
                    .at(e.span, "not a distribution")
                    .hint("use `uniform(lo, hi)`, `normal(mean, std)`, `integers(lo, hi)` or `bernoulli(p)`"),
            );
            return None;
        };
        let mut vals = Vec::new();
        for a in args {
            match eval_strict(&a.value, self) {
                Ok(v) => vals.push(v),
                Err(d) => {
                    self.diags.push(d);
                    return None;
                }
            }
        }
        let nums: Vec<f64> = vals.iter().filter_map(Value::as_f64).collect();
        let ints: Vec<i64> = vals.iter().filter_map(|v| if let Value::Int(i) = v { Some(*i) } else { None }).collect();
        let init = match (func.name.as_str(), nums.as_slice()) {
            ("uniform", [lo, hi]) if nums.len() == vals.len() && lo < hi => Some(Init::Uniform { lo: *lo, hi: *hi }),
            ("normal", [mean, std]) if nums.len() == vals.len() && *std > 0.0 => {
                Some(Init::Normal { mean: *mean, std: *std })
            }
            ("integers", _) if ints.len() == 2 && vals.len() == 2 && ints[0] <= ints[1] => {
                Some(Init::Integers { lo: ints[0], hi: Limit::Int(ints[1]) })
            }
            ("bernoulli", [p]) if vals.len() == 1 && (0.0..=1.0).contains(p) => Some(Init::Bernoulli { p: *p }),
            _ => None,
        };
        let Some(init) = init else {
            self.diags.push(
                Diagnostic::error(Code::TypeMismatch, format!("`{}` is not a valid distribution", attnc_grammar::print_expr(e)))
                    .at(e.span, "here")
                    .hint("use `uniform(lo, hi)` with lo < hi, `normal(mean, std)` with std > 0, `integers(lo, hi)` or `bernoulli(p)` with 0 ≤ p ≤ 1"),
            );
            return None;
        };
        let least = Limit::least;
        let fits = match (domain, &init) {
            (Domain::Any | Domain::Finite, _) => true,
            (Domain::Binary, Init::Bernoulli { .. }) => true,
            (Domain::Binary, Init::Integers { lo, hi }) => *lo >= 0 && least(hi) <= 1,
            (Domain::Integers { lo, hi }, Init::Integers { lo: a, hi: Limit::Int(b) }) => lo <= a && *b <= least(hi),
            (Domain::Integers { lo, hi }, Init::Integers { lo: a, hi: b }) => lo <= a && hi == b,
            (Domain::Integers { lo, hi }, Init::Bernoulli { .. }) => *lo <= 0 && 1 <= least(hi),
            _ => false,
        };
        if !fits {
            self.diags.push(
                Diagnostic::error(Code::TypeMismatch, "the distribution draws values outside the input's domain")
                    .at(e.span, "this distribution"),
            );
            return None;
        }
        Some(init)
    }

    /// Lower a tensor-level expression. `None` means an error was reported.
    pub(crate) fn operand(&mut self, e: &Expr) -> Option<Operand> {
        match &e.kind {
            ExprKind::Int(_) | ExprKind::Float(_) | ExprKind::Bool(_) | ExprKind::None => {
                eval(e, self).ok().map(Operand::Const)
            }
            ExprKind::Name(n) => match self.scope.get(n).map(|b| b.0.clone()) {
                Some(Binding::Tensor { node }) => node.map(Operand::Tensor),
                Some(Binding::Param { value, .. }) => Some(Operand::Const(value)),
                Some(Binding::Dim { .. }) => {
                    self.diags.push(
                        Diagnostic::error(Code::WrongKind, format!("dim `{n}` is a symbolic size, not a value"))
                            .at(e.span, "used as a value")
                            .hint("sizes of tensors are used through operations; use a parameter for a constant"),
                    );
                    None
                }
                None => {
                    self.diags.push(unknown_name(n, e.span, self));
                    None
                }
            },
            _ if self.is_constant(e) => self.constant(e),
            ExprKind::List(_) => match eval_strict(e, self) {
                Ok(v) => Some(Operand::Const(v)),
                Err(d) => {
                    self.diags.push(d);
                    None
                }
            },
            ExprKind::Unary(op, x) => {
                let v = self.operand(x)?;
                match (op, v) {
                    (_, Operand::Const(_)) => self.constant(e),
                    (UnOp::Neg, Operand::Tensor(id)) => {
                        self.add(Op::Unary { op: UnaryOp::Neg, x: id }, e.span, &[x.span]).map(Operand::Tensor)
                    }
                    (UnOp::Not, Operand::Tensor(_)) => {
                        self.diags.push(
                            Diagnostic::error(
                                Code::WrongKind,
                                "`not` applies to conditions on parameters, not to tensors",
                            )
                            .at(e.span, "here"),
                        );
                        None
                    }
                }
            }
            ExprKind::Binary(op, a, b) => {
                let (va, vb) = (self.operand(a), self.operand(b));
                let (va, vb) = (va?, vb?);
                if let (Operand::Const(_), Operand::Const(_)) = (&va, &vb) {
                    return self.constant(e);
                }
                if *op == BinOp::MatMul {
                    let (Operand::Tensor(x), Operand::Tensor(w)) = (va, vb) else {
                        self.diags.push(
                            Diagnostic::error(Code::WrongKind, "both operands of `@` must be tensors")
                                .at(e.span, "here"),
                        );
                        return None;
                    };
                    return self.add(Op::MatMul { a: x, b: w }, e.span, &[a.span, b.span]).map(Operand::Tensor);
                }
                let (bop, swap) = match op {
                    BinOp::Add => (BinaryOp::Add, false),
                    BinOp::Sub => (BinaryOp::Sub, false),
                    BinOp::Mul => (BinaryOp::Mul, false),
                    BinOp::Div => (BinaryOp::Div, false),
                    BinOp::Ge => (BinaryOp::Ge, false),
                    BinOp::Gt => (BinaryOp::Gt, false),
                    BinOp::Le => (BinaryOp::Ge, true),
                    BinOp::Lt => (BinaryOp::Gt, true),
                    BinOp::Eq => (BinaryOp::Eq, false),
                    _ => {
                        self.diags.push(
                            Diagnostic::error(Code::WrongKind, format!("`{}` does not apply to tensors", op.symbol()))
                                .at(e.span, "here")
                                .hint("tensors support `+ - * / @` and the comparisons `>= > <= < ==`, which give 1.0 or 0.0"),
                        );
                        return None;
                    }
                };
                let x = self.materialize(va, a)?;
                let y = self.materialize(vb, b)?;
                let (x, y, sa, sb) = if swap { (y, x, b.span, a.span) } else { (x, y, a.span, b.span) };
                self.add(Op::Binary { op: bop, a: x, b: y }, e.span, &[sa, sb]).map(Operand::Tensor)
            }
            ExprKind::Call { func, args } => calls::lower_call(self, e, func, args),
            ExprKind::Lambda { .. } => {
                self.diags.push(
                    Diagnostic::error(Code::WrongKind, "a function is not a tensor")
                        .at(e.span, "a function")
                        .note("functions are arguments of `attention`: `score = |s, b, h, i, j| ...`, `mask = |b, h, i, j| ...`"),
                );
                None
            }
            ExprKind::Index { base, .. } => {
                self.diags.push(
                    Diagnostic::error(
                        Code::WrongKind,
                        format!("`{}[...]` reads one entry, inside a function only", base.name),
                    )
                    .at(e.span, "an entry")
                    .note("outside functions tensors are used whole; slicing is not part of the language"),
                );
                None
            }
            ExprKind::If(c, a, b) => match eval_strict(c, self) {
                Ok(Value::Bool(true)) => self.operand(a),
                Ok(Value::Bool(false)) => self.operand(b),
                Ok(v) => {
                    self.diags.push(
                        Diagnostic::error(
                            Code::TypeMismatch,
                            format!("the condition of `if` must be true or false, not {} `{v}`", v.type_name()),
                        )
                        .at(c.span, "this condition")
                        .hint("conditions are on parameters; for elementwise choices use `where(cond, a, b)`"),
                    );
                    None
                }
                Err(d) => {
                    self.diags.push(d);
                    None
                }
            },
        }
    }

    /// Whether `e` folds to a constant: its names are parameters (or enum
    /// literals compared with `==`/`!=`) and it calls only scalar functions.
    fn is_constant(&self, e: &Expr) -> bool {
        let symbol = |x: &Expr| matches!(&x.kind, ExprKind::Name(n) if !self.scope.contains_key(n));
        match &e.kind {
            ExprKind::Int(_) | ExprKind::Float(_) | ExprKind::Bool(_) | ExprKind::None => true,
            ExprKind::Name(n) => matches!(self.scope.get(n), Some((Binding::Param { .. }, _))),
            ExprKind::List(items) => items.iter().all(|x| self.is_constant(x)),
            ExprKind::Unary(_, x) => self.is_constant(x),
            ExprKind::Binary(BinOp::Eq | BinOp::Ne, a, b) => {
                (symbol(a) || self.is_constant(a)) && (symbol(b) || self.is_constant(b))
            }
            ExprKind::Binary(_, a, b) => self.is_constant(a) && self.is_constant(b),
            ExprKind::If(c, a, b) => self.is_constant(c) && self.is_constant(a) && self.is_constant(b),
            ExprKind::Lambda { .. } | ExprKind::Index { .. } => false,
            ExprKind::Call { func, args } => {
                SCALAR_FUNCTIONS.contains(&func.name.as_str()) && args.iter().all(|a| self.is_constant(&a.value))
            }
        }
    }

    fn constant(&mut self, e: &Expr) -> Option<Operand> {
        match eval_strict(e, self) {
            Ok(v) => Some(Operand::Const(v)),
            Err(d) => {
                self.diags.push(d);
                None
            }
        }
    }

    /// A constant operand as a scalar node; a tensor as itself.
    pub(crate) fn materialize(&mut self, v: Operand, e: &Expr) -> Option<NodeId> {
        match v {
            Operand::Tensor(id) => Some(id),
            Operand::Const(c) => match c.as_f64() {
                Some(x) => Some(self.push(Node { op: Op::Scalar { value: x }, shape: Shape(vec![]) })),
                None => {
                    self.diags.push(
                        Diagnostic::error(
                            Code::WrongKind,
                            format!("expected a tensor or a number, found {} `{c}`", c.type_name()),
                        )
                        .at(e.span, "here"),
                    );
                    None
                }
            },
        }
    }

    fn unused_input_warnings(&self, spec: &ast::Spec) -> Vec<Diagnostic> {
        let mut live: HashSet<NodeId> = self.outputs.iter().map(|(_, id)| *id).collect();
        for (i, n) in self.nodes.iter().enumerate().rev() {
            if live.contains(&NodeId(i as u32)) {
                live.extend(n.op.operands());
            }
        }
        let mut out = vec![];
        for item in &spec.items {
            if let ItemKind::Input { name, .. } = &item.kind {
                if let Some(inp) = self.inputs.iter().find(|i| i.name == name.name) {
                    if !live.contains(&inp.node) {
                        out.push(
                            Diagnostic::warning(
                                Code::UnusedInput,
                                format!("input `{}` is never used by an output", name.name),
                            )
                            .at(name.span, "declared here")
                            .note("the tensor must still be given to `attnc run --inputs`"),
                        );
                    }
                }
            }
        }
        out
    }
}

/// Evaluate with no enum literals allowed at the top level.
pub(crate) fn eval_strict(e: &Expr, scope: &dyn Scope) -> Result<Value, Diagnostic> {
    if let ExprKind::Name(n) = &e.kind {
        if scope.lookup(n).is_none() {
            return Err(unknown_name(n, e.span, scope));
        }
    }
    eval(e, scope)
}
