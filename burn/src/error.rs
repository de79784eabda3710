//! What can go wrong putting a compiled spec on Burn's tensors: attnc's
//! coded errors (`attnc explain-error CODE`), never a panic.

use attnc_compiler::Code;

/// A spec that does not compile, tensors that do not fit it, or a launch
/// the kernels cannot run; each with attnc's error code.
#[derive(Debug, thiserror::Error)]
#[error("error[{}]: {message}", code.as_str())]
pub struct Error {
    pub code: Code,
    pub message: String,
}

impl Error {
    pub(crate) fn new(code: Code, message: impl Into<String>) -> Error {
        Error { code, message: message.into() }
    }
}

impl From<attnc_runtime::RunError> for Error {
    fn from(e: attnc_runtime::RunError) -> Error {
        Error::new(e.code(), e.to_string())
    }
}

impl From<attnc_runtime::gpu::exec::GpuError> for Error {
    fn from(e: attnc_runtime::gpu::exec::GpuError) -> Error {
        use attnc_runtime::gpu::exec::GpuError;
        let code = match e {
            GpuError::Unsupported { .. } | GpuError::LoopLimit { .. } | GpuError::Dtype { .. } => Code::Backend,
            GpuError::MissingInput(_) => Code::TensorFile,
            _ => Code::Backend,
        };
        Error::new(code, e.to_string())
    }
}
