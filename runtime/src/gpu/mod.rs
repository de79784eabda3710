//! The CubeCL backend. **API Boundary:** every use of cubecl is in this
//! folder, so its API changes touch nothing else.
//!
//! The plan it runs (`attnc_compiler::plan`) is plain data made without it.
//! - `kit/` — the attention kernel kit: launch description, mask, pair
//!   step, tile walks, normaliser, key/value sources, each written once;
//! - `kernels/` — the `#[cube]` kernel bodies and helpers;
//! - `attention_tiled.rs`, `attention_split.rs`, `gemm.rs` — the tiled
//!   kernels, assembled from helpers (`attention.rs`: what the forward
//!   mainloops share beyond the kit);
//! - `mma/` — the same on matrix fragments (tensor cores);
//! - `attention_grad.rs` — attention's backward and the log-sum-exp it saves;
//! - `attention_mixed.rs`, `attention_mixed_grad.rs` — attention that mixes
//!   heads inside the softmax, forward and backward; `attention_mixed_tiled.rs`
//!   its forward for Mesa's CPU drivers; `mixed_launch.rs` picks one;
//! - `func.rs` — score and mask functions compiled into attention kernels;
//! - `define.rs` — a plan launch → a cubecl kernel definition;
//! - `device.rs` — what a device offers (matrix units, plane width, staging).

pub mod attention;
pub mod attention_grad;
pub mod attention_grad_read;
pub mod attention_mixed;
pub mod attention_mixed_grad;
pub mod attention_mixed_tiled;
pub mod attention_split;
pub mod attention_tiled;
pub mod attention_tiled_grad;
pub mod baseline;
pub mod bench;
pub mod define;
pub mod device;
pub mod emit;
pub mod exec;
pub mod func;
pub mod gemm;
pub mod kernels;
pub mod kit;
pub mod mixed_launch;
pub mod mma;
