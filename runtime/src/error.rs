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
}

impl RunError {
    pub fn code(&self) -> Code {
        match self {
            RunError::TensorFile(_) | RunError::Io(_) => Code::TensorFile,
            RunError::BadInputValue(_) => Code::BadInputValue,
            RunError::BadSetting(_) => Code::BadSetting,
        }
    }
}
