//! Tokens: one request instance, in the forms that travel in messages.

use edgemark::{Outcome, Token};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyInt, PyMemoryView, PyString, PyTuple};

/// One request instance in one region: the region's ID, a slot and the
/// slot's generation when the request began.
///
/// A token travels inside the dispatch message a stage worker already gets,
/// in one of its stable forms: ``str(token)`` (``"em1.<region>.<slot>.<gen>"``,
/// at most 38 ASCII characters), ``bytes(token)`` (16 bytes) or ``int(token)``
/// (a 128-bit integer). ``Token(value)`` and ``Token.parse`` /
/// ``Token.from_bytes`` / ``Token.from_int`` read them back. Tokens pickle,
/// compare equal by value and hash.
#[pyclass(module = "edgemark", name = "Token", frozen, eq, hash)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct PyToken(pub(crate) Token);

pub(crate) fn parse_token(s: &str) -> PyResult<Token> {
    s.parse::<Token>()
        .map_err(|e| PyValueError::new_err(format!("{e}: {s:?}")))
}

/// The bytes of a `bytes`, `bytearray` or `memoryview` (the forms a token's
/// 16 bytes take after a socket read or a buffer slice); `None` for any
/// other type.
fn bytes_like(value: &Bound<'_, PyAny>) -> Option<PyResult<Vec<u8>>> {
    if let Ok(b) = value.cast::<PyBytes>() {
        return Some(Ok(b.as_bytes().to_vec()));
    }
    if let Ok(b) = value.cast::<PyByteArray>() {
        return Some(Ok(b.to_vec()));
    }
    if value.cast::<PyMemoryView>().is_ok() {
        return Some(
            value
                .call_method0("tobytes")
                .and_then(|b| Ok(b.cast::<PyBytes>()?.as_bytes().to_vec())),
        );
    }
    None
}

fn token_from_bytes(b: &[u8]) -> PyResult<Token> {
    let arr: [u8; 16] = b
        .try_into()
        .map_err(|_| PyValueError::new_err(format!("a token is 16 bytes, not {}", b.len())))?;
    Ok(Token::from_bytes(arr))
}

#[pymethods]
impl PyToken {
    /// ``Token(value)``: a token from any of its forms (a ``Token``, its
    /// text, its 16 bytes as ``bytes``, ``bytearray`` or ``memoryview``, or
    /// its integer). Raises ``ValueError`` for a value that is no token's
    /// form, ``TypeError`` for another type.
    #[new]
    fn new(value: &Bound<'_, PyAny>) -> PyResult<PyToken> {
        if let Ok(t) = value.cast::<PyToken>() {
            return Ok(*t.get());
        }
        if let Ok(s) = value.cast::<PyString>() {
            return Ok(PyToken(parse_token(&s.to_cow()?)?));
        }
        if let Some(b) = bytes_like(value) {
            return Ok(PyToken(token_from_bytes(&b?)?));
        }
        if value.cast::<PyInt>().is_ok() {
            let v: u128 = value
                .extract()
                .map_err(|_| PyValueError::new_err("a token's integer is 0 <= n < 2**128"))?;
            return Ok(PyToken(Token::from_u128(v)));
        }
        Err(PyTypeError::new_err(format!(
            "a token is made from a Token, str, bytes, bytearray, memoryview or int, not {}",
            value.get_type().name()?
        )))
    }

    /// The token written as ``str(token)``. Raises ``ValueError`` if ``s``
    /// is not one.
    #[staticmethod]
    fn parse(s: String) -> PyResult<PyToken> {
        Ok(PyToken(parse_token(&s)?))
    }

    /// The token written as ``bytes(token)`` (16 little-endian bytes, as
    /// ``bytes``, ``bytearray`` or ``memoryview``). Raises ``ValueError``
    /// for any other length, ``TypeError`` for another type.
    #[staticmethod]
    fn from_bytes(b: &Bound<'_, PyAny>) -> PyResult<PyToken> {
        match bytes_like(b) {
            Some(bytes) => Ok(PyToken(token_from_bytes(&bytes?)?)),
            None => Err(PyTypeError::new_err(format!(
                "a token's bytes are bytes, bytearray or memoryview, not {}",
                b.get_type().name()?
            ))),
        }
    }

    /// The token written as ``int(token)``.
    #[staticmethod]
    fn from_int(v: u128) -> PyToken {
        PyToken(Token::from_u128(v))
    }

    /// The slot index.
    #[getter]
    fn slot(&self) -> u32 {
        self.0.slot()
    }

    /// The slot's generation when the request began (never 0).
    #[getter]
    fn generation(&self) -> u32 {
        self.0.generation()
    }

    /// The ID of the region the token belongs to.
    #[getter]
    fn region_id(&self) -> u64 {
        self.0.region_id().get()
    }

    fn __str__(&self) -> String {
        self.0.to_string()
    }

    fn __repr__(&self) -> String {
        format!("Token('{}')", self.0)
    }

    fn __bytes__<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.0.to_bytes())
    }

    fn __int__(&self) -> u128 {
        self.0.to_u128()
    }

    /// Pickles as ``Token(str(token))``.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let text = slf.get().0.to_string();
        PyTuple::new(
            py,
            [
                slf.get_type().into_any(),
                PyTuple::new(py, [text])?.into_any(),
            ],
        )
    }
}

/// A token argument of a recording call, read without raising: a `Token`,
/// its text, bytes (`bytes`, `bytearray` or `memoryview`) or integer, or `None` (the request runs unrecorded).
///
/// This is runtime data (it arrives inside a message), so a value that is no
/// token is an outcome, not an exception: `None` is `disabled` (recording is
/// off for this request, as when `begin` returned `None`), anything else that
/// is not a token is `invalid`.
#[inline(always)]
pub(crate) fn token_arg(value: &Bound<'_, PyAny>) -> Result<Token, Outcome> {
    // `Token` has no subclasses (it is not declared `subclass`), so the
    // exact type is every `Token`: one compare, no subtype walk.
    match value.cast_exact::<PyToken>() {
        Ok(t) => Ok(t.get().0),
        Err(_) => token_of_other(value),
    }
}

/// `token_arg` of a value that is not a `Token`.
#[cold]
fn token_of_other(value: &Bound<'_, PyAny>) -> Result<Token, Outcome> {
    if value.is_none() {
        return Err(Outcome::Disabled);
    }
    if let Ok(s) = value.cast::<PyString>() {
        return s
            .to_cow()
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or(Outcome::Invalid);
    }
    if let Some(b) = bytes_like(value) {
        return b
            .ok()
            .and_then(|b| token_from_bytes(&b).ok())
            .ok_or(Outcome::Invalid);
    }
    if value.cast::<PyInt>().is_ok() {
        return value
            .extract::<u128>()
            .map(Token::from_u128)
            .map_err(|_| Outcome::Invalid);
    }
    Err(Outcome::Invalid)
}
