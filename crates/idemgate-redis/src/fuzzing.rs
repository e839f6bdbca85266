//! The record decoder on any reply, for the fuzz targets (feature `fuzzing`; not public API): a
//! hash as another program, an older version or a bad script could have left it.

use idemgate_core::transition::StoredRecord;
use idemgate_core::StoreError;
pub use redis::Value;

/// Decodes a flat `HGETALL` reply as the store decodes the records its scripts return.
///
/// # Errors
/// [`StoreError::Corrupt`] for replies no record has; never a panic.
pub fn decode_record(flat: &Value) -> Result<Option<StoredRecord>, StoreError> {
    crate::row::stored_record(flat)
}
