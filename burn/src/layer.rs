//! A compiled spec as a Burn module ([`AttncLayer`]): the spec's `weight`
//! inputs are the module's parameters, drawn from the spec's own
//! distributions (`weight w_q: [D, D] ~ normal(0, 1 / sqrt(D))`), trained by
//! Burn's optimizers and saved and loaded with the module's record.

use crate::error::Error;
use crate::op::{AttncOp, Inputs, Outputs};
use attnc_compiler::Code;
use attnc_runtime::bind;
use burn::module::{Module, Param};
use burn::tensor::{Device, Tensor, TensorData};

/// A spec whose weights are parameters: call [`AttncLayer::forward`] with
/// its activations (the spec's other inputs).
#[derive(Module, Debug)]
pub struct AttncLayer {
    /// The spec's weights of rank 1 to 4, each in declaration order.
    w1: Vec<Param<Tensor<1>>>,
    w2: Vec<Param<Tensor<2>>>,
    w3: Vec<Param<Tensor<3>>>,
    w4: Vec<Param<Tensor<4>>>,
    #[module(skip)]
    op: AttncOp,
    /// Each weight's name, rank and index in its rank's list.
    #[module(skip)]
    weights: Vec<(String, usize, usize)>,
}

impl AttncLayer {
    /// `op` with its weights drawn from the spec's distributions (seeded
    /// by `seed`, as `attnc run --seed`) on `device`, at the sizes its
    /// parameters and dims' defaults give.
    pub fn new(op: AttncOp, seed: u64, device: &Device) -> Result<AttncLayer, Error> {
        let program = op.program().clone();
        let dims = bind::default_dims(&program)?;
        let mut layer = AttncLayer { w1: vec![], w2: vec![], w3: vec![], w4: vec![], op, weights: vec![] };
        for (i, input) in program.inputs.iter().enumerate().filter(|(_, x)| x.weight) {
            let t = bind::draw_input(&program, i, &dims, seed);
            let data = TensorData::new(t.data.iter().map(|&x| x as f32).collect::<Vec<f32>>(), t.shape.clone());
            let at = match t.shape.len() {
                1 => push(&mut layer.w1, data, device),
                2 => push(&mut layer.w2, data, device),
                3 => push(&mut layer.w3, data, device),
                4 => push(&mut layer.w4, data, device),
                r => {
                    return Err(Error::new(
                        Code::RankMismatch,
                        format!(
                            "weight `{}` has rank {r}; attnc-burn's layers hold weights of rank 1 to 4",
                            input.name
                        ),
                    ))
                }
            };
            layer.weights.push((input.name.clone(), t.shape.len(), at));
        }
        Ok(layer)
    }

    /// The spec's op.
    pub fn op(&self) -> &AttncOp {
        &self.op
    }

    /// Weight `name`, of rank `D`, as the layer holds it: on an autodiff
    /// device, the tracked tensor whose `grad` a backward fills.
    pub fn weight<const D: usize>(&self, name: &str) -> Option<Tensor<D>> {
        let (_, rank, at) = self.weights.iter().find(|(n, r, _)| n == name && *r == D)?;
        // The rank is D: the same tensor, its rank restated.
        let t = match rank {
            1 => self.w1[*at].val().into_dispatch(),
            2 => self.w2[*at].val().into_dispatch(),
            3 => self.w3[*at].val().into_dispatch(),
            _ => self.w4[*at].val().into_dispatch(),
        };
        Some(Tensor::from_dispatch(t))
    }

    /// Runs the spec on `activations` and this layer's weights.
    pub fn forward(&self, activations: Inputs) -> Result<Outputs, Error> {
        let mut inputs = activations;
        for (name, rank, at) in &self.weights {
            inputs = match rank {
                1 => inputs.with(name, self.w1[*at].val()),
                2 => inputs.with(name, self.w2[*at].val()),
                3 => inputs.with(name, self.w3[*at].val()),
                _ => inputs.with(name, self.w4[*at].val()),
            };
        }
        self.op.forward(inputs)
    }
}

fn push<const D: usize>(list: &mut Vec<Param<Tensor<D>>>, data: TensorData, device: &Device) -> usize {
    list.push(Param::from_tensor(Tensor::from_data(data, device)));
    list.len() - 1
}
