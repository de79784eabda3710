//! Score and mask functions: attention's `score = |s, b, h, i, j| …` and
//! `mask = |b, h, i, j| …` as small typed scalar programs. Their leaves are
//! the parameters, literals, dims (sizes known when the program runs) and
//! reads of captured tensors (attention's extra operands); every node has
//! one of three types ([`FType`]), and lowering inserts the int → float
//! conversions, so a function's meaning needs no further inference.
//!
//! The meaning of each operation is `docs/semantics.md` §6; the
//! interpreter (`interp::func`) evaluates it, the kernels compile it.

use super::UnaryOp;
use std::fmt;

/// The type of a function's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FType {
    Int,
    Float,
    Bool,
}

impl FType {
    pub fn name(self) -> &'static str {
        match self {
            FType::Int => "int",
            FType::Float => "float",
            FType::Bool => "bool",
        }
    }

    /// The name with its article: "an int", "a float".
    pub fn a(self) -> &'static str {
        match self {
            FType::Int => "an int",
            FType::Float => "a float",
            FType::Bool => "a bool",
        }
    }
}

/// Binary operations of functions and their typing: `Add`, `Sub`, `Mul`,
/// `Max`, `Min` give ints on ints and floats otherwise; `Div` and `Pow`
/// floats; `FloorDiv` and `Rem` take and give ints; comparisons give bools;
/// `And`/`Or` take and give bools.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FBin {
    Add,
    Sub,
    Mul,
    Div,
    /// `floordiv(a, b)`: ⌊a / b⌋ on integers (0 when b = 0).
    FloorDiv,
    /// `a % b`: `a − b·⌊a / b⌋`, non-negative for b > 0 (0 when b = 0).
    Rem,
    Max,
    Min,
    Pow,
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
    And,
    Or,
}

impl FBin {
    pub fn symbol(self) -> &'static str {
        match self {
            FBin::Add => "+",
            FBin::Sub => "-",
            FBin::Mul => "*",
            FBin::Div => "/",
            FBin::FloorDiv => "floordiv",
            FBin::Rem => "%",
            FBin::Max => "maximum",
            FBin::Min => "minimum",
            FBin::Pow => "pow",
            FBin::Lt => "<",
            FBin::Le => "<=",
            FBin::Gt => ">",
            FBin::Ge => ">=",
            FBin::Eq => "==",
            FBin::Ne => "!=",
            FBin::And => "and",
            FBin::Or => "or",
        }
    }

    pub fn is_comparison(self) -> bool {
        matches!(self, FBin::Lt | FBin::Le | FBin::Gt | FBin::Ge | FBin::Eq | FBin::Ne)
    }
}

/// A node of a function's body.
#[derive(Clone, Debug, PartialEq)]
pub enum FExpr {
    /// The function's `n`-th parameter.
    Param(usize),
    Int(i64),
    Float(f64),
    Bool(bool),
    /// A dim's value, known when the program runs.
    Dim(String),
    /// A float entry of captured tensor `capture` (an index into the
    /// attention's `captures`), one integer index per axis.
    Read {
        capture: usize,
        indices: Vec<FExpr>,
    },
    /// The least (`max` false) or greatest entry of captured tensor
    /// `capture` over the box `lo..=hi` of indices, each axis clamped into
    /// the tensor's shape; −∞ or +∞ when the box holds more than
    /// `READ_BOX` entries. Only the tile functions of `sparsity` use it.
    ReadBound {
        capture: usize,
        lo: Vec<FExpr>,
        hi: Vec<FExpr>,
        max: bool,
    },
    /// An integer as a float.
    ToFloat(Box<FExpr>),
    /// `−x` on ints or floats.
    Neg(Box<FExpr>),
    Not(Box<FExpr>),
    Bin(FBin, Box<FExpr>, Box<FExpr>),
    /// An elementwise function of a float (`abs` also of an int).
    Unary(UnaryOp, Box<FExpr>),
    /// `where(c, a, b)`: `a` where `c`, else `b` (both of one type).
    Where(Box<FExpr>, Box<FExpr>, Box<FExpr>),
}

/// The most entries a `ReadBound` scans.
pub const READ_BOX: usize = 4096;

/// What a function computes: the score of a logit, which keys a query
/// sees, or a fact about a tile of query and key rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FuncKind {
    /// `|s, b, h, i, j| float`: `s` the scaled logit.
    Score,
    /// `|b, h, i, j| bool`: true where query `i` sees key `j`.
    Mask,
    /// `|b, h, i0, i1, j0, j1| bool` (`sparsity::TileFns`): of query rows
    /// `i0..=i1` against key rows `j0..=j1`.
    Tile,
}

impl FuncKind {
    /// The parameters' types, in order.
    pub fn params(self) -> &'static [FType] {
        match self {
            FuncKind::Score => &[FType::Float, FType::Int, FType::Int, FType::Int, FType::Int],
            FuncKind::Mask => &[FType::Int, FType::Int, FType::Int, FType::Int],
            FuncKind::Tile => &[FType::Int; 6],
        }
    }

    /// The conventional parameter names (as FlexAttention's).
    pub fn param_names(self) -> &'static [&'static str] {
        match self {
            FuncKind::Score => &["score", "b", "h", "q_idx", "kv_idx"],
            FuncKind::Mask => &["b", "h", "q_idx", "kv_idx"],
            FuncKind::Tile => &["b", "h", "i0", "i1", "j0", "j1"],
        }
    }

    pub fn result(self) -> FType {
        match self {
            FuncKind::Score => FType::Float,
            FuncKind::Mask | FuncKind::Tile => FType::Bool,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            FuncKind::Score => "score",
            FuncKind::Mask => "mask",
            FuncKind::Tile => "tile",
        }
    }
}

/// A typed score or mask function.
#[derive(Clone, Debug, PartialEq)]
pub struct Func {
    pub kind: FuncKind,
    /// The author's parameter names (for printing).
    pub params: Vec<String>,
    pub body: FExpr,
}

impl FExpr {
    /// The type of this node, given the parameters' types.
    pub fn ty(&self, params: &[FType]) -> FType {
        match self {
            FExpr::Param(n) => params[*n],
            FExpr::Int(_) | FExpr::Dim(_) => FType::Int,
            FExpr::Float(_) | FExpr::Read { .. } | FExpr::ReadBound { .. } | FExpr::ToFloat(_) => FType::Float,
            FExpr::Bool(_) | FExpr::Not(_) => FType::Bool,
            FExpr::Neg(x) => x.ty(params),
            FExpr::Unary(op, x) => match op {
                UnaryOp::Abs | UnaryOp::Neg => x.ty(params),
                _ => FType::Float,
            },
            FExpr::Where(_, a, _) => a.ty(params),
            FExpr::Bin(op, a, b) => match op {
                FBin::Add | FBin::Sub | FBin::Mul | FBin::Max | FBin::Min => {
                    if a.ty(params) == FType::Int && b.ty(params) == FType::Int {
                        FType::Int
                    } else {
                        FType::Float
                    }
                }
                FBin::Div | FBin::Pow => FType::Float,
                FBin::FloorDiv | FBin::Rem => FType::Int,
                _ => FType::Bool,
            },
        }
    }

    /// Calls `f` on this node and every node below it, parents first.
    pub fn walk(&self, f: &mut impl FnMut(&FExpr)) {
        f(self);
        match self {
            FExpr::Param(_) | FExpr::Int(_) | FExpr::Float(_) | FExpr::Bool(_) | FExpr::Dim(_) => {}
            FExpr::Read { indices, .. } => indices.iter().for_each(|x| x.walk(f)),
            FExpr::ReadBound { lo, hi, .. } => lo.iter().chain(hi).for_each(|x| x.walk(f)),
            FExpr::ToFloat(x) | FExpr::Neg(x) | FExpr::Not(x) | FExpr::Unary(_, x) => x.walk(f),
            FExpr::Bin(_, a, b) => {
                a.walk(f);
                b.walk(f);
            }
            FExpr::Where(c, a, b) => {
                c.walk(f);
                a.walk(f);
                b.walk(f);
            }
        }
    }

    /// The number of operations evaluated per call (the cost model's
    /// measure of a function: reads count as one each).
    pub fn ops(&self) -> usize {
        let mut n = 0;
        self.walk(&mut |e| {
            n += usize::from(!matches!(
                e,
                FExpr::Param(_) | FExpr::Int(_) | FExpr::Float(_) | FExpr::Bool(_) | FExpr::Dim(_)
            ))
        });
        n
    }
}

/// Plans and manifests show a function as its text.
impl serde::Serialize for Func {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl Func {
    /// This function with every dim replaced by its value.
    pub fn resolve(&self, dims: &super::DimValues) -> Func {
        fn go(e: &FExpr, dims: &super::DimValues) -> FExpr {
            let b = |x: &FExpr| Box::new(go(x, dims));
            match e {
                FExpr::Dim(d) => FExpr::Int(dims[d] as i64),
                FExpr::Param(_) | FExpr::Int(_) | FExpr::Float(_) | FExpr::Bool(_) => e.clone(),
                FExpr::Read { capture, indices } => {
                    FExpr::Read { capture: *capture, indices: indices.iter().map(|x| go(x, dims)).collect() }
                }
                FExpr::ReadBound { capture, lo, hi, max } => FExpr::ReadBound {
                    capture: *capture,
                    lo: lo.iter().map(|x| go(x, dims)).collect(),
                    hi: hi.iter().map(|x| go(x, dims)).collect(),
                    max: *max,
                },
                FExpr::ToFloat(x) => FExpr::ToFloat(b(x)),
                FExpr::Neg(x) => FExpr::Neg(b(x)),
                FExpr::Not(x) => FExpr::Not(b(x)),
                FExpr::Unary(op, x) => FExpr::Unary(*op, b(x)),
                FExpr::Bin(op, x, y) => FExpr::Bin(*op, b(x), b(y)),
                FExpr::Where(c, x, y) => FExpr::Where(b(c), b(x), b(y)),
            }
        }
        Func { kind: self.kind, params: self.params.clone(), body: go(&self.body, dims) }
    }
}

/// Prints a function as it could be written (captures by their position: `#0[...]`).
impl fmt::Display for Func {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "|{}| ", self.params.join(", "))?;
        write_expr(&self.body, &self.params, f)
    }
}

/// `e` as written in a function of `params` (captures by position: `#0[...]`).
pub fn expr_text(e: &FExpr, params: &[String]) -> String {
    struct Text<'a>(&'a FExpr, &'a [String]);
    impl fmt::Display for Text<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write_expr(self.0, self.1, f)
        }
    }
    Text(e, params).to_string()
}

fn write_expr(e: &FExpr, params: &[String], f: &mut fmt::Formatter<'_>) -> fmt::Result {
    let list = |xs: &[&FExpr], f: &mut fmt::Formatter<'_>| -> fmt::Result {
        for (n, x) in xs.iter().enumerate() {
            if n > 0 {
                f.write_str(", ")?;
            }
            write_expr(x, params, f)?;
        }
        Ok(())
    };
    match e {
        FExpr::Param(n) => f.write_str(&params[*n]),
        FExpr::Int(v) => write!(f, "{v}"),
        FExpr::Float(v) => write!(f, "{v:?}"),
        FExpr::Bool(v) => write!(f, "{v}"),
        FExpr::Dim(d) => f.write_str(d),
        FExpr::Read { capture, indices } => {
            write!(f, "#{capture}[")?;
            list(&indices.iter().collect::<Vec<_>>(), f)?;
            f.write_str("]")
        }
        FExpr::ReadBound { capture, lo, hi, max } => {
            write!(f, "{}(#{capture}[", if *max { "max" } else { "min" })?;
            for (n, (l, h)) in lo.iter().zip(hi).enumerate() {
                if n > 0 {
                    f.write_str(", ")?;
                }
                write_expr(l, params, f)?;
                f.write_str("..=")?;
                write_expr(h, params, f)?;
            }
            f.write_str("])")
        }
        FExpr::ToFloat(x) => {
            f.write_str("float(")?;
            write_expr(x, params, f)?;
            f.write_str(")")
        }
        FExpr::Neg(x) => {
            f.write_str("-(")?;
            write_expr(x, params, f)?;
            f.write_str(")")
        }
        FExpr::Not(x) => {
            f.write_str("not (")?;
            write_expr(x, params, f)?;
            f.write_str(")")
        }
        FExpr::Unary(op, x) => {
            write!(f, "{}(", op.name())?;
            write_expr(x, params, f)?;
            f.write_str(")")
        }
        FExpr::Bin(op @ (FBin::FloorDiv | FBin::Max | FBin::Min | FBin::Pow), a, b) => {
            write!(f, "{}(", op.symbol())?;
            list(&[a, b], f)?;
            f.write_str(")")
        }
        FExpr::Bin(op, a, b) => {
            f.write_str("(")?;
            write_expr(a, params, f)?;
            write!(f, " {} ", op.symbol())?;
            write_expr(b, params, f)?;
            f.write_str(")")
        }
        FExpr::Where(c, a, b) => {
            f.write_str("where(")?;
            list(&[c, a, b], f)?;
            f.write_str(")")
        }
    }
}

/// Attention's score and mask functions and the tensors they read.
#[derive(Clone, Debug, PartialEq)]
pub struct AttnFns {
    pub score: Option<Func>,
    /// Replaces the built-in mask (whose kind is then `None`, unwindowed).
    pub mask: Option<Func>,
    /// The inputs the functions read; `FExpr::Read::capture` indexes this.
    pub captures: Vec<super::NodeId>,
    /// Head mixing inside attention (Talking-Heads): captured matrices.
    pub mix: HeadMix,
    /// The capture holding each sequence's key count (`lengths =`,
    /// `[B]`). The mask function already hides the keys past it; this
    /// names the tensor the host checks before a run (every value an
    /// integer in `0..=` the key rows).
    pub lengths: Option<usize>,
    /// How a row's visible scores become weights (`weights =`; softmax by default).
    pub weights: Weights,
    /// The capture holding each query head's sink logit (`sink =`, `[H]`):
    /// it joins every row's softmax denominator and carries no value.
    pub sink: Option<usize>,
}

/// How attention turns a row's visible scores `s_j` into the weights of
/// its values (docs/semantics.md §9).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Weights {
    /// `exp(s_j) / (Σ_k exp(s_k) [+ exp(sink)])`.
    #[default]
    Softmax,
    /// `sigmoid(s_j)`, unnormalised.
    Sigmoid,
    /// `s_j` itself.
    Linear,
    /// `1 / |argmax|` on the row's maximal scores, 0 elsewhere.
    Hard,
}

impl Weights {
    pub fn name(self) -> &'static str {
        match self {
            Weights::Softmax => "softmax",
            Weights::Sigmoid => "sigmoid",
            Weights::Linear => "linear",
            Weights::Hard => "hard",
        }
    }

    pub fn is_softmax(&self) -> bool {
        *self == Weights::Softmax
    }
}

impl AttnFns {
    /// Whether attention mixes heads inside its softmax.
    pub fn mixes(&self) -> bool {
        !self.mix.is_identity()
    }
}

/// Head mixing inside attention (Shazeer et al., 2020, Talking-Heads
/// Attention; docs/semantics.md §7), each matrix a capture of `AttnFns`:
/// `logits` `[H_q, H_s]` mixes the scaled logits (after the score function)
/// of the query heads into the softmax heads, `probs` `[H_s, H_o]` the
/// probabilities of the softmax heads into the output heads. Either may be
/// absent (the identity).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
pub struct HeadMix {
    pub logits: Option<usize>,
    pub probs: Option<usize>,
}

impl HeadMix {
    /// Whether capture `c` is one of the mixing matrices.
    pub fn reads(&self, c: usize) -> bool {
        self.logits == Some(c) || self.probs == Some(c)
    }

    /// No mixing: both matrices the identity.
    pub fn is_identity(&self) -> bool {
        self.logits.is_none() && self.probs.is_none()
    }
}
