//! A sealed SQLite store keeps neither results nor keys in clear in its files.

use idemgate_seal::testing;
use idemgate_sqlite::{SqliteOptions, SqliteStore};

/// Every byte of the database at `db`: the file, its write-ahead log and its shared memory.
fn dump(db: &std::path::Path) -> Vec<u8> {
    let mut bytes = Vec::new();
    for suffix in ["", "-wal", "-shm"] {
        let mut path = db.as_os_str().to_owned();
        path.push(suffix);
        if let Ok(b) = std::fs::read(&path) {
            bytes.extend(b);
        }
    }
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_file_and_its_wal_show_neither_the_result_nor_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let (plain_db, sealed_db) = (dir.path().join("plain.db"), dir.path().join("sealed.db"));
    let plain = SqliteStore::open(&plain_db, SqliteOptions::default()).unwrap();
    testing::write_secret_record(&plain, "acme").await;
    let sealed = testing::sealed(SqliteStore::open(&sealed_db, SqliteOptions::default()).unwrap());
    testing::write_secret_record(&sealed, "acme").await;
    assert!(std::fs::metadata(format!("{}-wal", sealed_db.display())).is_ok());
    testing::assert_dump_hides_secrets(&dump(&plain_db), &dump(&sealed_db));
    drop((plain, sealed));
    testing::assert_dump_hides_secrets(&dump(&plain_db), &dump(&sealed_db));
}
