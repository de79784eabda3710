//! attnc specs as Burn operations: a compiled spec runs on Burn tensors on
//! any cubecl device (wgpu, CUDA, …), its launches on Burn's client and
//! buffers with no host round trip, and differentiates through Burn's
//! autodiff with attnc's gradient program, whose forward phase keeps what
//! its backward reads.
//!
//! ```text
//! let op = AttncOp::from_file("stdlib/iha.attn", &[("P", "2")])?;
//! let layer = AttncLayer::new(op, 0, &device)?;   // the weights as Params
//! let y: Tensor<3> = layer.forward(Inputs::new().with("x", x))?.take("y")?;
//! ```
//!
//! (`examples/burn_iha.rs` trains a decoder of such layers; docs/rust.md.)

mod backend;
mod error;
mod layer;
mod op;

pub use backend::{AttncBackend, Call, Tensors, MAX_INPUTS};
pub use error::Error;
pub use layer::AttncLayer;
pub use op::{AttncOp, Inputs, Outputs};
