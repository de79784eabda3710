//! `attnc` as a library: the pipeline from a `.attn` spec to kernels and
//! results (see [`Compiler`]), with the compiler and runtime crates behind it.
//!
//! ```no_run
//! use attnc::{Backend, Compiler};
//! let bound = Compiler::open("stdlib/mha.attn")?.set("N", 256).compile()?.seeded(0)?;
//! let y = &bound.run(Backend::Wgpu)?["y"];
//! # Ok::<(), attnc::Error>(())
//! ```

pub use attnc_compiler as compiler;
pub use attnc_compiler::opt::cost::{Mode, Target, CPU, H200};
pub use attnc_runtime as runtime;
pub use attnc_runtime::cuda::{Cuda, DeviceTensor, Kernels};
pub use attnc_runtime::gpu::emit::Target as Source;
pub use attnc_runtime::pipeline::{Backend, Bound, Compiler, Device, Error, Program};
pub use attnc_runtime::{relative_error, Tensor};
