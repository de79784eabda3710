//! Attention in float64: which keys a query sees and what each logit
//! scores ([`Scores`], the one definition the forward, the log-sum-exp and
//! the backward read), and the forward softmax.

use super::func::{self, Env, FVal, ReadError};
use crate::tensor::Tensor;
use attnc_compiler::ir::{AttnFns, Func, Mask, Weights};

/// The score of query row `i` against key row `j`: `scale · q_i · k_j`,
/// then the score function; `None` where the built-in mask or the mask
/// function hides the key (the score function is then not evaluated).
pub(super) struct Scores<'a> {
    pub q: &'a Tensor,
    pub k: &'a Tensor,
    pub mask: &'a Mask,
    pub scale: f64,
    pub fns: Option<(&'a AttnFns, Env<'a>)>,
    /// `∂score/∂s` of the score function, for the backward.
    slope: Option<Func>,
}

impl<'a> Scores<'a> {
    pub fn new([q, k]: [&'a Tensor; 2], mask: &'a Mask, scale: f64, fns: Option<(&'a AttnFns, Env<'a>)>) -> Scores<'a> {
        let slope = fns.as_ref().and_then(|(f, _)| f.score.as_ref()).map(attnc_compiler::grad::score_slope);
        Scores { q, k, mask, scale, fns, slope }
    }

    fn logit(&self, bi: usize, hi: usize, i: usize, j: usize) -> f64 {
        let (h, s, d) = (self.q.shape[1], self.q.shape[2], self.q.shape[3]);
        let (hk, sk) = (self.k.shape[1], self.k.shape[2]);
        let g = hi / (h / hk);
        let q = &self.q.data[((bi * h + hi) * s + i) * d..][..d];
        let k = &self.k.data[((bi * hk + g) * sk + j) * d..][..d];
        self.scale * q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>()
    }

    /// Whether query row `i` sees key row `j`.
    pub fn visible(&self, bi: usize, hi: usize, i: usize, j: usize) -> Result<bool, ReadError> {
        let (s, sk) = (self.q.shape[2], self.k.shape[2]);
        if !self.mask.visible(i as u64, j as u64, s as u64, sk as u64) {
            return Ok(false);
        }
        match &self.fns {
            Some((AttnFns { mask: Some(m), .. }, env)) => {
                let args = [bi, hi, i, j].map(|x| FVal::Int(x as i64));
                Ok(matches!(func::call(m, &args, env, [bi, hi, i, j])?, FVal::Bool(true)))
            }
            _ => Ok(true),
        }
    }

    /// The pair's score, `None` where the key is hidden: by a mask, or by
    /// a score of −∞ (FlexAttention's convention, under every weighting).
    pub fn at(&self, bi: usize, hi: usize, i: usize, j: usize) -> Result<Option<f64>, ReadError> {
        if !self.visible(bi, hi, i, j)? {
            return Ok(None);
        }
        let s = self.logit(bi, hi, i, j);
        let z = match &self.fns {
            Some((AttnFns { score: Some(f), .. }, _)) => self.call(f, s, [bi, hi, i, j])?.float(),
            _ => s,
        };
        Ok((z != f64::NEG_INFINITY).then_some(z))
    }

    /// How the row's scores become weights.
    pub fn weights(&self) -> Weights {
        self.fns.as_ref().map_or(Weights::Softmax, |(f, _)| f.weights)
    }

    /// The capture holding the softmax's sink logits, if any.
    pub fn sink_capture(&self) -> Option<usize> {
        self.fns.as_ref().and_then(|(f, _)| f.sink)
    }

    /// The softmax's sink logits (`[H]`), if any.
    pub fn sink(&self) -> Option<&'a Tensor> {
        self.sink_capture().map(|c| self.capture(c))
    }

    /// The captured tensor `c` of the functions.
    pub fn capture(&self, c: usize) -> &'a Tensor {
        let (_, env) = self.fns.as_ref().expect("attention functions");
        env.captures[c].1
    }

    /// `f`, a function of the score function's parameters, at scaled logit
    /// `s` of pair `at` = (b, h, i, j).
    pub fn call(&self, f: &Func, s: f64, at: [usize; 4]) -> Result<FVal, ReadError> {
        let (_, env) = self.fns.as_ref().expect("score functions");
        let [bi, hi, i, j] = at.map(|x| FVal::Int(x as i64));
        func::call(f, &[FVal::Float(s), bi, hi, i, j], env, at)
    }

    /// For a visible pair: its scaled logit, its score, and the score's
    /// derivative by the logit (1 without a score function).
    pub fn with_slope(&self, bi: usize, hi: usize, i: usize, j: usize) -> Result<Option<[f64; 3]>, ReadError> {
        if !self.visible(bi, hi, i, j)? {
            return Ok(None);
        }
        // A score of −∞ hides the pair, as in [`Self::at`].
        self.source(bi, hi, i, j).map(|src| (src[1] != f64::NEG_INFINITY).then_some(src))
    }

    /// [`Self::with_slope`] whatever the mask: with head mixing, the mask
    /// applies to the mixed logits, not to a query head's.
    pub fn source(&self, bi: usize, hi: usize, i: usize, j: usize) -> Result<[f64; 3], ReadError> {
        let s = self.logit(bi, hi, i, j);
        let at = [bi, hi, i, j];
        match (&self.fns, &self.slope) {
            (Some((AttnFns { score: Some(f), .. }, _)), Some(slope)) => {
                Ok([s, self.call(f, s, at)?.float(), self.call(slope, s, at)?.float()])
            }
            _ => Ok([s, s, 1.0]),
        }
    }
}

/// The largest of a row's scores (−∞ for none); NaN propagates (IEEE
/// 754), unlike `f64::max`.
pub(super) fn row_max(scores: impl Iterator<Item = f64>) -> f64 {
    scores.fold(f64::NEG_INFINITY, |m, x| if x.is_nan() || m.is_nan() { f64::NAN } else { m.max(x) })
}

/// The weights of a row's visible scores (`None`: hidden), in place, as
/// `weights` turns them (docs/semantics.md §9); `sink` is the row's sink
/// logit, for a softmax.
fn weigh(row: &mut [Option<f64>], weights: Weights, sink: Option<f64>) {
    let max = row_max(row.iter().flatten().copied());
    match weights {
        Weights::Softmax => {
            let max = sink.map_or(max, |z| row_max([max, z].into_iter()));
            let total: f64 =
                row.iter().flatten().map(|sc| (sc - max).exp()).sum::<f64>() + sink.map_or(0.0, |z| (z - max).exp());
            row.iter_mut().flatten().for_each(|sc| *sc = (*sc - max).exp() / total);
        }
        Weights::Sigmoid => row.iter_mut().flatten().for_each(|sc| *sc = 1.0 / (1.0 + (-*sc).exp())),
        Weights::Linear => {}
        Weights::Hard => {
            // Ties share the weight; a NaN score makes the whole row NaN.
            let ties = row.iter().flatten().filter(|&&x| x == max).count() as f64;
            row.iter_mut()
                .flatten()
                .for_each(|sc| *sc = if max.is_nan() { f64::NAN } else { f64::from(u8::from(*sc == max)) / ties });
        }
    }
}

/// `weights(scores) · v` per query row (a softmax unless the functions
/// say otherwise); a row that sees no key is 0; `round` rounds the
/// weights (the same-dtype references).
pub(super) fn attention(
    scores: &Scores,
    v: &Tensor,
    shape: Vec<usize>,
    round: &dyn Fn(f64) -> f64,
) -> Result<Tensor, ReadError> {
    let (q, k) = (scores.q, scores.k);
    let (b, h, s) = (q.shape[0], q.shape[1], q.shape[2]);
    let (hk, sk, e) = (k.shape[1], k.shape[2], v.shape[3]);
    let group = h / hk;
    let (weights, sink) = (scores.weights(), scores.sink());
    let mut out = Tensor::zeros(shape);
    let mut row = vec![None; sk];
    for bi in 0..b {
        for hi in 0..h {
            let g = hi / group;
            for i in 0..s {
                for (j, sc) in row.iter_mut().enumerate() {
                    *sc = scores.at(bi, hi, i, j)?;
                }
                if row.iter().all(Option::is_none) {
                    continue; // no visible key: the row is 0
                }
                weigh(&mut row, weights, sink.map(|t| t.data[hi]));
                let orow = ((bi * h + hi) * s + i) * e;
                for (j, w) in row.iter().enumerate() {
                    let Some(w) = w else { continue };
                    let w = round(*w);
                    if w != 0.0 {
                        for c in 0..e {
                            out.data[orow + c] += w * v.data[((bi * hk + g) * sk + j) * e + c];
                        }
                    }
                }
            }
        }
    }
    Ok(out)
}
