//! Replays the committed corpus (`corpus/<target>/`) through every target function: the smoke run
//! of `scripts/test-all`, on stable Rust and without instrumentation. A crash that `scripts/fuzz`
//! finds is fixed, and its input committed here as `seed-regress-*`, so that it stays fixed.

use std::fs;
use std::path::Path;

/// A fuzz target's body.
type Target = fn(&[u8]);

#[test]
fn the_committed_corpus_passes_every_target() {
    let targets: [(&str, Target); 8] = [
        ("key_parser", idemgate_fuzz::key_parser),
        ("canonical_json", idemgate_fuzz::canonical_json),
        ("sqlite_row", idemgate_fuzz::sqlite_row),
        ("postgres_row", idemgate_fuzz::postgres_row),
        ("redis_record", idemgate_fuzz::redis_record),
        ("payload", idemgate_fuzz::payload),
        ("http_key_header", idemgate_fuzz::http_key_header),
        ("sealed_outcome", idemgate_fuzz::sealed_outcome),
    ];
    for (name, target) in targets {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("corpus")
            .join(name);
        let mut inputs = 0;
        for entry in fs::read_dir(&dir).unwrap_or_else(|e| panic!("no corpus for {name}: {e}")) {
            let path = entry.unwrap().path();
            let data = fs::read(&path).unwrap();
            // Named on failure: the panic message alone does not say which input.
            eprintln!("{name}: {}", path.display());
            target(&data);
            inputs += 1;
        }
        assert!(inputs > 0, "the corpus of {name} is empty");
    }
}
