//! HTTPS for the doors' HTTP clients: rustls with ring's cryptography, and the platform's
//! certificate verifier (the system's roots, and its own trust settings on macOS and Windows).
//!
//! One provider for every target. aws-lc-rs, rustls' default, is a large C library whose
//! objects zig's Mach-O linker cannot link (it crashes), so the macOS builds (cross-compiled
//! here with zig) would need another provider anyway; ring is already built for the JOSE checks,
//! builds on every target idemgate ships for, and offers what a client of an upstream, an issuer
//! or an OTLP collector needs (TLS 1.2 and 1.3, ECDSA, RSA, Ed25519). What it lacks is the
//! post-quantum hybrid key exchange (X25519MLKEM768).
//!
//! reqwest built without its own provider takes the process's default one and panics when there
//! is none: every client is built through [`client_builder`], and code that builds one
//! elsewhere (the OTLP exporter's) calls [`install_crypto_provider`] first.

/// Makes ring the process's rustls provider, unless one is installed already (by the program
/// that embeds idemgate, say: its choice stands). Cheap after the first call.
pub fn install_crypto_provider() {
    #[cfg(feature = "tls")]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            // An error means a provider is installed already, which is all this asks.
            let _ = rustls::crypto::ring::default_provider().install_default();
        });
    }
}

/// A reqwest client builder whose HTTPS works: the provider installed first.
#[cfg(feature = "tls")]
pub fn client_builder() -> reqwest::ClientBuilder {
    install_crypto_provider();
    reqwest::Client::builder()
}

#[cfg(all(test, feature = "tls"))]
mod tests {
    #[test]
    fn a_client_builds_with_https() {
        // Without a provider, reqwest panics here ("No rustls crypto provider is configured").
        let client = super::client_builder().build();
        assert!(client.is_ok(), "{client:?}");
        assert!(rustls::crypto::CryptoProvider::get_default().is_some());
    }
}
