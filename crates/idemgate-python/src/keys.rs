//! The module's functions on keys and fingerprints, and the fingerprint of a call's arguments
//! read from the Python value itself.

use idemgate::IdempotencyKey;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

/// A stable key for one step of one run: `IdempotencyKey::derive(run_id, step)`.
#[pyfunction]
pub(crate) fn derive_key(run_id: &str, step: &str) -> PyResult<String> {
    IdempotencyKey::derive(run_id, step)
        .map(|k| k.as_str().to_owned())
        .map_err(|e| {
            PyValueError::new_err(format!(
                "{e}: derive_key needs the run id and the step that name this step of this run"
            ))
        })
}

/// A fresh random key: `IdempotencyKey::mint()`.
#[pyfunction]
pub(crate) fn mint_key() -> String {
    IdempotencyKey::mint().as_str().to_owned()
}

/// Checks a caller's key (`IdempotencyKey::explicit`); raises `ValueError` with the reason.
#[pyfunction]
pub(crate) fn check_key(key: &str) -> PyResult<String> {
    IdempotencyKey::explicit(key)
        .map(|k| k.as_str().to_owned())
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// The fingerprint (hex SHA-256 of the canonical JSON) of JSON text, integers kept exact.
#[pyfunction]
pub(crate) fn fingerprint(args: &str) -> PyResult<String> {
    idemgate::Fingerprint::of_json_text(args.as_bytes())
        .map(|f| f.to_hex())
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// The fingerprint of a call's arguments given as a Python value, as the engine takes them: the
/// one of `json.dumps(args, default=repr)`.
#[pyfunction]
pub(crate) fn fingerprint_args(args: &Bound<'_, PyAny>) -> PyResult<String> {
    ArgsText::of(args)?
        .fingerprint()
        .map(|f| f.to_hex())
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// A call's arguments as JSON text: the one of `json.dumps(args, default=repr)` (what the
/// package passed before, and what a user can reproduce), written as its canonical text
/// straight from the Python value when it is made of plain JSON types (exactly `dict` with `str`
/// keys, `list`, `tuple`, `str`, `int` within 64 bits, finite `float`, `bool`, `None`), which
/// saves writing and re-parsing that text ([`canonical_json`]), with no JSON value built in
/// between. Anything else (subclasses, other types, big integers, NaN, lone surrogates, nesting
/// beyond `MAX_DEPTH`) takes `json.dumps` itself, so both give the same fingerprint or the same
/// error. The one text serves the fingerprint and the tool's identity fields alike.
pub(crate) enum ArgsText {
    /// Canonical already.
    Canonical(String),
    /// `json.dumps`'s.
    Dumped(String),
}

impl ArgsText {
    /// The text of `args`.
    pub(crate) fn of(args: &Bound<'_, PyAny>) -> PyResult<Self> {
        let mut text = String::with_capacity(128);
        if canonical_json(args, 0, &mut text) {
            return Ok(ArgsText::Canonical(text));
        }
        static DUMPS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
        let py = args.py();
        let dumps = DUMPS.get_or_try_init(py, || {
            py.import("json")?.getattr("dumps").map(Bound::unbind)
        })?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("default", py.import("builtins")?.getattr("repr")?)?;
        let text = dumps.call(py, (args,), Some(&kwargs))?;
        let text = text.bind(py).cast::<PyString>()?.to_str()?.to_owned();
        Ok(ArgsText::Dumped(text))
    }

    /// The text itself.
    pub(crate) fn text(&self) -> &str {
        match self {
            ArgsText::Canonical(t) | ArgsText::Dumped(t) => t,
        }
    }

    /// Its fingerprint, integers kept exact.
    pub(crate) fn fingerprint(&self) -> Result<idemgate::Fingerprint, idemgate::CanonicalError> {
        match self {
            ArgsText::Canonical(t) => Ok(idemgate::Fingerprint::of_canonical_text(t)),
            ArgsText::Dumped(t) => idemgate::Fingerprint::of_json_text(t.as_bytes()),
        }
    }
}

/// Writes the canonical text of a Python value of plain JSON types to `out` (the text
/// `idemgate::canonical::canonicalize` writes for the same JSON value), or returns `false` when
/// it holds anything else, with `out` then of no use (see [`ArgsText`]; exact types only,
/// as `json.dumps` writes subclasses its own way).
fn canonical_json(v: &Bound<'_, PyAny>, depth: usize, out: &mut String) -> bool {
    use idemgate::canonical::pieces;
    if depth > idemgate::canonical::MAX_DEPTH {
        return false;
    }
    if v.is_none() {
        out.push_str("null");
        return true;
    }
    if let Ok(s) = v.cast_exact::<PyString>() {
        let Ok(s) = s.to_str() else { return false };
        pieces::string(s, out);
        return true;
    }
    if let Ok(b) = v.cast_exact::<PyBool>() {
        out.push_str(if b.is_true() { "true" } else { "false" });
        return true;
    }
    if let Ok(i) = v.cast_exact::<PyInt>() {
        match i.extract::<i64>() {
            Ok(i) => pieces::integer(i, out),
            Err(_) => match i.extract::<u64>() {
                Ok(u) => pieces::integer(u, out),
                Err(_) => return false,
            },
        }
        return true;
    }
    if let Ok(f) = v.cast_exact::<PyFloat>() {
        return pieces::double(f.value(), out);
    }
    if let Ok(d) = v.cast_exact::<PyDict>() {
        let mut keys = Vec::with_capacity(d.len());
        for (k, item) in d.iter() {
            let Ok(k) = k.cast_exact::<PyString>() else {
                return false;
            };
            keys.push((k.clone(), item));
        }
        let mut members = Vec::with_capacity(keys.len());
        for (k, item) in &keys {
            let Ok(name) = k.to_str() else { return false };
            members.push((name, item));
        }
        members.sort_by(|a, b| pieces::member_order(a.0, b.0));
        out.push('{');
        for (n, (name, item)) in members.into_iter().enumerate() {
            if n > 0 {
                out.push(',');
            }
            pieces::string(name, out);
            out.push(':');
            if !canonical_json(item, depth + 1, out) {
                return false;
            }
        }
        out.push('}');
        return true;
    }
    let mut array = |items: &mut dyn Iterator<Item = Bound<'_, PyAny>>| {
        out.push('[');
        for (n, item) in items.enumerate() {
            if n > 0 {
                out.push(',');
            }
            if !canonical_json(&item, depth + 1, out) {
                return false;
            }
        }
        out.push(']');
        true
    };
    if let Ok(l) = v.cast_exact::<PyList>() {
        return array(&mut l.iter());
    }
    if let Ok(t) = v.cast_exact::<PyTuple>() {
        return array(&mut t.iter());
    }
    false
}

/// Names a call's action from what its integration knows: `(key, scope, rule, window)` by the
/// one rule of every door (`idemgate_kit::identity`); raises `ValueError` when a key is invalid,
/// or the program's keys differ; a call without a scope is its own invocation
/// (`identify_or_invocation`), never global.
#[pyfunction]
#[pyo3(signature = (*, scope=None, orchestration_key=None, business_key=None, model_key=None, call_id=None))]
pub(crate) fn name_action(
    scope: Option<&str>,
    orchestration_key: Option<&str>,
    business_key: Option<&str>,
    model_key: Option<&str>,
    call_id: Option<&str>,
) -> PyResult<(Option<String>, Option<String>, &'static str, bool)> {
    let i = idemgate_kit::identity::identify_or_invocation(&idemgate_kit::identity::Facts {
        scope,
        orchestration_key,
        business_key,
        model_key,
        call_id,
    })
    .map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok((
        i.key.map(|k| k.as_str().to_owned()),
        i.scope.map(|s| s.to_string()),
        i.rule.as_str(),
        i.window,
    ))
}

/// A scope of its own for one invocation of a tool whose framework names no conversation.
#[pyfunction]
pub(crate) fn invocation_scope() -> String {
    idemgate_kit::identity::Scope::invocation()
}
