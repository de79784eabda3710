//! The builtin functions of the language, as data. [`Builtin`] names each
//! one; its [`Signature`] (typed parameters and a summary) is the single
//! source from which argument matching, did-you-mean hints, enum-argument
//! validation and the `docs/language.md` table are derived. `lower::calls`
//! lowers a call to IR operations; `lower::func` takes the builtins a score
//! or mask function may call from here.

use crate::ir::{BinaryOp, FuncKind, MaskKind, ReduceKind, UnaryOp};

/// A closed set of names an argument may take, as a typed value.
pub trait Choice: Copy + 'static {
    const NAMES: &'static [&'static str];
    /// The values, in the order of `NAMES`.
    const ALL: &'static [Self];
}

/// Defines a closed set of names an argument may take (`mask = causal`), with
/// `NAMES` for signatures and `ALL` in the same order.
macro_rules! choices {
    ($(#[$doc:meta])* $name:ident { $($variant:ident = $text:literal),* $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name { $($variant),* }
        impl $name {
            pub const NAMES: &'static [&'static str] = &[$($text),*];
            pub const ALL: &'static [$name] = &[$($name::$variant),*];
        }
        impl Choice for $name {
            const NAMES: &'static [&'static str] = $name::NAMES;
            const ALL: &'static [$name] = $name::ALL;
        }
    };
}

choices! {
    /// `attention`'s `mask =` names; `flat_causal` (causal over the flattened
    /// positions, IHA's name) means `causal`.
    MaskName { None = "none", Causal = "causal", FlatCausal = "flat_causal", TokenCausal = "token_causal" }
}
impl MaskName {
    /// The mask the name means.
    pub fn kind(self) -> MaskKind {
        match self {
            MaskName::None => MaskKind::None,
            MaskName::Causal | MaskName::FlatCausal => MaskKind::Causal,
            MaskName::TokenCausal => MaskKind::TokenCausal,
        }
    }
}

choices! {
    /// `attention`'s `weights =`.
    WeightsName { Softmax = "softmax", Sigmoid = "sigmoid", Linear = "linear", Hard = "hard" }
}
impl WeightsName {
    pub fn weights(self) -> crate::ir::Weights {
        use crate::ir::Weights;
        match self {
            WeightsName::Softmax => Weights::Softmax,
            WeightsName::Sigmoid => Weights::Sigmoid,
            WeightsName::Linear => Weights::Linear,
            WeightsName::Hard => Weights::Hard,
        }
    }
}

choices! {
    /// `gelu`'s `approximate =`.
    GeluForm { None = "none", Tanh = "tanh" }
}
choices! {
    /// `collapse`'s `mode =`.
    CollapseMode { Global = "global", PerHead = "per_head" }
}

/// What an argument must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    Tensor,
    /// A tensor or a number (broadcast).
    Operand,
    /// An integer of at least 1 (`none` where the parameter is optional).
    Size,
    /// An integer of at least 0, or `none`.
    Count,
    Int,
    /// A number, or `none`.
    Number,
    Bool,
    /// One axis; negative counts from the end.
    Axis,
    /// One axis or `all`.
    Axes,
    /// One of these names.
    Choice(&'static [&'static str]),
    /// A function (`|s, b, h, i, j| …`).
    Function(FuncKind),
    /// One of these names, or a function.
    ChoiceOrFunction(&'static [&'static str], FuncKind),
    /// A size written in the dims (`(N - 1) * P`), kept symbolic.
    DimSize,
    /// A list of numbers, or `none`.
    Numbers,
}

impl ParamKind {
    /// How `docs/language.md` and error notes write the kind.
    pub fn describe(self) -> String {
        let function = |k: FuncKind| format!("|{}| → {}", function_params(k), k.result().name());
        match self {
            ParamKind::Tensor => "tensor".into(),
            ParamKind::Operand => "tensor or number".into(),
            ParamKind::Size => "integer ≥ 1".into(),
            ParamKind::Count => "integer ≥ 0".into(),
            ParamKind::Int => "integer".into(),
            ParamKind::Number => "number".into(),
            ParamKind::Bool => "true or false".into(),
            ParamKind::Axis => "axis".into(),
            ParamKind::Axes => "axis or all".into(),
            ParamKind::Choice(names) => names.join(" or "),
            ParamKind::Function(k) => format!("function {}", function(k)),
            ParamKind::ChoiceOrFunction(names, k) => format!("{} or function {}", names.join(" or "), function(k)),
            ParamKind::DimSize => "size in dims".into(),
            ParamKind::Numbers => "list of numbers or none".into(),
        }
    }

    /// The names an argument of this kind may take, if it takes names.
    pub fn names(self) -> Option<&'static [&'static str]> {
        match self {
            ParamKind::Choice(names) | ParamKind::ChoiceOrFunction(names, _) => Some(names),
            _ => None,
        }
    }
}

/// A function argument's parameters as the docs write them.
pub fn function_params(kind: FuncKind) -> &'static str {
    match kind {
        FuncKind::Score => "s, b, h, i, j",
        FuncKind::Mask => "b, h, i, j",
        FuncKind::Tile => "b, h, i0, i1, j0, j1",
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Param {
    pub name: &'static str,
    pub kind: ParamKind,
}

pub(crate) const fn p(name: &'static str, kind: ParamKind) -> Param {
    Param { name, kind }
}

#[derive(Clone, Copy, Debug)]
pub struct Signature {
    pub name: &'static str,
    /// Parameters in positional order; the first `required` must be given.
    pub params: &'static [Param],
    pub required: usize,
    pub summary: &'static str,
}

impl Signature {
    /// `name(a, b, c)`, for error notes.
    pub fn call(&self) -> String {
        let names: Vec<&str> = self.params.iter().map(|p| p.name).collect();
        format!("{}({})", self.name, names.join(", "))
    }
}

/// The elementwise functions of one tensor without options.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Math {
    Sqrt,
    Abs,
    Exp,
    Log,
    Log1p,
    Tanh,
    Sigmoid,
    Softplus,
    Silu,
    Erf,
    Sin,
    Cos,
    Floor,
    Ceil,
    Sign,
}

impl Math {
    pub fn op(self) -> UnaryOp {
        match self {
            Math::Sqrt => UnaryOp::Sqrt,
            Math::Abs => UnaryOp::Abs,
            Math::Exp => UnaryOp::Exp,
            Math::Log => UnaryOp::Log,
            Math::Log1p => UnaryOp::Log1p,
            Math::Tanh => UnaryOp::Tanh,
            Math::Sigmoid => UnaryOp::Sigmoid,
            Math::Softplus => UnaryOp::Softplus,
            Math::Silu => UnaryOp::Silu,
            Math::Erf => UnaryOp::Erf,
            Math::Sin => UnaryOp::Sin,
            Math::Cos => UnaryOp::Cos,
            Math::Floor => UnaryOp::Floor,
            Math::Ceil => UnaryOp::Ceil,
            Math::Sign => UnaryOp::Sign,
        }
    }

    fn summary(self) -> &'static str {
        match self {
            Math::Sqrt => "elementwise square root",
            Math::Abs => "elementwise absolute value",
            Math::Exp => "elementwise e^x",
            Math::Log => "elementwise natural logarithm",
            Math::Log1p => "elementwise log(1 + x), exact near 0",
            Math::Tanh => "elementwise hyperbolic tangent",
            Math::Sigmoid => "elementwise 1 / (1 + e^-x)",
            Math::Softplus => "elementwise log(1 + e^x)",
            Math::Silu => "elementwise x * sigmoid(x)",
            Math::Erf => "elementwise error function",
            Math::Sin => "elementwise sine",
            Math::Cos => "elementwise cosine",
            Math::Floor => "elementwise round down",
            Math::Ceil => "elementwise round up",
            Math::Sign => "elementwise -1, 0 or 1",
        }
    }
}

/// The elementwise functions of two operands, broadcasting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pairwise {
    Pow,
    Maximum,
    Minimum,
}

impl Pairwise {
    pub fn op(self) -> BinaryOp {
        match self {
            Pairwise::Pow => BinaryOp::Pow,
            Pairwise::Maximum => BinaryOp::Max,
            Pairwise::Minimum => BinaryOp::Min,
        }
    }
}

/// The reductions over axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reduction {
    Sum,
    Mean,
    Max,
    Min,
    Count,
    Var,
    /// The square root of `Var`.
    Std,
}

impl Reduction {
    /// The IR reduction (`Std` reduces as `Var`, then takes the square root).
    pub fn kind(self, bessel: bool) -> ReduceKind {
        match self {
            Reduction::Sum => ReduceKind::Sum,
            Reduction::Mean => ReduceKind::Mean,
            Reduction::Max => ReduceKind::Max,
            Reduction::Min => ReduceKind::Min,
            Reduction::Count => ReduceKind::Count,
            Reduction::Var | Reduction::Std => ReduceKind::Var { bessel },
        }
    }

    /// Whether it takes `bessel =`.
    pub fn has_bessel(self) -> bool {
        matches!(self, Reduction::Var | Reduction::Std)
    }
}

/// Every builtin function of the language.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Builtin {
    SplitHeads,
    MergeHeads,
    MixHeads,
    Interleave,
    Deinterleave,
    Collapse,
    Rope,
    Concat,
    Attention,
    Math(Math),
    Gelu,
    Pairwise(Pairwise),
    Clamp,
    Where,
    Reduce(Reduction),
    LooMean,
    Thresholds,
    Eye,
    Vector,
}

use ParamKind as K;

/// The positions of `attention`'s parameters in [`ATTENTION`].
pub mod attention {
    pub const Q: usize = 0;
    pub const KEYS: usize = 1;
    pub const VALUES: usize = 2;
    pub const MASK: usize = 3;
    pub const WINDOW: usize = 4;
    pub const BLOCK: usize = 5;
    pub const SCALE: usize = 6;
    pub const SCORE: usize = 7;
    pub const MIX_LOGITS: usize = 8;
    pub const MIX_PROBS: usize = 9;
    pub const LENGTHS: usize = 10;
    pub const WINDOW_LEFT: usize = 11;
    pub const WINDOW_RIGHT: usize = 12;
    pub const PAGES: usize = 13;
    pub const WEIGHTS: usize = 14;
    pub const SINK: usize = 15;
}

/// `attention`'s parameters, at the positions [`attention`] names.
pub const ATTENTION: &[Param] = &[
    p("q", K::Tensor),
    p("k", K::Tensor),
    p("v", K::Tensor),
    p("mask", K::ChoiceOrFunction(MaskName::NAMES, FuncKind::Mask)),
    p("window", K::Size),
    p("block", K::Size),
    p("scale", K::Number),
    p("score", K::Function(FuncKind::Score)),
    p("mix_logits", K::Tensor),
    p("mix_probs", K::Tensor),
    p("lengths", K::Tensor),
    p("window_left", K::Count),
    p("window_right", K::Count),
    p("pages", K::Tensor),
    p("weights", K::Choice(WeightsName::NAMES)),
    p("sink", K::Tensor),
];

const X: Param = p("x", K::Tensor);
const REDUCE: &[Param] = &[X, p("axis", K::Axes), p("keepdim", K::Bool)];
const REDUCE_BESSEL: &[Param] = &[X, p("axis", K::Axes), p("bessel", K::Bool), p("keepdim", K::Bool)];

impl Builtin {
    /// Every builtin, in the order `docs/language.md` lists them.
    pub const ALL: &'static [Builtin] = {
        use Builtin::*;
        &[
            SplitHeads,
            MergeHeads,
            MixHeads,
            Interleave,
            Deinterleave,
            Collapse,
            Rope,
            Concat,
            Attention,
            Math(self::Math::Sqrt),
            Math(self::Math::Abs),
            Math(self::Math::Exp),
            Math(self::Math::Log),
            Math(self::Math::Log1p),
            Math(self::Math::Tanh),
            Math(self::Math::Sigmoid),
            Math(self::Math::Softplus),
            Math(self::Math::Silu),
            Gelu,
            Math(self::Math::Erf),
            Math(self::Math::Sin),
            Math(self::Math::Cos),
            Math(self::Math::Floor),
            Math(self::Math::Ceil),
            Math(self::Math::Sign),
            Pairwise(self::Pairwise::Pow),
            Clamp,
            Pairwise(self::Pairwise::Maximum),
            Pairwise(self::Pairwise::Minimum),
            Where,
            Reduce(Reduction::Sum),
            Reduce(Reduction::Mean),
            Reduce(Reduction::Max),
            Reduce(Reduction::Min),
            Reduce(Reduction::Count),
            Reduce(Reduction::Var),
            Reduce(Reduction::Std),
            LooMean,
            Thresholds,
            Eye,
            Vector,
        ]
    };

    pub fn from_name(name: &str) -> Option<Builtin> {
        Builtin::ALL.iter().copied().find(|b| b.name() == name)
    }

    pub fn name(self) -> &'static str {
        self.signature().name
    }

    #[rustfmt::skip]
    pub fn signature(self) -> Signature {
        let s = |name, params, required, summary| Signature { name, params, required, summary };
        match self {
            Builtin::SplitHeads => s("split_heads", const { &[X, p("heads", K::Size)] }, 2, "[.., S, H*d] -> [.., H, S, d]"),
            Builtin::MergeHeads => s("merge_heads", const { &[X] }, 1, "[.., H, S, d] -> [.., S, H*d]"),
            Builtin::MixHeads => s("mix_heads", const { &[X, p("alpha", K::Tensor)] }, 2, "x [B, M, S, d], alpha [M, H, P] -> [B, H, P, S, d]"),
            Builtin::Interleave => s("interleave", const { &[X] }, 1, "[B, H, P, S, d] -> [B, H, S*P, d], row s*P + j"),
            Builtin::Deinterleave => s("deinterleave", const { &[X, p("pseudo", K::Size)] }, 2, "[B, H, S*P, d] -> [B, H, P, S, d]"),
            Builtin::Collapse => s("collapse", const { &[X, p("r", K::Tensor), p("mode", K::Choice(CollapseMode::NAMES))] }, 2, "x [B, H', P, S, d], r [H, H'*P] -> [B, H, S, d]; per_head keeps only r[h, h·P + j] (each head collapses its own P rows)"),
            Builtin::Rope => s("rope", const { &[X, p("base", K::Number), p("offset", K::DimSize)] }, 1, "rotary embedding at position offset + row index; base none = identity; offset a size of dims (default 0)"),
            Builtin::Concat => s("concat", const { &[p("a", K::Tensor), p("b", K::Tensor), p("axis", K::Axis)] }, 3, "a and b joined along axis (negative counts from the end); their other axes equal"),
            Builtin::Attention => s("attention", ATTENTION, 3, "softmax(score(q kᵀ · scale) + mask) v; mask a name or a function of (b, h, i, j) to bool, score a function of (s, b, h, i, j); mix_logits [H_q, H_s] mixes heads' logits before the softmax, mix_probs [H_s, H_o] its probabilities after (Talking-Heads); lengths [B] each sequence's key count (its queries the last rows); window_left, window_right: keys p - left ..= p + right of query position p; pages [B, MP] a block table into k, v caches [NB, PS, H_kv, d]; weights: how scores become weights (softmax, sigmoid, linear, hard); sink [H] a logit per query head in every row's softmax denominator"),
            Builtin::Math(m) => s(m.op().name(), &[X], 1, m.summary()),
            Builtin::Gelu => s("gelu", const { &[X, p("approximate", K::Choice(GeluForm::NAMES))] }, 1, "elementwise x * Phi(x), or its tanh approximation"),
            Builtin::Pairwise(Pairwise::Pow) => s("pow", const { &[p("a", K::Operand), p("b", K::Operand)] }, 2, "elementwise a^b, broadcasting"),
            Builtin::Pairwise(Pairwise::Maximum) => s("maximum", const { &[p("a", K::Operand), p("b", K::Operand)] }, 2, "elementwise maximum, broadcasting"),
            Builtin::Pairwise(Pairwise::Minimum) => s("minimum", const { &[p("a", K::Operand), p("b", K::Operand)] }, 2, "elementwise minimum, broadcasting"),
            Builtin::Clamp => s("clamp", const { &[p("x", K::Operand), p("lo", K::Operand), p("hi", K::Operand)] }, 3, "elementwise min(max(x, lo), hi), broadcasting"),
            Builtin::Where => s("where", const { &[p("cond", K::Operand), p("a", K::Operand), p("b", K::Operand)] }, 3, "elementwise cond != 0 ? a : b, broadcasting"),
            Builtin::Reduce(Reduction::Sum) => s("sum", REDUCE, 2, "sum over an axis (or `all`)"),
            Builtin::Reduce(Reduction::Mean) => s("mean", REDUCE, 2, "mean over an axis (or `all`)"),
            Builtin::Reduce(Reduction::Max) => s("max", REDUCE, 2, "maximum over an axis (or `all`)"),
            Builtin::Reduce(Reduction::Min) => s("min", REDUCE, 2, "minimum over an axis (or `all`)"),
            Builtin::Reduce(Reduction::Count) => s("count", REDUCE, 2, "number of non-zero entries over an axis (or `all`)"),
            Builtin::Reduce(Reduction::Var) => s("var", REDUCE_BESSEL, 2, "variance over an axis; bessel divides by n - 1"),
            Builtin::Reduce(Reduction::Std) => s("std", REDUCE_BESSEL, 2, "standard deviation over an axis; bessel divides by n - 1"),
            Builtin::LooMean => s("loo_mean", const { &[X, p("axis", K::Axis)] }, 2, "leave-one-out mean along an axis (needs 2 or more entries)"),
            Builtin::Thresholds => s("thresholds", const { &[X, p("levels", K::Size)] }, 2, "ratings 1..K -> [.., K-1] indicators 1[x >= tau], tau = 2..K"),
            Builtin::Eye => s("eye", const { &[p("rows", K::Size), p("cols", K::Size), p("offset", K::Int)] }, 1, "a constant [rows, cols] matrix (cols = rows by default), 1 where col = row + offset (0 by default), else 0"),
            Builtin::Vector => s("vector", const { &[p("values", K::Numbers), p("length", K::Size), p("fill", K::Number)] }, 2, "a constant vector: `values`, or `length` copies of `fill` when values is none"),
        }
    }
}

/// The builtin table as `docs/language.md` shows it (a test keeps that page current).
pub fn markdown_table() -> String {
    let mut out = String::from("| builtin | arguments (`?`: optional) | meaning |\n|---|---|---|\n");
    for b in Builtin::ALL {
        let sig = b.signature();
        let args: Vec<String> = sig
            .params
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let optional = if i < sig.required { "" } else { "?" };
                format!("`{}`{optional}: {}", p.name, p.kind.describe())
            })
            .collect();
        let cell = |s: &str| s.replace('|', "\\|");
        out.push_str(&format!("| `{}` | {} | {} |\n", sig.name, cell(&args.join(", ")), cell(sig.summary)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_has_one_name_and_round_trips() {
        let mut seen = std::collections::HashSet::new();
        for b in Builtin::ALL {
            assert!(seen.insert(b.name()), "`{}` is named twice", b.name());
            assert_eq!(Builtin::from_name(b.name()), Some(*b));
            let sig = b.signature();
            assert!(sig.required <= sig.params.len(), "{}", sig.name);
        }
        assert_eq!(Builtin::from_name("neg"), None, "unary minus is an operator, not a builtin");
    }

    /// Every elementwise function of the IR but unary minus (an operator) and
    /// the tanh form of GELU (`gelu`'s `approximate = tanh`) is a listed builtin.
    #[test]
    fn every_elementwise_function_is_listed() {
        for op in UnaryOp::ALL {
            let listed = Builtin::ALL.iter().any(|b| match b {
                Builtin::Math(m) => m.op() == op,
                Builtin::Gelu => op == UnaryOp::Gelu,
                _ => false,
            });
            assert_eq!(listed, !matches!(op, UnaryOp::Neg | UnaryOp::GeluTanh), "{}", op.name());
        }
    }

    /// Every binary operation but the infix operators (`+ - * /`, the
    /// comparisons) is a listed pairwise builtin, and every reduction of the
    /// IR is one a listed reduction builtin computes.
    #[test]
    fn every_pairwise_function_and_reduction_is_listed() {
        let infix =
            [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Ge, BinaryOp::Gt, BinaryOp::Eq];
        for op in BinaryOp::ALL {
            let listed = Builtin::ALL.iter().any(|b| matches!(b, Builtin::Pairwise(p) if p.op() == op));
            assert_eq!(listed, !infix.contains(&op), "{op:?}");
        }
        for kind in ReduceKind::ALL {
            let listed = Builtin::ALL
                .iter()
                .any(|b| matches!(b, Builtin::Reduce(r) if [false, true].iter().any(|bessel| r.kind(*bessel) == kind)));
            assert!(listed, "{}", kind.name());
        }
    }

    #[test]
    fn choices_list_their_names_in_order() {
        assert_eq!(MaskName::NAMES.len(), MaskName::ALL.len());
        assert_eq!(
            MaskName::NAMES[MaskName::ALL.iter().position(|m| *m == MaskName::TokenCausal).unwrap()],
            "token_causal"
        );
        assert_eq!(CollapseMode::NAMES, ["global", "per_head"]);
    }

    #[test]
    fn attentions_positions_name_their_parameters() {
        use super::attention::*;
        let at = |i: usize| super::ATTENTION[i].name;
        assert_eq!(
            [
                Q,
                KEYS,
                VALUES,
                MASK,
                WINDOW,
                BLOCK,
                SCALE,
                SCORE,
                MIX_LOGITS,
                MIX_PROBS,
                LENGTHS,
                WINDOW_LEFT,
                WINDOW_RIGHT,
                PAGES
            ]
            .map(at),
            [
                "q",
                "k",
                "v",
                "mask",
                "window",
                "block",
                "scale",
                "score",
                "mix_logits",
                "mix_probs",
                "lengths",
                "window_left",
                "window_right",
                "pages"
            ]
        );
    }
}
