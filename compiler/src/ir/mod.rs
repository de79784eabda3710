//! The typed IR: a program is an arena of tensor operations in which every
//! operand precedes its user (so a program is already in evaluation order),
//! with symbolic sizes for dims (`B`, `N`, …) and concrete sizes for
//! everything bound from parameters.
//!
//! Each [`Op`] documents its `## Shape rules`; [`Op::infer`] is the single
//! implementation of them, used by lowering and by the validator alike.
//!
//! `shape` (dims, shapes, node ids, broadcasting), `op` (the operations and
//! their options), `func` (attention's score and mask functions), `infer` (the shape rules), `program` (nodes, inputs, the
//! program and its printing); everything is re-exported here.

mod func;
pub mod func_eval;
pub mod func_range;
mod infer;
mod op;
mod program;
pub mod scalar;
mod shape;
mod table;

pub use func::*;
pub use infer::*;
pub use op::*;
pub use program::*;
pub use shape::*;
pub use table::*;

use std::collections::BTreeMap;
