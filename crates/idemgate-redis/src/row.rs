//! Reading records and script replies out of Redis values.

use std::collections::HashMap;
use std::str::FromStr;

use idemgate_core::transition::StoredRecord;
use idemgate_core::{
    Fence, Fingerprint, IdempotencyKey, Key, LeaseToken, Outcome, OutcomeKind, RecordState,
    StoreError, TenantId, Timestamp, ToolName,
};
use redis::Value;

use crate::error::corrupt;

/// The bytes of a string reply.
pub(crate) fn bytes(v: &Value) -> Result<&[u8], StoreError> {
    match v {
        Value::BulkString(b) => Ok(b),
        Value::SimpleString(s) => Ok(s.as_bytes()),
        other => Err(corrupt(format_args!(
            "expected a string from redis, got {other:?}"
        ))),
    }
}

/// A string reply as text.
pub(crate) fn text(v: &Value) -> Result<&str, StoreError> {
    std::str::from_utf8(bytes(v)?).map_err(|_| corrupt("expected utf-8 text from redis"))
}

/// A number, sent as an integer or as decimal text.
pub(crate) fn number<T: FromStr + TryFrom<i64>>(v: &Value) -> Result<T, StoreError> {
    match v {
        Value::Int(i) => {
            T::try_from(*i).map_err(|_| corrupt(format_args!("number {i} out of range")))
        }
        other => {
            let s = text(other)?;
            s.parse()
                .map_err(|_| corrupt(format_args!("expected a number from redis, got {s:?}")))
        }
    }
}

/// The items of an array reply.
pub(crate) fn array(v: &Value) -> Result<&[Value], StoreError> {
    match v {
        Value::Array(items) => Ok(items),
        Value::Nil => Ok(&[]),
        other => Err(corrupt(format_args!(
            "expected an array from redis, got {other:?}"
        ))),
    }
}

/// A record from a plain `HGETALL` reply: a flat array (RESP2) or a map (RESP3); `None` when
/// the hash is empty (absent).
pub(crate) fn hash_record(reply: &Value) -> Result<Option<StoredRecord>, StoreError> {
    match reply {
        Value::Map(pairs) => {
            let flat = pairs
                .iter()
                .flat_map(|(k, v)| [k.clone(), v.clone()])
                .collect();
            stored_record(&Value::Array(flat))
        }
        flat => stored_record(flat),
    }
}

/// A record from its flat `HGETALL` reply; `None` when the hash is empty (absent).
pub(crate) fn stored_record(flat: &Value) -> Result<Option<StoredRecord>, StoreError> {
    let items = array(flat)?;
    if items.is_empty() {
        return Ok(None);
    }
    let mut fields: HashMap<&[u8], &Value> = HashMap::with_capacity(items.len() / 2);
    for pair in items.chunks(2) {
        let [name, value] = pair else {
            return Err(corrupt("record hash has an odd number of items"));
        };
        fields.insert(bytes(name)?, value);
    }
    let field = |name: &str| {
        fields
            .get(name.as_bytes())
            .copied()
            .ok_or_else(|| corrupt(format_args!("record has no field {name:?}")))
    };
    let time = |name: &str| -> Result<Timestamp, StoreError> {
        Ok(Timestamp::from_millis(number::<i64>(field(name)?)?))
    };
    let bad = |what: &str, e: &dyn std::fmt::Display| corrupt(format_args!("record {what}: {e}"));
    let key = Key::new(
        TenantId::new(text(field("tenant")?)?).map_err(|e| bad("tenant", &e))?,
        ToolName::new(text(field("tool")?)?).map_err(|e| bad("tool", &e))?,
        IdempotencyKey::new(text(field("key")?)?).map_err(|e| bad("key", &e))?,
    );
    let fingerprint = Fingerprint::from_str(text(field("fp")?)?).map_err(|e| bad("fp", &e))?;
    let fence: Fence = number(field("fence")?)?;
    let token = LeaseToken::from_str(text(field("token")?)?).map_err(|e| bad("token", &e))?;
    let created_at = time("created")?;
    let scope = match fields.get(b"scope".as_slice()) {
        Some(v) => Some(text(v)?.into()),
        None => None,
    };
    let state = match text(field("state")?)? {
        "i" => RecordState::InFlight {
            lease_until: time("lease_until")?,
        },
        "u" => RecordState::Unknown {
            since: time("since")?,
        },
        "c" => {
            let expires_at = time("expires_at")?;
            RecordState::Completed {
                outcome: Outcome {
                    kind: OutcomeKind::from_str(text(field("kind")?)?)
                        .map_err(|e| bad("kind", &e))?,
                    // Purging drops the body of a tombstone, whose outcome is no longer given.
                    body: match fields.get(b"body".as_slice()) {
                        Some(v) => bytes(v)?.to_vec(),
                        None => Vec::new(),
                    },
                },
                completed_at: time("completed_at")?,
                expires_at,
                // A record written before tombstones kept none: it went at its expiry.
                retain_until: match fields.get(b"retain_until".as_slice()) {
                    Some(_) => time("retain_until")?,
                    None => expires_at,
                },
            }
        }
        other => return Err(corrupt(format_args!("record state {other:?} is unknown"))),
    };
    Ok(Some(StoredRecord {
        key,
        fingerprint,
        fence,
        token,
        created_at,
        scope,
        state,
    }))
}
