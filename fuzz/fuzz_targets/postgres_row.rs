#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| idemgate_fuzz::postgres_row(data));
