//! A sealed Redis store keeps neither results nor keys in clear, in its key names or its values.

use idemgate_seal::testing;

use crate::common::{
    delete_prefix, names_under, random_hex, raw, run_prefix, shared_store, test_url,
};

/// Every key name under `prefix` and its value, read whole by its type (`HGETALL`, `GET`, ...),
/// and its `DUMP` (the serialized form an RDB file or a replica holds, where long strings may be
/// compressed: hence the plain reads too).
async fn dump(prefix: &str) -> Vec<u8> {
    let mut conn = raw(&test_url()).await;
    let mut bytes = Vec::new();
    for name in names_under(&mut conn, prefix).await {
        let kind: String = redis::cmd("TYPE")
            .arg(&name)
            .query_async(&mut conn)
            .await
            .expect("type");
        let mut read = redis::cmd(match kind.as_str() {
            "hash" => "HGETALL",
            "string" => "GET",
            "list" => "LRANGE",
            "set" => "SMEMBERS",
            "zset" => "ZRANGE",
            other => panic!("{name} is a {other}, which this dump cannot read"),
        });
        read.arg(&name);
        if matches!(kind.as_str(), "list" | "zset") {
            read.arg(0).arg(-1);
        }
        let values: Vec<Vec<u8>> = match read.query_async::<redis::Value>(&mut conn).await {
            Ok(redis::Value::BulkString(b)) => vec![b],
            Ok(v) => redis::from_redis_value(v).expect("values"),
            Err(e) => panic!("failed to read {name}: {e}"),
        };
        let serialized: Option<Vec<u8>> = redis::cmd("DUMP")
            .arg(&name)
            .query_async(&mut conn)
            .await
            .expect("dump");
        bytes.extend(name.into_bytes());
        bytes.extend(values.concat());
        bytes.extend(serialized.unwrap_or_default());
    }
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_names_and_values_show_neither_the_result_nor_the_key() {
    let plain_prefix = format!("{}plain-{}:", run_prefix(), random_hex(4));
    let sealed_prefix = format!("{}sealed-{}:", run_prefix(), random_hex(4));
    testing::write_secret_record(&shared_store(&plain_prefix).await, "acme").await;
    testing::write_secret_record(&testing::sealed(shared_store(&sealed_prefix).await), "acme")
        .await;
    let (plain, sealed) = (dump(&plain_prefix).await, dump(&sealed_prefix).await);
    delete_prefix(&test_url(), &plain_prefix).await;
    delete_prefix(&test_url(), &sealed_prefix).await;
    assert!(!sealed.is_empty(), "the sealed record is under its prefix");
    testing::assert_dump_hides_secrets(&plain, &sealed);
}
