//! x402's payment identifier (the `payment-identifier` extension,
//! `specs/extensions/payment_identifier.md`), read the same way by every door that takes x402
//! payments: the gateway's `x402` profile (from the `PAYMENT-SIGNATURE` header) and the MCP
//! proxy's (from `_meta["x402/payment"]`).

use idemgate_core::IdempotencyKey;
use serde_json::Value;

/// Where the identifier lives in a `PaymentPayload`.
pub const IDENTIFIER_PATH: &str = "extensions[\"payment-identifier\"].info.id";

/// The identifier's length bounds (the extension's "Length: 16-128 characters").
const LEN: std::ops::RangeInclusive<usize> = 16..=128;

/// The identifier of a `PaymentPayload`, if it has one (absent or `null`: none); why not when
/// it is not one: a string of 16 to 128 letters, digits, `-` and `_`.
///
/// # Errors
/// The reason, in words for the caller.
pub fn payment_identifier(payment: &Value) -> Result<Option<IdempotencyKey>, String> {
    let id = payment
        .get("extensions")
        .and_then(|e| e.get("payment-identifier"))
        .and_then(|e| e.get("info"))
        .and_then(|i| i.get("id"));
    let invalid = || {
        "Invalid payment ID format. ID must be 16-128 characters and contain only alphanumeric characters, hyphens, and underscores.".to_owned()
    };
    let id = match id {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(id)) => id,
        Some(_) => return Err(invalid()),
    };
    let well_formed = LEN.contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !well_formed {
        return Err(invalid());
    }
    IdempotencyKey::explicit(id.clone())
        .map(Some)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn with(id: Value) -> Value {
        json!({"extensions": {"payment-identifier": {"info": {"required": true, "id": id}}}})
    }

    #[test]
    fn reads_the_identifier_in_the_extensions_form_only() {
        assert_eq!(
            payment_identifier(&with(json!("pay_7d5d747be160e280504c099d984bcfe0")))
                .unwrap()
                .unwrap()
                .as_str(),
            "pay_7d5d747be160e280504c099d984bcfe0"
        );
        assert_eq!(payment_identifier(&json!({"x402Version": 2})), Ok(None));
        assert_eq!(payment_identifier(&with(Value::Null)), Ok(None));
        for bad in [
            json!("pay_1"),
            json!("x".repeat(129)),
            json!("pay_0123456789 abcdef"),
            json!("pay_0123456789/abcdef"),
            json!(12345678901234567u64),
        ] {
            assert!(payment_identifier(&with(bad.clone())).is_err(), "{bad}");
        }
        assert!(payment_identifier(&with(json!("a".repeat(16)))).is_ok());
        assert!(payment_identifier(&with(json!("a".repeat(128)))).is_ok());
    }
}
