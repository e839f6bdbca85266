//! The seal: a keyring that encrypts outcomes and a secret that names records.

use std::fmt;
use std::sync::Arc;

use base64::Engine as _;
use idemgate_core::key::{hex, FALLBACK_PREFIX};
use idemgate_core::{Fence, IdempotencyKey, Key};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

/// The first bytes of every sealed body: a zero byte (no JSON, text or command output starts with
/// one) and the format's name and version.
pub const SEALED_MAGIC: &[u8; 5] = b"\0igs1";

/// Bytes of an outcome key (AES-256-GCM).
pub const KEY_LEN: usize = 32;

/// Fewest bytes of the secret that names records.
pub const MIN_SECRET_LEN: usize = 32;

/// Longest key id, in bytes.
pub const MAX_KEY_ID_LEN: usize = 32;

/// The prefix of a stored name: the hex HMAC of the record's name follows.
pub const STORED_NAME_PREFIX: &str = "hmac-";

/// What went wrong with a seal: its configuration, or a sealed body that does not open.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SealError {
    /// The keyring or the secret is malformed (what, and how to fix it).
    #[error("{0}")]
    Config(String),
    /// The body was sealed under a key the keyring does not hold.
    #[error("its outcome is sealed under key id {id:?}, which the keyring does not hold (it holds {held}); add that key back to the keyring (as a key to read, after the current one) to read it")]
    UnknownKeyId {
        /// The id the body names.
        id: String,
        /// The ids the keyring holds, for the message.
        held: String,
    },
    /// The body names a key the keyring holds but does not open with it: it was changed, or
    /// copied from another record.
    #[error("its sealed outcome (key id {id:?}) does not open: it was altered or belongs to another record")]
    DoesNotOpen {
        /// The key id.
        id: String,
    },
    /// The body is not sealed, or is cut short.
    #[error("its outcome is not sealed (written before sealing was turned on, or by a process without the keyring)")]
    NotSealed,
}

/// The keys that seal outcomes: the first one seals new writes, every one opens.
#[derive(Clone)]
pub struct Keyring {
    keys: Vec<(String, Arc<LessSafeKey>)>,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyring")
            .field("current", &self.current_id())
            .field("ids", &self.ids())
            .finish()
    }
}

impl Keyring {
    /// Reads a keyring: `ID:BASE64KEY` entries, one per line or separated by commas, blank lines
    /// and `#` comments ignored. The first entry is the current key (it seals every new outcome);
    /// the others only open outcomes sealed under them. An id is 1 to 32 bytes of letters, digits,
    /// `.`, `_` and `-`; a key is 32 random bytes in base64 (`head -c 32 /dev/urandom | base64`).
    ///
    /// # Errors
    /// [`SealError::Config`] naming the entry (by its id or position, never by its key).
    pub fn parse(text: &str) -> Result<Self, SealError> {
        let mut keys: Vec<(String, Arc<LessSafeKey>)> = Vec::new();
        let entries = text
            .lines()
            .map(|l| l.split('#').next().unwrap_or_default())
            .flat_map(|l| l.split(','))
            .map(str::trim)
            .filter(|e| !e.is_empty());
        for (n, entry) in entries.enumerate() {
            let (id, key) = entry.split_once(':').ok_or_else(|| {
                SealError::Config(format!(
                    "keyring entry {} is not ID:BASE64KEY (an id, a colon, then 32 bytes in base64)",
                    n + 1
                ))
            })?;
            let id = id.trim();
            check_id(id)?;
            if keys.iter().any(|(known, _)| known == id) {
                return Err(SealError::Config(format!(
                    "keyring has key id {id:?} twice; every key needs an id of its own"
                )));
            }
            let bytes = decode(key.trim(), &format!("key {id:?}"))?;
            if bytes.len() != KEY_LEN {
                return Err(SealError::Config(format!(
                    "key {id:?} is {} bytes long; it must be exactly {KEY_LEN} random bytes \
                     (make one with `head -c 32 /dev/urandom | base64`)",
                    bytes.len()
                )));
            }
            let key = UnboundKey::new(&AES_256_GCM, &bytes).map_err(|_| {
                SealError::Config(format!("key {id:?} is not a valid AES-256-GCM key"))
            })?;
            keys.push((id.to_owned(), Arc::new(LessSafeKey::new(key))));
        }
        if keys.is_empty() {
            return Err(SealError::Config(
                "keyring is empty: give at least one ID:BASE64KEY entry".to_owned(),
            ));
        }
        Ok(Keyring { keys })
    }

    /// The id of the key that seals new outcomes.
    pub fn current_id(&self) -> &str {
        &self.keys[0].0
    }

    /// Every id, the current one first.
    pub fn ids(&self) -> Vec<&str> {
        self.keys.iter().map(|(id, _)| id.as_str()).collect()
    }

    fn find(&self, id: &str) -> Option<&LessSafeKey> {
        self.keys
            .iter()
            .find(|(k, _)| k == id)
            .map(|(_, key)| &**key)
    }
}

fn check_id(id: &str) -> Result<(), SealError> {
    let ok = !id.is_empty()
        && id.len() <= MAX_KEY_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(SealError::Config(format!(
            "key id {id:?} must be 1 to {MAX_KEY_ID_LEN} bytes of letters, digits, '.', '_' and '-'"
        )))
    }
}

fn decode(text: &str, what: &str) -> Result<Vec<u8>, SealError> {
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| SealError::Config(format!("{what} is not valid base64: {e}")))
}

/// The per-deployment secret under which records are named: a key is stored as an HMAC of it,
/// never in clear.
#[derive(Clone)]
pub struct NameSecret(hmac::Key);

impl fmt::Debug for NameSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("NameSecret(…)")
    }
}

impl NameSecret {
    /// Reads the secret: at least 32 random bytes in base64.
    ///
    /// # Errors
    /// [`SealError::Config`] when it is not base64 or too short.
    pub fn parse(text: &str) -> Result<Self, SealError> {
        let bytes = decode(text.trim(), "the key secret")?;
        if bytes.len() < MIN_SECRET_LEN {
            return Err(SealError::Config(format!(
                "the key secret is {} bytes long; it must be at least {MIN_SECRET_LEN} random bytes \
                 (make one with `head -c 32 /dev/urandom | base64`)",
                bytes.len()
            )));
        }
        Ok(NameSecret(hmac::Key::new(hmac::HMAC_SHA256, &bytes)))
    }
}

/// What protects records at rest: outcomes sealed (AES-256-GCM, a random nonce per outcome, the
/// key id beside it) and keys stored as an HMAC. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Seal(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    keyring: Keyring,
    names: NameSecret,
    random: SystemRandom,
}

impl Seal {
    /// A seal from its keyring and its naming secret.
    pub fn new(keyring: Keyring, names: NameSecret) -> Self {
        Seal(Arc::new(Inner {
            keyring,
            names,
            random: SystemRandom::new(),
        }))
    }

    /// The keyring.
    pub fn keyring(&self) -> &Keyring {
        &self.0.keyring
    }

    /// The name under which the store keeps `key`'s record: the same tenant and tool, and for the
    /// key `hmac-` and the hex HMAC-SHA-256 of the whole name (a fallback key keeps its
    /// `fallback-` prefix, so the rule that named it stays visible). A key that already is a
    /// stored name (an operator copied it from a listing) is its own.
    pub fn stored_name(&self, key: &Key) -> Key {
        if is_stored_name(&key.key) {
            return key.clone();
        }
        let rule = if key.key.as_str().starts_with(FALLBACK_PREFIX) {
            FALLBACK_PREFIX
        } else {
            ""
        };
        let digest = self.digest(&[
            b"idemgate record name v1",
            key.tenant.as_str().as_bytes(),
            key.tool.as_str().as_bytes(),
            key.key.as_str().as_bytes(),
        ]);
        let name = IdempotencyKey::new(format!("{rule}{STORED_NAME_PREFIX}{}", hex(&digest)))
            .expect("a stored name is visible ASCII and well under the key limit");
        Key::new(key.tenant.clone(), key.tool.clone(), name)
    }

    /// The HMAC of `parts` (each length-prefixed) under the naming secret.
    pub fn digest(&self, parts: &[&[u8]]) -> [u8; 32] {
        let mut ctx = hmac::Context::with_key(&self.0.names.0);
        for part in parts {
            ctx.update(&(part.len() as u64).to_be_bytes());
            ctx.update(part);
        }
        let tag = ctx.sign();
        let mut out = [0u8; 32];
        out.copy_from_slice(tag.as_ref());
        out
    }

    /// Seals `plain` under the current key, bound to `context` (the ciphertext opens only with the
    /// same context).
    ///
    /// # Panics
    /// When the operating system has no randomness to give.
    pub fn seal(&self, context: &[&[u8]], plain: &[u8]) -> Vec<u8> {
        let keyring = &self.0.keyring;
        let (id, key) = &keyring.keys[0];
        let mut nonce = [0u8; NONCE_LEN];
        self.0
            .random
            .fill(&mut nonce)
            .expect("failed to read randomness from the operating system");
        let mut out = Vec::with_capacity(plain.len() + 64);
        out.extend_from_slice(SEALED_MAGIC);
        out.push(u8::try_from(id.len()).expect("key ids are at most 32 bytes"));
        out.extend_from_slice(id.as_bytes());
        let header_len = out.len();
        out.extend_from_slice(&nonce);
        let aad = associated(context, &out[..header_len]);
        let mut body = plain.to_vec();
        key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad),
            &mut body,
        )
        .expect("AES-256-GCM seals any outcome under 64 GiB");
        out.extend_from_slice(&body);
        out
    }

    /// Opens what [`Seal::seal`] sealed with the same `context`.
    ///
    /// # Errors
    /// [`SealError::NotSealed`] for bytes that are not a sealed body, [`SealError::UnknownKeyId`]
    /// when the keyring does not hold its key, [`SealError::DoesNotOpen`] when it was altered or
    /// sealed for another context.
    pub fn open(&self, context: &[&[u8]], sealed: &[u8]) -> Result<Vec<u8>, SealError> {
        let rest = sealed
            .strip_prefix(SEALED_MAGIC.as_slice())
            .ok_or(SealError::NotSealed)?;
        let (&id_len, rest) = rest.split_first().ok_or(SealError::NotSealed)?;
        let id_len = usize::from(id_len);
        if rest.len() < id_len + NONCE_LEN {
            return Err(SealError::NotSealed);
        }
        let id = String::from_utf8_lossy(&rest[..id_len]).into_owned();
        let header_len = SEALED_MAGIC.len() + 1 + id_len;
        let nonce: [u8; NONCE_LEN] = rest[id_len..id_len + NONCE_LEN]
            .try_into()
            .expect("NONCE_LEN bytes");
        let keyring = &self.0.keyring;
        let key = keyring.find(&id).ok_or_else(|| SealError::UnknownKeyId {
            id: id.clone(),
            held: keyring.ids().join(", "),
        })?;
        let aad = associated(context, &sealed[..header_len]);
        let mut body = rest[id_len + NONCE_LEN..].to_vec();
        let plain = key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut body,
            )
            .map_err(|_| SealError::DoesNotOpen { id: id.clone() })?;
        let len = plain.len();
        body.truncate(len);
        Ok(body)
    }

    /// Seals an outcome's body for the record stored as `stored` at `fence`: it opens only there.
    pub fn seal_outcome(&self, stored: &Key, fence: Fence, body: &[u8]) -> Vec<u8> {
        self.seal(&outcome_context(stored, &fence.to_be_bytes()), body)
    }

    /// Opens an outcome's body [`Seal::seal_outcome`] sealed for the same record and fence.
    ///
    /// # Errors
    /// As [`Seal::open`].
    pub fn open_outcome(
        &self,
        stored: &Key,
        fence: Fence,
        sealed: &[u8],
    ) -> Result<Vec<u8>, SealError> {
        self.open(&outcome_context(stored, &fence.to_be_bytes()), sealed)
    }
}

fn outcome_context<'a>(stored: &'a Key, fence: &'a [u8; 8]) -> [&'a [u8]; 5] {
    [
        b"idemgate outcome v1",
        stored.tenant.as_str().as_bytes(),
        stored.tool.as_str().as_bytes(),
        stored.key.as_str().as_bytes(),
        fence,
    ]
}

/// The associated data: the context's parts, each length-prefixed, then the body's header (so
/// that its key id cannot be swapped).
fn associated(context: &[&[u8]], header: &[u8]) -> Vec<u8> {
    let mut aad = Vec::new();
    for part in context.iter().chain([&header]) {
        aad.extend_from_slice(&(part.len() as u64).to_be_bytes());
        aad.extend_from_slice(part);
    }
    aad
}

/// Whether `key` is already a stored name (`hmac-` or `fallback-hmac-`, then 64 lower-case hex
/// digits), as a listing shows it.
pub fn is_stored_name(key: &IdempotencyKey) -> bool {
    let s = key.as_str();
    let s = s.strip_prefix(FALLBACK_PREFIX).unwrap_or(s);
    s.strip_prefix(STORED_NAME_PREFIX)
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}
