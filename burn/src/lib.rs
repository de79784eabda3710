//! attnc specs as Burn operations: a compiled spec runs on Burn tensors on
//! any cubecl device (wgpu, CUDA, …), its launches on Burn's client and
//! buffers with no host round trip, and differentiates through Burn's
//! autodiff with attnc's gradient program, whose forward phase keeps what
//! its backward reads.
//!
//! ```ignore
//! let op = attnc_burn::AttncOp::from_file("stdlib/iha.attn", &[("P", "2")])?;
//! let mut out = op.forward(Inputs::new().with("x", x).with("w_q", w_q) /* … */)?;
//! let y: Tensor<4> = out.take("y")?;
//! ```

mod backend;
mod error;
mod layer;
mod op;

pub use backend::{AttncBackend, Call, Tensors, MAX_INPUTS};
pub use error::Error;
pub use layer::AttncLayer;
pub use op::{AttncOp, Inputs, Outputs};
