//! coil's error type.
//!
//! Every error a user can cause names the op, the operands' shapes and dtypes, and the user's
//! source line (captured with `#[track_caller]` by the frontend), e.g.
//! `shape error in matmul at examples/quickstart.rs:12: contracted dims differ (3 vs 4); operands: f32[2, 3], f32[4, 5]`.

use std::fmt;
use std::panic::Location;

/// What went wrong, in broad classes a caller can match on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Shapes do not fit the op (broadcasting, contraction, reshape sizes, dims out of range).
    Shape,
    /// Dtypes do not fit the op (bitwise op on floats, non-integer indices).
    DType,
    /// An index or argument value is out of range (gather index, slice bounds, dropout p).
    Value,
    /// Tensors on different devices in one op.
    Device,
    /// The op or this use of it is not supported (yet).
    Unsupported,
    /// Failure while running (compiler not found, I/O, backend error, out of memory).
    Runtime,
    /// A bug in coil: an invariant of its own broke (a panic caught at the boundary of
    /// realize, reported with the graph's ops and the user's line instead of unwinding).
    Internal,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorKind::Shape => "shape",
            ErrorKind::DType => "dtype",
            ErrorKind::Value => "value",
            ErrorKind::Device => "device",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Runtime => "runtime",
            ErrorKind::Internal => "internal",
        })
    }
}

/// An error from building or running a tensor program.
///
/// ```
/// use coil_ir::{Error, ErrorKind};
/// let e = Error::shape("cannot broadcast [2, 3] with [4]").in_op("add", vec!["f32[2, 3]".into(), "f32[4]".into()]);
/// assert_eq!(e.kind, ErrorKind::Shape);
/// assert_eq!(e.to_string(), "shape error in add: cannot broadcast [2, 3] with [4]; operands: f32[2, 3], f32[4]");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct Error {
    /// The broad class, for callers that match on it.
    pub kind: ErrorKind,
    /// The op the error arose in (`matmul`), when there is one.
    pub op: Option<String>,
    /// What went wrong, in words.
    pub message: String,
    /// The operands, printed as `dtype[shape]`.
    pub operands: Vec<String>,
    /// The user's source line.
    pub location: Option<&'static Location<'static>>,
    /// The captured graph's node a compiled graph's run-time data error comes from
    /// ([`crate::loops::DataCheck::node`]): a compiled graph serves every capture of its
    /// structure, so the frontend names that node of the capture that ran (its line and
    /// operands). Not printed.
    pub node: Option<usize>,
}

/// `Result` with coil's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error of `kind` with no op, operands or location yet.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error { kind, op: None, message: message.into(), operands: vec![], location: None, node: None }
    }
    /// An [`ErrorKind::Shape`] error.
    pub fn shape(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Shape, message)
    }
    /// An [`ErrorKind::DType`] error.
    pub fn dtype(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::DType, message)
    }
    /// An [`ErrorKind::Value`] error.
    pub fn value(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Value, message)
    }
    /// An [`ErrorKind::Unsupported`] error.
    pub fn unsupported(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Unsupported, message)
    }
    /// An [`ErrorKind::Runtime`] error.
    pub fn runtime(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Runtime, message)
    }
    /// An [`ErrorKind::Internal`] error: a bug in coil.
    pub fn internal(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Internal, message)
    }

    /// Names the op and its operands, unless an inner step already did.
    pub fn in_op(mut self, op: impl Into<String>, operands: Vec<String>) -> Error {
        if self.op.is_none() {
            self.op = Some(op.into());
            self.operands = operands;
        }
        self
    }

    /// Records the user's source line, unless one is already recorded.
    pub fn at(mut self, location: &'static Location<'static>) -> Error {
        self.location.get_or_insert(location);
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} error", self.kind)?;
        if let Some(op) = &self.op {
            write!(f, " in {op}")?;
        }
        if let Some(loc) = self.location {
            write!(f, " at {}:{}", loc.file(), loc.line())?;
        }
        write!(f, ": {}", self.message)?;
        if !self.operands.is_empty() {
            write!(f, "; operands: {}", self.operands.join(", "))?;
        }
        Ok(())
    }
}
