//! The record decoder on any column values, for the fuzz targets (feature `fuzzing`; not public
//! API): a row as another program, an older version or a damaged table could hold it.

use idemgate_core::transition::StoredRecord;
use idemgate_core::{Key, StoreError, Timestamp};

/// The typed columns of a record row (`sql/get.sql`), owned.
#[derive(Clone, Debug, Default)]
#[allow(missing_docs)]
pub struct RowColumns {
    pub fingerprint: Vec<u8>,
    pub fence: i64,
    pub token: Vec<u8>,
    pub created_at: i64,
    pub state: i16,
    pub lease_until: Option<i64>,
    pub since: Option<i64>,
    pub completed_at: Option<i64>,
    pub expires_at: Option<i64>,
    pub retain_until: Option<i64>,
    pub outcome_kind: Option<i16>,
    pub outcome_body: Option<Vec<u8>>,
    pub scope: Option<String>,
    pub now: i64,
}

/// Decodes `cols` as the record `key`, as the store decodes a row it read.
///
/// # Errors
/// [`StoreError::Corrupt`] for values no record has; never a panic.
pub fn decode_columns(key: Key, cols: RowColumns) -> Result<(StoredRecord, Timestamp), StoreError> {
    crate::row::Columns {
        fingerprint: &cols.fingerprint,
        fence: cols.fence,
        token: &cols.token,
        created_at: cols.created_at,
        state: cols.state,
        lease_until: cols.lease_until,
        since: cols.since,
        completed_at: cols.completed_at,
        expires_at: cols.expires_at,
        retain_until: cols.retain_until,
        outcome_kind: cols.outcome_kind,
        outcome_body: cols.outcome_body,
        scope: cols.scope.as_deref(),
        now: cols.now,
    }
    .decode(key)
}
