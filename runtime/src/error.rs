use attnc_compiler::Code;

/// Why a compiled spec could not be run on the given tensors.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}")]
    TensorFile(String),
    #[error("{0}")]
    BadInputValue(String),
    #[error("{0}")]
    BadSetting(String),
    #[error("{0}")]
    Io(String),
    /// A size past the kernels' 32-bit indexing, or too small for an op.
    #[error("{0}")]
    BadSize(String),
    /// Over `--memory-budget` or `--max-flops`: the estimate, the limit and the flag.
    #[error("{0}")]
    OverBudget(String),
    /// A score or mask function read outside a tensor.
    #[error("{0}")]
    OutOfRange(String),
}

impl RunError {
    pub fn code(&self) -> Code {
        match self {
            RunError::TensorFile(_) => Code::TensorFile,
            RunError::Io(_) => Code::Io,
            RunError::OverBudget(_) => Code::OverBudget,
            RunError::BadSize(_) => Code::BadSize,
            RunError::BadInputValue(_) => Code::BadInputValue,
            RunError::BadSetting(_) => Code::BadSetting,
            RunError::OutOfRange(_) => Code::OutOfRange,
        }
    }
}
