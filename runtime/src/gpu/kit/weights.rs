//! Which normaliser a launch's rows use ([`Norm`], from the spec's
//! `weights =` and `sink =`): a comptime value of every attention launch
//! (`launch::Dims`); what each one computes is `norm`.

use attnc_compiler::ir::Weights;
use attnc_compiler::plan::KernelFns;

/// How a kernel's rows turn scores into weights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Norm {
    /// `exp(s − lse)`, online.
    #[default]
    Softmax,
    /// The softmax with one more logit per query head in its denominator
    /// (state slot 2), which weighs no value.
    Sink,
    /// `σ(s)`, no normalisation.
    Sigmoid,
    /// The masked score itself.
    Linear,
    /// `1 / ties` on each row's maximal scores: the state is `[max, ties]`.
    Hard,
}

impl Norm {
    /// The normaliser of attention's functions (a plain softmax without).
    pub fn of(fns: Option<&KernelFns>) -> Norm {
        fns.map_or(Norm::Softmax, |f| Norm::of_weights(f.weights, f.sink.is_some()))
    }

    /// The normaliser of `weights`, with a sink or not.
    pub fn of_weights(weights: Weights, sink: bool) -> Norm {
        match (weights, sink) {
            (Weights::Softmax, false) => Norm::Softmax,
            (Weights::Softmax, true) => Norm::Sink,
            (Weights::Sigmoid, _) => Norm::Sigmoid,
            (Weights::Linear, _) => Norm::Linear,
            (Weights::Hard, _) => Norm::Hard,
        }
    }

    /// Whether a row's weights are normalised by the state's sum
    /// (`1 / sum` at the finish) and rescaled when its max moves.
    pub fn sums(self) -> bool {
        matches!(self, Norm::Softmax | Norm::Sink | Norm::Hard)
    }

    /// The normaliser of a split-KV chunk: the sink joins at the combine.
    pub fn partial(self) -> Norm {
        match self {
            Norm::Sink => Norm::Softmax,
            other => other,
        }
    }
}
