//! The abstract syntax tree of a `.attn` spec.
//!
//! Every node carries the [`Span`] of the source text it came from. Equality of
//! trees *including* spans is the derived `PartialEq`; [`Spec::without_spans`]
//! gives the tree with every span zeroed, which is how `parse(print(ast)) == ast`
//! is stated.

/// A byte range `start..end` in the source text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Span {
    pub start: usize,
    pub end: usize,
}

impl Span {
    pub fn new(start: usize, end: usize) -> Span {
        Span { start, end }
    }
    /// The smallest span covering both.
    pub fn to(self, other: Span) -> Span {
        Span::new(self.start.min(other.start), self.end.max(other.end))
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Ident {
    pub name: String,
    pub span: Span,
}

/// A whole file: `spec NAME` followed by items in source order.
#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    pub name: Ident,
    pub items: Vec<Item>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    pub kind: ItemKind,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ItemKind {
    /// `param NAME: TYPE [= DEFAULT]` — bound before lowering (compile time).
    Param { name: Ident, ty: Type, default: Option<Expr> },
    /// `dim NAME [= DEFAULT]` — a symbolic size, bound from tensors at run time.
    Dim { name: Ident, default: Option<Expr> },
    /// `input NAME: [d0, d1, ...] [in DOMAIN] [~ DISTRIBUTION]`, or `weight NAME: ...`:
    /// a weight is an input that stays fixed across calls in inference, so
    /// computations on weights alone may be folded once.
    Input { name: Ident, weight: bool, shape: Vec<Expr>, shape_span: Span, domain: Option<Expr>, init: Option<Expr> },
    /// `let NAME = EXPR`.
    Let { name: Ident, value: Expr },
    /// `output NAME = EXPR`.
    Output { name: Ident, value: Expr },
    /// `require COND [, "message"]` — checked when parameters are bound.
    Require { cond: Expr, message: Option<String> },
}

impl ItemKind {
    /// The name the item declares, if any.
    pub fn declared_name(&self) -> Option<&Ident> {
        match self {
            ItemKind::Param { name, .. }
            | ItemKind::Dim { name, .. }
            | ItemKind::Input { name, .. }
            | ItemKind::Let { name, .. }
            | ItemKind::Output { name, .. } => Some(name),
            ItemKind::Require { .. } => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Type {
    pub kind: TypeKind,
    /// `T?`: the value may be `none`.
    pub optional: bool,
    pub span: Span,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prim {
    Int,
    Float,
    Bool,
}

impl Prim {
    pub fn keyword(self) -> &'static str {
        match self {
            Prim::Int => "int",
            Prim::Float => "float",
            Prim::Bool => "bool",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum TypeKind {
    Prim(Prim),
    /// `{a, b, c}`: one of the listed names.
    Enum(Vec<Ident>),
    /// `[float]`: a list of values.
    List(Prim),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ExprKind {
    Int(i64),
    Float(f64),
    Bool(bool),
    None,
    Name(String),
    List(Vec<Expr>),
    Unary(UnOp, Box<Expr>),
    Binary(BinOp, Box<Expr>, Box<Expr>),
    Call {
        func: Ident,
        args: Vec<Arg>,
    },
    /// `if COND then A else B`: the condition is a constant, so only one branch is lowered.
    If(Box<Expr>, Box<Expr>, Box<Expr>),
    /// `|a, b| body`: a function (attention's `score =` and `mask =`).
    Lambda {
        params: Vec<Ident>,
        body: Box<Expr>,
    },
    /// `x[i, j]`: an entry of a tensor (inside a function).
    Index {
        base: Ident,
        indices: Vec<Expr>,
    },
}

/// A call argument: positional (`name == None`) or keyword (`key = value`).
#[derive(Clone, Debug, PartialEq)]
pub struct Arg {
    pub name: Option<Ident>,
    pub value: Expr,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnOp {
    Neg,
    Not,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    Or,
    And,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    MatMul,
}

impl BinOp {
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Or => "or",
            BinOp::And => "and",
            BinOp::Eq => "==",
            BinOp::Ne => "!=",
            BinOp::Lt => "<",
            BinOp::Le => "<=",
            BinOp::Gt => ">",
            BinOp::Ge => ">=",
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Rem => "%",
            BinOp::MatMul => "@",
        }
    }

    /// Binding strength; all binary operators associate to the left.
    pub fn precedence(self) -> u8 {
        match self {
            BinOp::Or => 1,
            BinOp::And => 2,
            BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => 3,
            BinOp::Add | BinOp::Sub => 4,
            BinOp::Mul | BinOp::Div | BinOp::Rem | BinOp::MatMul => 5,
        }
    }
}

/// Precedence of prefix operators: tighter than every binary operator.
pub const UNARY_PRECEDENCE: u8 = 6;

impl Spec {
    /// The same tree with every span set to `0..0`.
    pub fn without_spans(&self) -> Spec {
        let mut spec = self.clone();
        spec.strip_spans();
        spec
    }

    fn strip_spans(&mut self) {
        self.name.span = Span::default();
        for item in &mut self.items {
            item.span = Span::default();
            match &mut item.kind {
                ItemKind::Param { name, ty, default } => {
                    name.span = Span::default();
                    ty.span = Span::default();
                    if let TypeKind::Enum(names) = &mut ty.kind {
                        names.iter_mut().for_each(|n| n.span = Span::default());
                    }
                    default.iter_mut().for_each(Expr::strip_spans);
                }
                ItemKind::Dim { name, default } => {
                    name.span = Span::default();
                    default.iter_mut().for_each(Expr::strip_spans);
                }
                ItemKind::Input { name, shape, shape_span, domain, init, .. } => {
                    name.span = Span::default();
                    *shape_span = Span::default();
                    shape.iter_mut().for_each(Expr::strip_spans);
                    domain.iter_mut().for_each(Expr::strip_spans);
                    init.iter_mut().for_each(Expr::strip_spans);
                }
                ItemKind::Let { name, value } | ItemKind::Output { name, value } => {
                    name.span = Span::default();
                    value.strip_spans();
                }
                ItemKind::Require { cond, .. } => cond.strip_spans(),
            }
        }
    }
}

impl Expr {
    fn strip_spans(&mut self) {
        self.span = Span::default();
        match &mut self.kind {
            ExprKind::Int(_) | ExprKind::Float(_) | ExprKind::Bool(_) | ExprKind::None | ExprKind::Name(_) => {}
            ExprKind::List(items) => items.iter_mut().for_each(Expr::strip_spans),
            ExprKind::Unary(_, e) => e.strip_spans(),
            ExprKind::Binary(_, a, b) => {
                a.strip_spans();
                b.strip_spans();
            }
            ExprKind::If(c, a, b) => {
                c.strip_spans();
                a.strip_spans();
                b.strip_spans();
            }
            ExprKind::Call { func, args } => {
                func.span = Span::default();
                for arg in args {
                    if let Some(n) = &mut arg.name {
                        n.span = Span::default();
                    }
                    arg.value.strip_spans();
                }
            }
            ExprKind::Lambda { params, body } => {
                params.iter_mut().for_each(|p| p.span = Span::default());
                body.strip_spans();
            }
            ExprKind::Index { base, indices } => {
                base.span = Span::default();
                indices.iter_mut().for_each(Expr::strip_spans);
            }
        }
    }

    /// Visit this expression and every sub-expression, parents first.
    pub fn walk<'a>(&'a self, f: &mut impl FnMut(&'a Expr)) {
        f(self);
        match &self.kind {
            ExprKind::List(items) => items.iter().for_each(|e| e.walk(f)),
            ExprKind::Unary(_, e) => e.walk(f),
            ExprKind::Binary(_, a, b) => {
                a.walk(f);
                b.walk(f);
            }
            ExprKind::If(c, a, b) => {
                c.walk(f);
                a.walk(f);
                b.walk(f);
            }
            ExprKind::Call { args, .. } => args.iter().for_each(|a| a.value.walk(f)),
            ExprKind::Lambda { body, .. } => body.walk(f),
            ExprKind::Index { indices, .. } => indices.iter().for_each(|e| e.walk(f)),
            _ => {}
        }
    }
}
