//! Versioned schema migrations, applied at connect under an advisory lock.

use deadpool_postgres::Client;
use idemgate_core::{Cause, StoreError};

use crate::error;

/// The migrations, oldest first: version, name, SQL with `{schema}` standing for the schema.
pub(crate) const MIGRATIONS: &[(i32, &str, &str)] = &[
    (1, "init", include_str!("migrations/0001_init.sql")),
    (2, "waiters", include_str!("migrations/0002_waiters.sql")),
    (
        3,
        "hot_completions",
        include_str!("migrations/0003_hot_completions.sql"),
    ),
    (
        4,
        "lean_reservations",
        include_str!("migrations/0004_lean_reservations.sql"),
    ),
    (5, "scope", include_str!("migrations/0005_scope.sql")),
    (
        6,
        "tombstones",
        include_str!("migrations/0006_tombstones.sql"),
    ),
    (
        7,
        "operator_indexes",
        include_str!("migrations/0007_operator_indexes.sql"),
    ),
    (8, "history", include_str!("migrations/0008_history.sql")),
];

/// The schema version this code writes and reads.
pub const SCHEMA_VERSION: i32 = 8;

/// First half of the advisory lock key ("idem"); the second is a hash of the schema name.
const LOCK_CLASS: i32 = 0x6964_656d;

/// Brings `schema` up to [`SCHEMA_VERSION`] in one transaction, holding an advisory lock so that
/// gateways starting together migrate once. Returns the version found before.
///
/// # Errors
/// [`StoreError::Misconfigured`] when the schema is newer than this code or cannot be created.
pub(crate) async fn migrate(client: &mut Client, schema: &str) -> Result<i32, StoreError> {
    let ident = quote_ident(schema);
    let tx = client.transaction().await.map_err(error::before_send)?;
    tx.execute(
        "SELECT pg_advisory_xact_lock($1, hashtext($2))",
        &[&LOCK_CLASS, &schema],
    )
    .await
    .map_err(|e| misconfigured("lock the schema for migration", e))?;
    tx.batch_execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS {ident};
         CREATE TABLE IF NOT EXISTS {ident}.idemgate_schema_version (
             version    integer     PRIMARY KEY,
             name       text        NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         );"
    ))
    .await
    .map_err(|e| misconfigured("create the schema", e))?;
    let found: i32 = tx
        .query_one(
            &format!("SELECT coalesce(max(version), 0) FROM {ident}.idemgate_schema_version"),
            &[],
        )
        .await
        .map_err(|e| misconfigured("read the schema version", e))?
        .get(0);
    if found > SCHEMA_VERSION {
        return Err(StoreError::misconfigured(format!(
            "schema {schema} is at version {found}, newer than this idemgate (version \
             {SCHEMA_VERSION}); upgrade idemgate before pointing it at this database"
        )));
    }
    for (version, name, sql) in MIGRATIONS.iter().filter(|(v, _, _)| *v > found) {
        tx.batch_execute(&sql.replace("{schema}", &ident))
            .await
            .map_err(|e| misconfigured(&format!("apply migration {version} ({name})"), e))?;
        tx.execute(
            &format!("INSERT INTO {ident}.idemgate_schema_version (version, name) VALUES ($1, $2)"),
            &[version, name],
        )
        .await
        .map_err(|e| misconfigured("record the schema version", e))?;
    }
    tx.commit()
        .await
        .map_err(|e| misconfigured("commit the migration", e))?;
    Ok(found)
}

fn misconfigured(what: &str, e: tokio_postgres::Error) -> StoreError {
    let class = match e.as_db_error() {
        Some(_) => StoreError::Misconfigured,
        None => StoreError::Unavailable,
    };
    class(Cause::new(
        format!("failed to {what}: {}", error::chain(&e)),
        e,
    ))
}

/// `s` as a quoted SQL identifier.
pub(crate) fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(quote_ident("idemgate"), "\"idemgate\"");
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
    }

    #[test]
    fn migrations_are_numbered_in_order_up_to_the_version() {
        for (i, (v, _, _)) in MIGRATIONS.iter().enumerate() {
            assert_eq!(*v, i as i32 + 1);
        }
        assert_eq!(MIGRATIONS.last().map(|m| m.0), Some(SCHEMA_VERSION));
    }
}
