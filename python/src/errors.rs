//! kvgpt's errors as Python exceptions.

use pyo3::conversion::FromPyObjectOwned;
use pyo3::exceptions::{PyFileNotFoundError, PyOSError, PyOverflowError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;

/// A kvgpt error as the Python exception that fits it: a missing model is `FileNotFoundError`,
/// a bad argument `ValueError` (a prompt past the context, a token id outside the vocabulary),
/// anything else `RuntimeError`; each with kvgpt's own message.
pub(crate) fn py_err(e: kvgpt_core::Error) -> PyErr {
    use kvgpt_core::Error as E;
    let msg = e.to_string();
    match e {
        E::MissingFile { .. } | E::NotAFile { .. } | E::NotCached { .. } | E::NotAModel { .. } => {
            PyFileNotFoundError::new_err(msg)
        }
        E::Io { .. } | E::Write { .. } => PyOSError::new_err(msg),
        E::ContextOverflow { .. } | E::CacheOverflow { .. } | E::BadTokenId { .. } | E::Invalid(_) => {
            PyValueError::new_err(msg)
        }
        _ => PyRuntimeError::new_err(msg),
    }
}

/// `v` as the argument `name` of type `T`: an int out of `T`'s range (pyo3's `OverflowError`) is
/// a `ValueError`, as README says of a bad argument; a value of another type a `TypeError`.
pub(crate) fn arg<'py, T: FromPyObjectOwned<'py>>(v: &Bound<'py, PyAny>, name: &str) -> PyResult<T> {
    v.extract::<T>().map_err(|e| {
        let e: PyErr = e.into();
        if e.is_instance_of::<PyOverflowError>(v.py()) {
            PyValueError::new_err(format!("{name}: {v} is out of range"))
        } else {
            PyTypeError::new_err(format!("{name}: {e}"))
        }
    })
}

/// An OpenAI-shaped error (the server's 4xx and 5xx) as an exception: a request that was wrong
/// is `ValueError`, anything else `RuntimeError`; each with the server's message.
pub(crate) fn api_err(e: kvgpt_core::openai::ApiError) -> PyErr {
    if e.status.is_client_error() {
        PyValueError::new_err(e.message)
    } else {
        PyRuntimeError::new_err(e.message)
    }
}
