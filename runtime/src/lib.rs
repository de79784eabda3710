//! Executing compiled specs: host tensors, the float64 reference interpreter,
//! tensor files and input generation.

pub mod bind;
pub mod dtype;
mod error;
pub mod interp;
pub mod io;
pub mod nvidia;
pub mod rng;
pub mod tensor;

pub use error::RunError;
pub use tensor::{relative_error, Tensor};
pub mod cuda;
pub mod gpu;
pub mod pipeline;
