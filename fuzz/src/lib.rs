//! The bodies of the fuzz targets, one function per target, so that `cargo fuzz` (the binaries in
//! `fuzz_targets/`) and the corpus replay in `tests/corpus.rs` run the same code.
//!
//! Every function takes any bytes. It may return early on input it cannot use, but it must never
//! panic: a panic is a bug in the code under test (or a property below that does not hold).

use arbitrary::{Arbitrary, Unstructured};
use idemgate_core::canonical::canonicalize_text;
use idemgate_core::transition::StoredRecord;
use idemgate_core::{Fingerprint, IdempotencyKey, Key, TenantId, Timestamp, ToolName};

/// Record names: each parser accepts exactly the text it keeps, and what it accepts it accepts
/// again.
pub fn key_parser(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let tenant = TenantId::new(text);
    let tool = ToolName::new(text);
    let key = IdempotencyKey::new(text);
    if let Ok(t) = &tenant {
        assert_eq!(t.as_str(), text);
        assert_eq!(TenantId::new(t.as_str()).as_ref(), Ok(t));
    }
    if let Ok(t) = &tool {
        assert_eq!(t.as_str(), text);
        assert_eq!(ToolName::new(t.as_str()).as_ref(), Ok(t));
    }
    if let Ok(k) = &key {
        assert_eq!(k.as_str(), text);
        assert_eq!(IdempotencyKey::new(k.as_str()).as_ref(), Ok(k));
    }
    // A caller's key is a key that is also not in the engine's reserved space.
    if let Ok(k) = IdempotencyKey::explicit(text) {
        assert_eq!(key.as_ref(), Ok(&k));
    }
    if let (Ok(t), Ok(n), Ok(k)) = (tenant, tool, key) {
        let _ = Key::new(t, n, k).digest();
    }
}

/// Canonical JSON: canonicalizing is idempotent, and the fingerprint of a text is the fingerprint
/// of its canonical form.
pub fn canonical_json(data: &[u8]) {
    let Ok(fingerprint) = Fingerprint::of_json_text(data) else {
        assert!(canonicalize_text(data).is_err());
        return;
    };
    let canonical = canonicalize_text(data).expect("a text with a fingerprint canonicalizes");
    assert_eq!(
        canonicalize_text(canonical.as_bytes()).as_deref(),
        Ok(canonical.as_str()),
        "canonical form is not stable"
    );
    assert_eq!(
        Fingerprint::of_json_text(canonical.as_bytes()).ok(),
        Some(fingerprint),
        "canonical form has another fingerprint"
    );
}

/// A stored record, once decoded, can be viewed at any time.
fn view_any(rec: &StoredRecord, u: &mut Unstructured<'_>) {
    let now = Timestamp::from_millis(i64::arbitrary(u).unwrap_or(0));
    let _ = rec.view(now);
    let _ = rec.view(rec.created_at);
}

/// The SQLite row decoder on any column values (of any SQLite type).
pub fn sqlite_row(data: &[u8]) {
    use idemgate_sqlite::fuzzing::{decode_row, COLUMNS};
    use idemgate_sqlite::rusqlite::types::Value;
    let mut u = Unstructured::new(data);
    let value = |u: &mut Unstructured<'_>| -> Value {
        match u8::arbitrary(u).unwrap_or(0) % 5 {
            0 => Value::Null,
            1 => Value::Integer(i64::arbitrary(u).unwrap_or(0)),
            2 => Value::Real(f64::arbitrary(u).unwrap_or(0.0)),
            3 => Value::Text(String::arbitrary(u).unwrap_or_default()),
            _ => Value::Blob(Vec::arbitrary(u).unwrap_or_default()),
        }
    };
    let values: [Value; COLUMNS] = std::array::from_fn(|_| value(&mut u));
    // A boot clock on boot 0, which a row's 16 zero bytes of `lease_boot` name.
    let now = idemgate_core::Now {
        wall: Timestamp::from_millis(i64::arbitrary(&mut u).unwrap_or(0)),
        steady: Some(idemgate_core::HostInstant {
            boot: 0,
            millis: i64::arbitrary(&mut u).unwrap_or(0),
        }),
    };
    if let Ok(rec) = decode_row(values, now) {
        view_any(&rec, &mut u);
    }
}

/// The Postgres row decoder on any typed column values.
pub fn postgres_row(data: &[u8]) {
    use idemgate_postgres::fuzzing::{decode_columns, RowColumns};
    let mut u = Unstructured::new(data);
    let cols = (|| -> arbitrary::Result<RowColumns> {
        Ok(RowColumns {
            fingerprint: Arbitrary::arbitrary(&mut u)?,
            fence: Arbitrary::arbitrary(&mut u)?,
            token: Arbitrary::arbitrary(&mut u)?,
            created_at: Arbitrary::arbitrary(&mut u)?,
            // Mostly the codes that exist, so the fuzzer gets past the first check.
            state: i16::from(u8::arbitrary(&mut u)? % 4),
            lease_until: Arbitrary::arbitrary(&mut u)?,
            since: Arbitrary::arbitrary(&mut u)?,
            completed_at: Arbitrary::arbitrary(&mut u)?,
            expires_at: Arbitrary::arbitrary(&mut u)?,
            retain_until: Arbitrary::arbitrary(&mut u)?,
            outcome_kind: Option::<u8>::arbitrary(&mut u)?.map(|k| i16::from(k % 3)),
            outcome_body: Arbitrary::arbitrary(&mut u)?,
            scope: Arbitrary::arbitrary(&mut u)?,
            now: Arbitrary::arbitrary(&mut u)?,
        })
    })();
    let Ok(cols) = cols else {
        return;
    };
    let key = Key::new(
        TenantId::new("t").expect("a valid tenant"),
        ToolName::new("x").expect("a valid tool"),
        IdempotencyKey::new("k").expect("a valid key"),
    );
    if let Ok((rec, _now)) = decode_columns(key, cols) {
        view_any(&rec, &mut u);
    }
}

/// The field names of a record hash in Redis (`src/*.lua`).
const REDIS_FIELDS: &[&str] = &[
    "tenant",
    "tool",
    "key",
    "fp",
    "fence",
    "token",
    "created",
    "state",
    "lease_until",
    "since",
    "kind",
    "body",
    "completed_at",
    "expires_at",
    "retain_until",
    "scope",
];

/// The Redis record decoder on any reply: mostly hashes of the record's field names with any
/// values, sometimes anything at all.
pub fn redis_record(data: &[u8]) {
    use idemgate_redis::fuzzing::{decode_record, Value};
    fn value(u: &mut Unstructured<'_>, depth: u32) -> arbitrary::Result<Value> {
        Ok(match u8::arbitrary(u)? % 8 {
            0 => Value::Nil,
            1 => Value::Int(i64::arbitrary(u)?),
            2 => Value::SimpleString(String::arbitrary(u)?),
            3 => Value::Okay,
            4 if depth < 3 => {
                let n = u.int_in_range(0..=4)?;
                Value::Array(
                    (0..n)
                        .map(|_| value(u, depth + 1))
                        .collect::<Result<_, _>>()?,
                )
            }
            // Numbers and names as text, as Redis returns hash values.
            5 => Value::BulkString(i64::arbitrary(u)?.to_string().into_bytes()),
            6 => Value::BulkString(u.choose(REDIS_FIELDS)?.as_bytes().to_vec()),
            _ => Value::BulkString(Vec::arbitrary(u)?),
        })
    }
    let mut u = Unstructured::new(data);
    let reply = (|| -> arbitrary::Result<Value> {
        if u8::arbitrary(&mut u)? % 8 == 0 {
            return value(&mut u, 0);
        }
        let mut items = Vec::new();
        for name in REDIS_FIELDS {
            // Each field present (usually), missing, or present twice.
            match u8::arbitrary(&mut u)? % 6 {
                0 => continue,
                1 => {
                    items.push(Value::BulkString(name.as_bytes().to_vec()));
                    items.push(value(&mut u, 1)?);
                }
                _ => {}
            }
            items.push(Value::BulkString(name.as_bytes().to_vec()));
            items.push(value(&mut u, 1)?);
        }
        if bool::arbitrary(&mut u)? {
            items.push(value(&mut u, 1)?);
        }
        Ok(Value::Array(items))
    })();
    if let Ok(reply) = reply {
        if let Ok(Some(rec)) = decode_record(&reply) {
            view_any(&rec, &mut u);
        }
    }
}

/// The stored-outcome format: whatever decodes can be shown by every front door, and encodes to
/// a text that decodes to the same encoding.
pub fn payload(data: &[u8]) {
    use idemgate_core::OutcomeKind;
    use idemgate_kit::Payload;
    let Ok(p) = Payload::decode(data) else {
        return;
    };
    let encoded = p.encode();
    let again = Payload::decode(&encoded).expect("an encoded payload decodes");
    assert_eq!(again.encode(), encoded, "encoding is not stable");
    assert_eq!(again.content(), p.content());
    let _ = p.to_json();
    for kind in [OutcomeKind::Success, OutcomeKind::Failed] {
        let _ = p.to_command(kind);
        let _ = p.clone().into_http(kind);
    }
}

/// The `Idempotency-Key` header: what it accepts is the header's text, bare or in one pair of
/// quotes, and a valid caller's key.
pub fn http_key_header(data: &[u8]) {
    let Ok(key) = idemgate_kit::header::idempotency_key(data) else {
        return;
    };
    let k = key.as_str().as_bytes();
    let quoted = [b"\"".as_slice(), k, b"\""].concat();
    assert!(
        data == k || data == quoted.as_slice(),
        "{data:?} gave {k:?}"
    );
    assert_eq!(IdempotencyKey::explicit(key.as_str()).as_ref(), Ok(&key));
}

/// Sealed outcomes (`idemgate-seal`): opening any bytes never panics, whatever is sealed opens
/// again as it was for its own record and fence, and never for another fence.
pub fn sealed_outcome(data: &[u8]) {
    static SEAL: std::sync::OnceLock<idemgate_seal::Seal> = std::sync::OnceLock::new();
    let seal = SEAL.get_or_init(|| idemgate_seal::testing::seal(&["k1", "k2"]));
    let key = Key::new(
        TenantId::new("t").expect("a tenant"),
        ToolName::new("x").expect("a tool"),
        IdempotencyKey::new("k").expect("a key"),
    );
    let _ = seal.open_outcome(&key, 1, data);
    let sealed = seal.seal_outcome(&key, 1, data);
    assert_eq!(seal.open_outcome(&key, 1, &sealed).as_deref(), Ok(data));
    assert!(seal.open_outcome(&key, 2, &sealed).is_err());
}
