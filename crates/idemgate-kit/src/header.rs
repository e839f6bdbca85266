//! The `Idempotency-Key` header as front doors read it: one pure function, so that the HTTP
//! gateway and any other door agree on it, and so that it can be fuzzed on its own.

use idemgate_core::IdempotencyKey;

/// The caller's key from the raw bytes of an `Idempotency-Key` header value.
///
/// The value must be visible ASCII (what HTTP allows as header text: `!` to `~`, space and tab);
/// the IETF draft writes keys as structured-field strings (`"..."`), so one pair of surrounding
/// quotes is taken off. The key is then checked as a caller's key
/// ([`IdempotencyKey::explicit`]): it may not pass for one the engine derives.
///
/// # Errors
/// A message for the caller (a 400 in HTTP terms).
pub fn idempotency_key(value: &[u8]) -> Result<IdempotencyKey, String> {
    let text = value
        .iter()
        .all(|&b| b == b'\t' || (b' '..=b'~').contains(&b))
        .then(|| std::str::from_utf8(value).ok())
        .flatten()
        .ok_or_else(|| "the Idempotency-Key header must be visible ASCII".to_owned())?;
    let text = text
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(text);
    IdempotencyKey::explicit(text).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_read_bare_or_quoted_and_checked() {
        assert_eq!(idempotency_key(b"k-1").unwrap().as_str(), "k-1");
        assert_eq!(idempotency_key(b"\"k-1\"").unwrap().as_str(), "k-1");
        assert!(idempotency_key("k\u{e9}".as_bytes())
            .unwrap_err()
            .contains("visible ASCII"));
        assert!(idempotency_key(b"a b").is_err());
        // A lone quote is no quoted string: it is the key itself.
        assert_eq!(idempotency_key(b"\"").unwrap().as_str(), "\"");
        assert!(idempotency_key(b"\"\"").is_err());
        assert!(idempotency_key(b"").is_err());
    }
}
