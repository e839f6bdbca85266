//! What `exec` stores: the command's exit code, stdout and stderr.

use anyhow::{Context as _, Result};
use base64::Engine as _;
use serde::{Deserialize, Serialize};

/// A finished command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CommandOutcome {
    pub(crate) exit_code: i32,
    #[serde(with = "b64")]
    pub(crate) stdout: Vec<u8>,
    #[serde(with = "b64")]
    pub(crate) stderr: Vec<u8>,
}

impl CommandOutcome {
    pub(crate) fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a struct of numbers and strings always encodes")
    }

    pub(crate) fn decode(body: &[u8]) -> Result<Self> {
        serde_json::from_slice(body)
            .context("failed to read the stored outcome: it was not written by `idemgate exec`")
    }

    /// The exit code as a process exit status (0-255).
    pub(crate) fn status(&self) -> u8 {
        u8::try_from(self.exit_code.rem_euclid(256)).unwrap_or(1)
    }

    /// JSON fields for `--json` output: text when the bytes are UTF-8, base64 otherwise.
    pub(crate) fn json_fields(&self, out: &mut serde_json::Map<String, serde_json::Value>) {
        out.insert("exit_code".into(), self.exit_code.into());
        for (name, bytes) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
            match std::str::from_utf8(bytes) {
                Ok(text) => out.insert(name.into(), text.into()),
                Err(_) => out.insert(
                    format!("{name}_base64"),
                    base64::engine::general_purpose::STANDARD
                        .encode(bytes)
                        .into(),
                ),
            };
        }
    }
}

mod b64 {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(s)
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_binary_output() {
        let o = CommandOutcome {
            exit_code: -1,
            stdout: vec![0, 255, 10],
            stderr: b"warn\n".to_vec(),
        };
        assert_eq!(CommandOutcome::decode(&o.encode()).unwrap(), o);
        assert_eq!(o.status(), 255);
        let mut m = serde_json::Map::new();
        o.json_fields(&mut m);
        assert!(m.contains_key("stdout_base64"));
        assert_eq!(m["stderr"], "warn\n");
    }
}
