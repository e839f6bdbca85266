//! The record decoder on any column values, for the fuzz targets (feature `fuzzing`; not public
//! API): a row as another program, an older version or a damaged file could hold it.

use idemgate_core::transition::StoredRecord;
use idemgate_core::{Now, StoreError};
use rusqlite::types::Value;
use rusqlite::Connection;

/// How many columns a record row has (`row::columns!()`).
pub const COLUMNS: usize = 18;

/// Decodes a row whose columns hold `values`, as the store decodes what it reads at `now`.
///
/// # Errors
/// [`StoreError::Corrupt`] (or another class) for values no record has; never a panic.
///
/// # Panics
/// When SQLite cannot run a constant `SELECT` in memory.
pub fn decode_row(values: [Value; COLUMNS], now: Now) -> Result<StoredRecord, StoreError> {
    thread_local! {
        static CONN: Connection = Connection::open_in_memory().expect("an in-memory database");
    }
    CONN.with(|conn| {
        let mut stmt = conn
            .prepare_cached(
                "SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, \
                 ?18",
            )
            .expect("a constant select");
        let mut rows = stmt
            .query(rusqlite::params_from_iter(values))
            .expect("bound values");
        let row = rows.next().expect("one row").expect("one row");
        crate::row::decode(row, now)
    })
}
