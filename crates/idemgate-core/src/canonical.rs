//! Canonical JSON (RFC 8785 ordering and string rules) and the SHA-256 fingerprint over it.
//!
//! Two argument objects that mean the same thing (keys in another order, other white space, `1.0`
//! for `1`) get the same fingerprint; two that differ in any value get different ones. Integers are
//! kept exact, digit for digit, never rounded through a double: `[`Fingerprint::of_json_text`]`
//! reads the raw text itself for that reason, since a generic JSON value may already have rounded
//! an integer beyond 64 bits. Other numbers are written as ECMAScript does, as RFC 8785 asks.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::key::hex;

/// Arguments that are not canonicalizable JSON.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CanonicalError {
    /// Malformed JSON text.
    #[error("failed to parse the arguments as JSON: {what} at byte {at}")]
    Syntax {
        /// What was wrong.
        what: &'static str,
        /// Byte offset.
        at: usize,
    },
    /// Nested deeper than allowed.
    #[error("failed to parse the arguments as JSON: nested deeper than {max} levels")]
    TooDeep {
        /// The limit.
        max: usize,
    },
    /// An object repeated a member name, which leaves its meaning open (RFC 8785 refuses it).
    #[error(
        "failed to parse the arguments as JSON: member name {name:?} appears twice in one object"
    )]
    DuplicateName {
        /// The repeated name.
        name: String,
    },
    /// A non-integer number outside the range of a double.
    #[error("failed to parse the arguments as JSON: number {lexeme} is out of range")]
    NumberOutOfRange {
        /// The number as written.
        lexeme: String,
    },
    /// A fingerprint that is not 64 hex digits.
    #[error("failed to read a fingerprint: expected 64 hex digits")]
    BadFingerprint,
}

/// Deepest nesting accepted in raw JSON text, so hostile input cannot exhaust the stack.
pub const MAX_DEPTH: usize = 128;

/// The SHA-256 of a call's canonical arguments.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The fingerprint of a JSON value (integers beyond 64 bits were already rounded by whoever
    /// parsed it: prefer [`Fingerprint::of_json_text`] when the raw text is at hand).
    pub fn of_json(value: &Value) -> Self {
        let mut out = String::with_capacity(256);
        write_value(value, &mut out);
        Self::of_bytes(out.as_bytes())
    }

    /// The fingerprint of text that is canonical already (written with [`pieces`]).
    pub fn of_canonical_text(text: &str) -> Self {
        Self::of_bytes(text.as_bytes())
    }

    /// The fingerprint of raw JSON text, with every integer kept exact.
    ///
    /// # Errors
    /// [`CanonicalError`] when `text` is not one well-formed JSON value, nests deeper than
    /// [`MAX_DEPTH`], repeats an object member name, or has a number too large for a double.
    pub fn of_json_text(text: &[u8]) -> Result<Self, CanonicalError> {
        Ok(Self::of_bytes(canonicalize_text(text)?.as_bytes()))
    }

    /// The fingerprint of arbitrary bytes (for front doors whose arguments are not JSON, such as a
    /// command line: they encode their arguments unambiguously first).
    pub fn of_bytes(bytes: &[u8]) -> Self {
        Fingerprint(Sha256::digest(bytes).into())
    }

    /// The raw digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// A fingerprint from a raw digest (stores read it back this way).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Fingerprint(bytes)
    }

    /// Lower-case hex, 64 characters.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", &self.to_hex()[..16])
    }
}

impl FromStr for Fingerprint {
    type Err = CanonicalError;
    fn from_str(s: &str) -> Result<Self, CanonicalError> {
        let bad = || CanonicalError::BadFingerprint;
        if s.len() != 64 {
            return Err(bad());
        }
        let mut out = [0u8; 32];
        for (i, pair) in s.as_bytes().chunks(2).enumerate() {
            let hi = (pair[0] as char).to_digit(16).ok_or_else(bad)?;
            let lo = (pair[1] as char).to_digit(16).ok_or_else(bad)?;
            out[i] = (hi * 16 + lo) as u8;
        }
        Ok(Fingerprint(out))
    }
}

impl Serialize for Fingerprint {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for Fingerprint {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// An identity field as a JSON pointer: a pointer (`/to`, `/order/id`) as given, a bare name
/// (`to`) as the top-level argument of that name.
pub fn identity_pointer(field: &str) -> String {
    if field.starts_with('/') {
        field.to_owned()
    } else {
        format!("/{}", field.replace('~', "~0").replace('/', "~1"))
    }
}

impl Fingerprint {
    /// The fingerprint of what `fields` (a tool's identity fields, see
    /// [`crate::ToolPolicy::identity`]) pick out of the JSON text `args`: the canonical text of
    /// the pairs of each field (as a JSON pointer, so `to` and `/to` are one field) and its
    /// value (integers kept exact, as [`Fingerprint::of_json_text`] keeps them), in the fields'
    /// order as pointers. `None` when the text is not JSON or a field is missing or `null` (a
    /// model's strict schema sends every optional argument as `null`): such a call is named by
    /// all its arguments.
    pub fn of_identity(args: &[u8], fields: &[String]) -> Option<Self> {
        let mut parser = Parser { s: args, at: 0 };
        let tree = parser.value(0).ok()?;
        let mut picked: Vec<(String, String)> = Vec::with_capacity(fields.len());
        for field in fields {
            let pointer = identity_pointer(field);
            let value = pick(&tree, &pointer)?;
            if matches!(value, Tree::Literal("null")) {
                return None;
            }
            let mut text = String::new();
            write_tree(value, &mut text);
            picked.push((pointer, text));
        }
        picked.sort();
        picked.dedup();
        // Told apart from any arguments' fingerprint: no arguments' canonical text starts so.
        let mut text = String::from("idemgate-identity:");
        for (pointer, value) in &picked {
            write_string(pointer, &mut text);
            text.push('=');
            text.push_str(value);
            text.push(';');
        }
        Some(Self::of_bytes(text.as_bytes()))
    }
}

/// The value at the JSON pointer `pointer` (RFC 6901) of `tree`.
fn pick<'t>(tree: &'t Tree, pointer: &str) -> Option<&'t Tree> {
    let mut at = tree;
    for token in pointer.strip_prefix('/')?.split('/') {
        let token = token.replace("~1", "/").replace("~0", "~");
        at = match at {
            Tree::Object(members) => members.iter().find(|(k, _)| *k == token).map(|(_, v)| v)?,
            Tree::Array(items) => items.get(token.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(at)
}

/// The canonical text of a JSON value.
pub fn canonicalize(value: &Value) -> String {
    let mut out = String::new();
    write_value(value, &mut out);
    out
}

/// The canonical text of raw JSON text, with every integer kept exact.
///
/// # Errors
/// As [`Fingerprint::of_json_text`].
pub fn canonicalize_text(text: &[u8]) -> Result<String, CanonicalError> {
    let mut parser = Parser { s: text, at: 0 };
    let tree = parser.value(0)?;
    parser.skip_ws();
    if parser.at != text.len() {
        return Err(parser.error("trailing characters after the JSON value"));
    }
    let mut out = String::with_capacity(text.len());
    write_tree(&tree, &mut out);
    Ok(out)
}

/// Canonical text written piece by piece, for a caller that walks values of its own (the Python
/// door reads them from Python objects) and would otherwise build a [`Value`] only to have it
/// written: the same text [`canonicalize`] writes for the same value. The caller writes an
/// object's members in [`pieces::member_order`], each as its name, `:` and its value.
pub mod pieces {
    /// The order of an object's members: by their names' UTF-16 code units (RFC 8785).
    pub fn member_order(a: &str, b: &str) -> std::cmp::Ordering {
        super::utf16_order(a, b)
    }

    /// A string, quoted and escaped.
    pub fn string(s: &str, out: &mut String) {
        super::write_string(s, out);
    }

    /// An integer, exact.
    pub fn integer(i: impl std::fmt::Display, out: &mut String) {
        use std::fmt::Write as _;
        let _ = write!(out, "{i}");
    }

    /// A finite double as ECMAScript writes it (`-0` as `0`); `false`, with nothing written, for
    /// NaN and the infinities, which JSON has no text for.
    pub fn double(f: f64, out: &mut String) -> bool {
        if !f.is_finite() {
            return false;
        }
        super::write_double(f, out);
        true
    }
}

/// RFC 8785 orders member names by their UTF-16 code units.
fn utf16_order(a: &str, b: &str) -> Ordering {
    if a.is_ascii() && b.is_ascii() {
        return a.cmp(b);
    }
    a.encode_utf16().cmp(b.encode_utf16())
}

fn write_value(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            use std::fmt::Write as _;
            if let Some(i) = n.as_i64() {
                let _ = write!(out, "{i}");
            } else if let Some(u) = n.as_u64() {
                let _ = write!(out, "{u}");
            } else {
                write_double(n.as_f64().unwrap_or(0.0), out);
            }
        }
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut members: Vec<(&String, &Value)> = map.iter().collect();
            members.sort_by(|a, b| utf16_order(a.0, b.0));
            out.push('{');
            for (i, (name, item)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(name, out);
                out.push(':');
                write_value(item, out);
            }
            out.push('}');
        }
    }
}

/// ECMAScript's Number.prototype.toString, which RFC 8785 prescribes; `-0` is written `0`.
fn write_double(f: f64, out: &mut String) {
    if f == 0.0 {
        out.push('0');
        return;
    }
    let mut buf = ryu_js::Buffer::new();
    out.push_str(buf.format_finite(f));
}

fn write_string(s: &str, out: &mut String) {
    out.push('"');
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        let escape = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\x08' => "\\b",
            b'\t' => "\\t",
            b'\n' => "\\n",
            b'\x0c' => "\\f",
            b'\r' => "\\r",
            0..=0x1f => "",
            _ => continue,
        };
        out.push_str(&s[start..i]);
        if escape.is_empty() {
            out.push_str(&format!("\\u{b:04x}"));
        } else {
            out.push_str(escape);
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

/// A JSON value parsed from text, numbers kept as their canonical lexeme.
enum Tree {
    Literal(&'static str),
    Number(String),
    String(String),
    Array(Vec<Tree>),
    Object(Vec<(String, Tree)>),
}

fn write_tree(t: &Tree, out: &mut String) {
    match t {
        Tree::Literal(l) => out.push_str(l),
        Tree::Number(n) => out.push_str(n),
        Tree::String(s) => write_string(s, out),
        Tree::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_tree(item, out);
            }
            out.push(']');
        }
        Tree::Object(members) => {
            out.push('{');
            for (i, (name, item)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(name, out);
                out.push(':');
                write_tree(item, out);
            }
            out.push('}');
        }
    }
}

struct Parser<'a> {
    s: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    fn error(&self, what: &'static str) -> CanonicalError {
        CanonicalError::Syntax { what, at: self.at }
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.s.get(self.at) {
            self.at += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.at).copied()
    }

    fn eat(&mut self, lit: &'static str) -> Result<(), CanonicalError> {
        if self.s[self.at..].starts_with(lit.as_bytes()) {
            self.at += lit.len();
            Ok(())
        } else {
            Err(self.error("unexpected character"))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Tree, CanonicalError> {
        if depth > MAX_DEPTH {
            return Err(CanonicalError::TooDeep { max: MAX_DEPTH });
        }
        self.skip_ws();
        match self.peek() {
            None => Err(self.error("unexpected end of input")),
            Some(b'n') => self.eat("null").map(|()| Tree::Literal("null")),
            Some(b't') => self.eat("true").map(|()| Tree::Literal("true")),
            Some(b'f') => self.eat("false").map(|()| Tree::Literal("false")),
            Some(b'"') => self.string().map(Tree::String),
            Some(b'[') => {
                self.at += 1;
                let mut items = Vec::new();
                self.skip_ws();
                if self.peek() == Some(b']') {
                    self.at += 1;
                    return Ok(Tree::Array(items));
                }
                loop {
                    items.push(self.value(depth + 1)?);
                    self.skip_ws();
                    match self.peek() {
                        Some(b',') => self.at += 1,
                        Some(b']') => {
                            self.at += 1;
                            return Ok(Tree::Array(items));
                        }
                        _ => return Err(self.error("expected ',' or ']'")),
                    }
                }
            }
            Some(b'{') => {
                self.at += 1;
                let mut members: Vec<(String, Tree)> = Vec::new();
                self.skip_ws();
                if self.peek() == Some(b'}') {
                    self.at += 1;
                    return Ok(Tree::Object(members));
                }
                loop {
                    self.skip_ws();
                    if self.peek() != Some(b'"') {
                        return Err(self.error("expected a member name"));
                    }
                    let name = self.string()?;
                    self.skip_ws();
                    if self.peek() != Some(b':') {
                        return Err(self.error("expected ':'"));
                    }
                    self.at += 1;
                    let item = self.value(depth + 1)?;
                    members.push((name, item));
                    self.skip_ws();
                    match self.peek() {
                        Some(b',') => self.at += 1,
                        Some(b'}') => {
                            self.at += 1;
                            break;
                        }
                        _ => return Err(self.error("expected ',' or '}'")),
                    }
                }
                members.sort_by(|a, b| utf16_order(&a.0, &b.0));
                if let Some(w) = members.windows(2).find(|w| w[0].0 == w[1].0) {
                    return Err(CanonicalError::DuplicateName {
                        name: w[0].0.clone(),
                    });
                }
                Ok(Tree::Object(members))
            }
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(_) => Err(self.error("unexpected character")),
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.at;
        while let Some(b'0'..=b'9') = self.peek() {
            self.at += 1;
        }
        self.at - start
    }

    fn number(&mut self) -> Result<Tree, CanonicalError> {
        let start = self.at;
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        let int_start = self.at;
        let int_len = self.digits();
        if int_len == 0 {
            return Err(self.error("expected a digit"));
        }
        if int_len > 1 && self.s[int_start] == b'0' {
            return Err(self.error("leading zero in a number"));
        }
        let mut integer = true;
        if self.peek() == Some(b'.') {
            self.at += 1;
            integer = false;
            if self.digits() == 0 {
                return Err(self.error("expected a digit after '.'"));
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            integer = false;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            if self.digits() == 0 {
                return Err(self.error("expected a digit in the exponent"));
            }
        }
        // The slice holds only ASCII digits and signs, checked above.
        let lexeme = std::str::from_utf8(&self.s[start..self.at]).unwrap_or("0");
        if integer {
            // Exact, digit for digit; "-0" is the same number as "0".
            return Ok(Tree::Number(if lexeme == "-0" {
                "0".to_owned()
            } else {
                lexeme.to_owned()
            }));
        }
        let f: f64 = lexeme.parse().map_err(|_| self.error("malformed number"))?;
        if !f.is_finite() {
            return Err(CanonicalError::NumberOutOfRange {
                lexeme: lexeme.to_owned(),
            });
        }
        let mut out = String::new();
        write_double(f, &mut out);
        Ok(Tree::Number(out))
    }

    fn hex4(&mut self) -> Result<u32, CanonicalError> {
        let chunk = self
            .s
            .get(self.at..self.at + 4)
            .ok_or_else(|| self.error("short \\u escape"))?;
        let mut v = 0;
        for &b in chunk {
            v = v * 16
                + (b as char)
                    .to_digit(16)
                    .ok_or_else(|| self.error("bad hex digit in \\u escape"))?;
        }
        self.at += 4;
        Ok(v)
    }

    fn string(&mut self) -> Result<String, CanonicalError> {
        self.at += 1; // the opening quote
        let mut out = String::new();
        loop {
            let run_start = self.at;
            while let Some(b) = self.peek() {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.at += 1;
            }
            let run = std::str::from_utf8(&self.s[run_start..self.at]).map_err(|_| {
                CanonicalError::Syntax {
                    what: "invalid UTF-8 in a string",
                    at: run_start,
                }
            })?;
            out.push_str(run);
            match self.peek() {
                None => return Err(self.error("unterminated string")),
                Some(b'"') => {
                    self.at += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.at += 1;
                    let esc = self
                        .peek()
                        .ok_or_else(|| self.error("unterminated string"))?;
                    self.at += 1;
                    match esc {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\x08'),
                        b'f' => out.push('\x0c'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let hi = self.hex4()?;
                            let c = if (0xD800..0xDC00).contains(&hi) {
                                self.eat("\\u")
                                    .map_err(|_| self.error("lone surrogate in \\u escape"))?;
                                let lo = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return Err(self.error("lone surrogate in \\u escape"));
                                }
                                0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                            } else {
                                hi
                            };
                            out.push(
                                char::from_u32(c)
                                    .ok_or_else(|| self.error("lone surrogate in \\u escape"))?,
                            );
                        }
                        _ => return Err(self.error("unknown escape")),
                    }
                }
                Some(_) => return Err(self.error("control character in a string")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn text(s: &str) -> String {
        canonicalize_text(s.as_bytes()).unwrap()
    }

    #[test]
    fn orders_members_and_drops_white_space() {
        assert_eq!(
            text(r#" { "b" : [1, 2.50, true], "a": {"y": null, "x": "\u0041"} } "#),
            r#"{"a":{"x":"A","y":null},"b":[1,2.5,true]}"#
        );
    }

    #[test]
    fn rfc8785_sample_strings_and_numbers() {
        // From RFC 8785 section 3.2.3 (numbers) and its string rules.
        assert_eq!(
            text("[1E30, 4.50, 2e-3, 0.000001, 1e-7, -0.0, 1.0]"),
            "[1e+30,4.5,0.002,0.000001,1e-7,0,1]"
        );
        assert_eq!(
            text(r#""\u20ac\u0001\/\"\\\n""#),
            "\"€\\u0001/\\\"\\\\\\n\""
        );
    }

    #[test]
    fn sorts_by_utf16_code_units() {
        // U+10000 is D800 DC00 in UTF-16, which sorts before U+E000 although it is larger.
        let v = json!({"\u{e000}": 1, "\u{10000}": 2});
        assert_eq!(canonicalize(&v), "{\"\u{10000}\":2,\"\u{e000}\":1}");
    }

    #[test]
    fn integers_are_kept_exact() {
        let a = Fingerprint::of_json_text(b"{\"amount\": 12345678901234567890123}").unwrap();
        let b = Fingerprint::of_json_text(b"{\"amount\": 12345678901234567890124}").unwrap();
        assert_ne!(a, b);
        assert_eq!(
            text("[9007199254740993, -0, 18446744073709551615]"),
            "[9007199254740993,0,18446744073709551615]"
        );
    }

    #[test]
    fn rejects_bad_text() {
        for bad in [
            "",
            "{",
            "[1,]",
            "01",
            "{\"a\":1,\"a\":2}",
            "\"\\ud800\"",
            "1 2",
            "1e999",
            "nul",
        ] {
            assert!(
                canonicalize_text(bad.as_bytes()).is_err(),
                "{bad:?} was accepted"
            );
        }
        let deep = "[".repeat(MAX_DEPTH + 2) + &"]".repeat(MAX_DEPTH + 2);
        assert!(matches!(
            canonicalize_text(deep.as_bytes()),
            Err(CanonicalError::TooDeep { .. })
        ));
    }

    #[test]
    fn fingerprint_round_trips_as_hex() {
        let f = Fingerprint::of_json(&json!({"a": 1}));
        assert_eq!(f.to_hex().parse::<Fingerprint>().unwrap(), f);
        assert!("zz".parse::<Fingerprint>().is_err());
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|i| json!(i)),
            any::<u64>().prop_map(|u| json!(u)),
            (-1e300f64..1e300).prop_map(|f| json!(f)),
            "\\PC{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map("\\PC{0,6}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// The value path and the raw-text path agree, and canonical text is a fixed point.
        #[test]
        fn text_and_value_paths_agree(v in arb_json()) {
            let canon = canonicalize(&v);
            let pretty = serde_json::to_string_pretty(&v).unwrap();
            prop_assert_eq!(&canonicalize_text(pretty.as_bytes()).unwrap(), &canon);
            prop_assert_eq!(&canonicalize_text(canon.as_bytes()).unwrap(), &canon);
            let reparsed: Value = serde_json::from_str(&canon).unwrap();
            prop_assert_eq!(canonicalize(&reparsed), canon);
        }
    }
}
