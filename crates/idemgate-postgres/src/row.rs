//! Rows of `idemgate_records` to and from records: the codes of its columns, the statement
//! parameters of leases, states and outcomes, and the decoding of a record row (the columns of
//! `sql/get.sql`). A row this version cannot read is [`StoreError::Corrupt`], never a panic.

use idemgate_core::store::Result;
use idemgate_core::transition::StoredRecord;
use idemgate_core::{
    Fence, Fingerprint, IdempotencyKey, Key, Lease, LeaseToken, Outcome, OutcomeKind, RecordState,
    StoreError, TenantId, Timestamp, ToolName,
};
use tokio_postgres::types::FromSql;
use tokio_postgres::Row;

use crate::error;

/// The `state` column of an in-flight record (the statements in `sql/` spell these out).
const IN_FLIGHT: i16 = 0;
/// The `state` column of a completed record.
const COMPLETED: i16 = 1;
/// The `state` column of an unknown record.
const UNKNOWN: i16 = 2;

/// The `outcome_kind` column of a success.
const SUCCESS: i16 = 0;
/// The `outcome_kind` column of a failure.
const FAILED: i16 = 1;

/// The `token` column of a lease token.
pub(crate) fn token_bytes(t: LeaseToken) -> [u8; 16] {
    t.0.to_be_bytes()
}

/// The `fence` column of a fence; one beyond `bigint` matches no row, so its lease is lost.
pub(crate) fn fence_param(f: Fence) -> Result<i64> {
    i64::try_from(f).map_err(|_| StoreError::LeaseLost)
}

/// The `outcome_kind` column of an outcome.
pub(crate) fn outcome_kind_code(kind: OutcomeKind) -> i16 {
    match kind {
        OutcomeKind::Success => SUCCESS,
        OutcomeKind::Failed => FAILED,
    }
}

/// The lease a stored record is held under.
pub(crate) fn lease_of(rec: &StoredRecord) -> Lease {
    Lease {
        fence: rec.fence,
        token: rec.token,
    }
}

/// Column `col` of `row`, or [`StoreError::Corrupt`] when it is missing or of another type.
pub(crate) fn get<'a, T: FromSql<'a>>(row: &'a Row, col: &str) -> Result<T> {
    row.try_get(col).map_err(|e| error::corrupt_column(col, e))
}

/// The record name of a `list.sql` row (its `tenant`, `tool` and `key` columns).
pub(crate) fn key_of(row: &Row) -> Result<Key> {
    let name = |col: &str| -> Result<String> { get::<String>(row, col) };
    Ok(Key::new(
        TenantId::new(name("tenant")?).map_err(error::corrupt)?,
        ToolName::new(name("tool")?).map_err(error::corrupt)?,
        IdempotencyKey::new(name("key")?).map_err(error::corrupt)?,
    ))
}

/// Decodes a record row (the columns of `sql/get.sql`) and the server clock it came with.
pub(crate) fn decode(key: Key, row: &Row) -> Result<(StoredRecord, Timestamp)> {
    Columns::read(row)?.decode(key)
}

/// The columns of a record row as Postgres typed them, not yet checked against each other.
#[derive(Clone, Debug, Default)]
pub(crate) struct Columns<'a> {
    pub(crate) fingerprint: &'a [u8],
    pub(crate) fence: i64,
    pub(crate) token: &'a [u8],
    pub(crate) created_at: i64,
    pub(crate) state: i16,
    pub(crate) lease_until: Option<i64>,
    pub(crate) since: Option<i64>,
    pub(crate) completed_at: Option<i64>,
    pub(crate) expires_at: Option<i64>,
    pub(crate) retain_until: Option<i64>,
    pub(crate) outcome_kind: Option<i16>,
    pub(crate) outcome_body: Option<Vec<u8>>,
    pub(crate) scope: Option<&'a str>,
    pub(crate) now: i64,
}

impl<'a> Columns<'a> {
    fn read(row: &'a Row) -> Result<Self> {
        Ok(Columns {
            fingerprint: get(row, "fingerprint")?,
            fence: get(row, "fence")?,
            token: get(row, "token")?,
            created_at: get(row, "created_at")?,
            state: get(row, "state")?,
            lease_until: get(row, "lease_until")?,
            since: get(row, "since")?,
            completed_at: get(row, "completed_at")?,
            expires_at: get(row, "expires_at")?,
            retain_until: get(row, "retain_until")?,
            outcome_kind: get(row, "outcome_kind")?,
            outcome_body: get(row, "outcome_body")?,
            scope: get(row, "scope")?,
            now: get(row, "now")?,
        })
    }

    pub(crate) fn decode(self, key: Key) -> Result<(StoredRecord, Timestamp)> {
        let fingerprint = <[u8; 32]>::try_from(self.fingerprint)
            .map_err(|_| error::corrupt("fingerprint is not 32 bytes"))?;
        let token = <[u8; 16]>::try_from(self.token)
            .map_err(|_| error::corrupt("token is not 16 bytes"))?;
        let fence = Fence::try_from(self.fence).map_err(|_| error::corrupt("negative fence"))?;
        let state = match self.state {
            IN_FLIGHT => RecordState::InFlight {
                lease_until: time(self.lease_until, "lease_until")?,
            },
            COMPLETED => {
                let kind = match need(self.outcome_kind, "outcome_kind")? {
                    SUCCESS => OutcomeKind::Success,
                    FAILED => OutcomeKind::Failed,
                    k => return Err(error::corrupt(format_args!("unknown outcome kind {k}"))),
                };
                let expires_at = time(self.expires_at, "expires_at")?;
                RecordState::Completed {
                    outcome: Outcome {
                        kind,
                        body: need(self.outcome_body, "outcome_body")?,
                    },
                    completed_at: time(self.completed_at, "completed_at")?,
                    expires_at,
                    // NULL for a row completed before migration 6: no tombstone. Taken as
                    // stored otherwise: `StoredRecord::view` counts the record while either time
                    // lies ahead, as the statements' GREATEST(expires_at, retain_until) does.
                    retain_until: self.retain_until.map_or(expires_at, Timestamp::from_millis),
                }
            }
            UNKNOWN => RecordState::Unknown {
                since: time(self.since, "since")?,
            },
            s => return Err(error::corrupt(format_args!("unknown state {s}"))),
        };
        let rec = StoredRecord {
            key,
            fingerprint: Fingerprint::from_bytes(fingerprint),
            fence,
            token: LeaseToken(u128::from_be_bytes(token)),
            created_at: Timestamp::from_millis(self.created_at),
            scope: self.scope.map(Into::into),
            state,
        };
        Ok((rec, Timestamp::from_millis(self.now)))
    }
}

/// A column the row's state requires.
fn need<T>(v: Option<T>, col: &str) -> Result<T> {
    v.ok_or_else(|| error::corrupt(format_args!("column {col} is NULL for its state")))
}

/// A time column the row's state requires.
fn time(v: Option<i64>, col: &str) -> Result<Timestamp> {
    need(v, col).map(Timestamp::from_millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Key {
        Key::new(
            TenantId::new("acme").unwrap(),
            ToolName::new("send_invoice").unwrap(),
            IdempotencyKey::new("k").unwrap(),
        )
    }

    const FINGERPRINT: [u8; 32] = [7; 32];
    const TOKEN: [u8; 16] = [9; 16];

    /// A well-formed completed row.
    fn completed() -> Columns<'static> {
        Columns {
            fingerprint: &FINGERPRINT,
            fence: 3,
            token: &TOKEN,
            created_at: 1_000,
            state: COMPLETED,
            completed_at: Some(2_000),
            expires_at: Some(3_000),
            outcome_kind: Some(outcome_kind_code(OutcomeKind::Failed)),
            outcome_body: Some(b"declined".to_vec()),
            now: 2_500,
            ..Columns::default()
        }
    }

    fn corrupt_because(cols: Columns<'_>) -> String {
        match cols.decode(key()) {
            Err(StoreError::Corrupt(m)) => m.to_string(),
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }

    #[test]
    fn well_formed_rows_decode() {
        let (rec, now) = completed().decode(key()).unwrap();
        assert_eq!(now, Timestamp::from_millis(2_500));
        assert_eq!(lease_of(&rec).fence, 3);
        assert_eq!(token_bytes(lease_of(&rec).token), TOKEN);
        assert_eq!(rec.fingerprint, Fingerprint::from_bytes(FINGERPRINT));
        assert!(matches!(
            rec.state,
            RecordState::Completed { ref outcome, .. }
                if outcome.kind == OutcomeKind::Failed && outcome.body == b"declined"
        ));
        // A row completed before migration 6 keeps no tombstone; a later one keeps its own.
        assert!(matches!(
            rec.state,
            RecordState::Completed { expires_at, retain_until, .. }
                if expires_at == Timestamp::from_millis(3_000) && retain_until == expires_at
        ));
        let tombstone = Columns {
            retain_until: Some(9_000),
            ..completed()
        };
        let (rec, _) = tombstone.decode(key()).unwrap();
        assert!(matches!(
            rec.state,
            RecordState::Completed { retain_until, .. }
                if retain_until == Timestamp::from_millis(9_000)
        ));
        let in_flight = Columns {
            state: IN_FLIGHT,
            lease_until: Some(5_000),
            ..completed()
        };
        let (rec, _) = in_flight.decode(key()).unwrap();
        assert_eq!(
            rec.state,
            RecordState::InFlight {
                lease_until: Timestamp::from_millis(5_000)
            }
        );
        let unknown = Columns {
            state: UNKNOWN,
            since: Some(4_000),
            ..completed()
        };
        let (rec, _) = unknown.decode(key()).unwrap();
        assert_eq!(
            rec.state,
            RecordState::Unknown {
                since: Timestamp::from_millis(4_000)
            }
        );
    }

    #[test]
    fn corrupt_rows_are_corrupt_not_panics() {
        let short = [0u8; 31];
        let cases = [
            (
                Columns {
                    fingerprint: &short,
                    ..completed()
                },
                "fingerprint is not 32 bytes",
            ),
            (
                Columns {
                    token: &short,
                    ..completed()
                },
                "token is not 16 bytes",
            ),
            (
                Columns {
                    fence: -1,
                    ..completed()
                },
                "negative fence",
            ),
            (
                Columns {
                    state: 7,
                    ..completed()
                },
                "unknown state 7",
            ),
            // The code the listing once asked tombstones by is never a stored state.
            (
                Columns {
                    state: 3,
                    ..completed()
                },
                "unknown state 3",
            ),
            (
                Columns {
                    outcome_kind: Some(5),
                    ..completed()
                },
                "unknown outcome kind 5",
            ),
            (
                Columns {
                    outcome_kind: None,
                    ..completed()
                },
                "column outcome_kind is NULL",
            ),
            (
                Columns {
                    outcome_body: None,
                    ..completed()
                },
                "column outcome_body is NULL",
            ),
            (
                Columns {
                    expires_at: None,
                    ..completed()
                },
                "column expires_at is NULL",
            ),
            (
                Columns {
                    state: IN_FLIGHT,
                    ..completed()
                },
                "column lease_until is NULL",
            ),
            (
                Columns {
                    state: UNKNOWN,
                    ..completed()
                },
                "column since is NULL",
            ),
        ];
        for (cols, why) in cases {
            let m = corrupt_because(cols);
            assert!(m.starts_with("failed to read a record row"), "{m}");
            assert!(m.contains(why), "{why}: {m}");
        }
    }

    #[test]
    fn parameters_encode_what_rows_decode() {
        for kind in [OutcomeKind::Success, OutcomeKind::Failed] {
            let cols = Columns {
                outcome_kind: Some(outcome_kind_code(kind)),
                ..completed()
            };
            let (rec, _) = cols.decode(key()).unwrap();
            assert!(
                matches!(rec.state, RecordState::Completed { outcome, .. } if outcome.kind == kind)
            );
        }
        let token = LeaseToken(0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10);
        let cols = Columns {
            token: &token_bytes(token),
            ..completed()
        };
        assert_eq!(cols.decode(key()).unwrap().0.token, token);
        assert_eq!(fence_param(7).unwrap(), 7);
        assert!(matches!(fence_param(u64::MAX), Err(StoreError::LeaseLost)));
    }
}
