//! Where a deployment's seal comes from: the environment, or files it names.

use crate::seal::{Keyring, NameSecret, Seal, SealError};

/// The keyring itself (`ID:BASE64KEY` entries, see [`Keyring::parse`]).
pub const KEYS_VAR: &str = "IDEMGATE_SEAL_KEYS";
/// A file holding the keyring.
pub const KEYS_FILE_VAR: &str = "IDEMGATE_SEAL_KEYS_FILE";
/// The secret that names records (base64, see [`NameSecret::parse`]).
pub const SECRET_VAR: &str = "IDEMGATE_KEY_SECRET";
/// A file holding the secret.
pub const SECRET_FILE_VAR: &str = "IDEMGATE_KEY_SECRET_FILE";

/// The seal the environment configures: `None` when none of the four variables is set (records
/// are stored as before, in clear).
///
/// # Errors
/// [`SealError::Config`] when only the keyring or only the secret is given, when a value and its
/// file are both given, when a file cannot be read, or when either is malformed.
pub fn from_env() -> Result<Option<Seal>, SealError> {
    from_vars(|name| std::env::var(name).ok())
}

/// As [`from_env`], reading each variable through `var` (an unset or empty variable is `None`).
///
/// # Errors
/// As [`from_env`].
pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Seal>, SealError> {
    let var = |name: &str| var(name).filter(|v| !v.trim().is_empty());
    let keys = value_or_file(&var, KEYS_VAR, KEYS_FILE_VAR)?;
    let secret = value_or_file(&var, SECRET_VAR, SECRET_FILE_VAR)?;
    match (keys, secret) {
        (None, None) => Ok(None),
        (Some((keys, from)), Some((secret, secret_from))) => {
            let keyring = Keyring::parse(&keys)
                .map_err(|e| SealError::Config(format!("failed to read the keyring in {from}: {e}")))?;
            let names = NameSecret::parse(&secret).map_err(|e| {
                SealError::Config(format!("failed to read the key secret in {secret_from}: {e}"))
            })?;
            Ok(Some(Seal::new(keyring, names)))
        }
        (Some(_), None) => Err(SealError::Config(format!(
            "{KEYS_VAR} (or {KEYS_FILE_VAR}) is set but {SECRET_VAR} (or {SECRET_FILE_VAR}) is not: \
             sealing needs both, the keyring for outcomes and the secret for keys"
        ))),
        (None, Some(_)) => Err(SealError::Config(format!(
            "{SECRET_VAR} (or {SECRET_FILE_VAR}) is set but {KEYS_VAR} (or {KEYS_FILE_VAR}) is not: \
             sealing needs both, the keyring for outcomes and the secret for keys"
        ))),
    }
}

/// The value of `value_var`, or the contents of the file `file_var` names, with where it came
/// from (for messages: the variable's or the file's name, never the value).
fn value_or_file(
    var: &impl Fn(&str) -> Option<String>,
    value_var: &str,
    file_var: &str,
) -> Result<Option<(String, String)>, SealError> {
    match (var(value_var), var(file_var)) {
        (Some(_), Some(_)) => Err(SealError::Config(format!(
            "both {value_var} and {file_var} are set; set one"
        ))),
        (Some(v), None) => Ok(Some((v, value_var.to_owned()))),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(&path).map_err(|e| {
                SealError::Config(format!("failed to read {path} (named by {file_var}): {e}"))
            })?;
            Ok(Some((text, path)))
        }
        (None, None) => Ok(None),
    }
}
