//! Operators by name: `[[console.operators]]`, each a name and the hash of its own token, so the
//! audit log says which person resolved a record (`console:<name>`), not that "the operator" did.

use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

/// The name the single token of `console.operator_token_sha256` (and of `idemgate console`)
/// signs in as: the name every console resolution had before operators had names.
pub const DEFAULT_OPERATOR: &str = "operator";

/// Longest operator name: an e-mail address fits (RFC 5321 caps a path at 256).
const MAX_NAME: usize = 256;

/// `[[console.operators]]`: one person (or role) who sees and acts on every tenant's records.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorConfig {
    /// Who signs in with the token: the audit log signs this operator's actions `console:<name>`.
    pub name: String,
    /// Lower-case hex SHA-256 of the operator's token (`idemgate token hash TOKEN`).
    pub token_sha256: String,
}

/// Whether `name` may name an operator; why not otherwise. Names reach the audit log
/// (`console:<name>`) and pages, so they are one printable word: no spaces or control characters
/// that could make two operators look alike, and not `tenant:…`, which would read as a tenant's
/// session (`console:tenant:ID`).
///
/// # Errors
/// What is wrong with it.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("an operator's name is empty".to_owned());
    }
    if name.len() > MAX_NAME {
        return Err(format!(
            "an operator's name has at most {MAX_NAME} bytes; this one has {}",
            name.len()
        ));
    }
    if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "the operator's name {name:?} has a space or a control character"
        ));
    }
    if name.starts_with("tenant:") {
        return Err(format!(
            "the operator's name {name:?} begins with \"tenant:\", which the audit log uses for tenants' sessions"
        ));
    }
    Ok(())
}

/// Checks what serde cannot: names are valid and unique, hashes are 64 hex digits and unique,
/// and no operator's token is one of `tenant_hashes` (the console could not tell who signed in).
/// `field` names the list in errors (`console.operators`).
///
/// # Errors
/// The field at fault (`console.operators[1].name`) and what is wrong with it.
pub fn validate(
    operators: &[OperatorConfig],
    tenant_hashes: &[&str],
    field: &str,
) -> Result<(), (String, String)> {
    for (i, o) in operators.iter().enumerate() {
        check_name(&o.name).map_err(|why| (format!("{field}[{i}].name"), why))?;
        if operators[..i].iter().any(|p| p.name == o.name) {
            return Err((
                format!("{field}[{i}].name"),
                format!("operator {:?} is listed twice", o.name),
            ));
        }
        let h = &o.token_sha256;
        if h.len() != 64 || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err((
                format!("{field}[{i}].token_sha256"),
                "expected 64 hex digits (`idemgate token hash TOKEN` prints them)".to_owned(),
            ));
        }
        if operators[..i]
            .iter()
            .any(|p| p.token_sha256.eq_ignore_ascii_case(h))
        {
            return Err((
                format!("{field}[{i}].token_sha256"),
                "two operators share one token: give each operator a token of its own, so the audit log can tell them apart".to_owned(),
            ));
        }
        if tenant_hashes.iter().any(|t| t.eq_ignore_ascii_case(h)) {
            return Err((
                format!("{field}[{i}].token_sha256"),
                "the operator's token is also a tenant's: give the operator a token of its own"
                    .to_owned(),
            ));
        }
    }
    Ok(())
}

/// The operators' tokens, as the console checks a sign-in against them.
#[derive(Debug, Default)]
pub(crate) struct Operators(Vec<(String, [u8; 32])>);

impl Operators {
    /// The operators of a validated list.
    pub(crate) fn new(operators: &[OperatorConfig]) -> Self {
        Operators(
            operators
                .iter()
                .map(|o| {
                    let mut hash = [0u8; 32];
                    for (i, b) in hash.iter_mut().enumerate() {
                        // Validated as 64 hex digits before.
                        *b = u8::from_str_radix(&o.token_sha256[2 * i..2 * i + 2], 16).unwrap_or(0);
                    }
                    (o.name.clone(), hash)
                })
                .collect(),
        )
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The name of the operator whose token `token` is. Every operator's hash is compared, in
    /// constant time, so the answer's timing says nothing about who exists or how close a guess
    /// was.
    pub(crate) fn named_by(&self, token: &str) -> Option<String> {
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for (name, hash) in &self.0 {
            if bool::from(hash.ct_eq(&presented)) {
                found = Some(name.clone());
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use idemgate_kit::tenants::token_sha256;

    use super::*;

    fn op(name: &str, token: &str) -> OperatorConfig {
        OperatorConfig {
            name: name.to_owned(),
            token_sha256: token_sha256(token),
        }
    }

    #[test]
    fn each_token_names_its_operator() {
        let ops = Operators::new(&[op("alice", "ta"), op("bob@example.com", "tb")]);
        assert_eq!(ops.named_by("ta").as_deref(), Some("alice"));
        assert_eq!(ops.named_by("tb").as_deref(), Some("bob@example.com"));
        assert_eq!(ops.named_by("tc"), None);
        assert_eq!(ops.named_by(""), None);
        assert!(Operators::default().named_by("ta").is_none());
    }

    #[test]
    fn names_are_one_printable_word_that_is_no_tenants() {
        for good in ["alice", "bob@example.com", "auth0|1234", "ops-oncall"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "alice smith",
            "alice\n",
            "tenant:acme",
            &"a".repeat(257),
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn validation_names_the_field() {
        let f = "console.operators";
        assert!(validate(&[op("a", "t"), op("b", "u")], &[], f).is_ok());
        let e = validate(&[op("a", "t"), op("a", "u")], &[], f).unwrap_err();
        assert_eq!(e.0, "console.operators[1].name");
        let e = validate(&[op("a", "t"), op("b", "t")], &[], f).unwrap_err();
        assert!(
            e.0 == "console.operators[1].token_sha256" && e.1.contains("share"),
            "{e:?}"
        );
        let tenant = token_sha256("t");
        let e = validate(&[op("a", "t")], &[&tenant], f).unwrap_err();
        assert!(e.1.contains("also a tenant's"), "{e:?}");
        let mut short = op("a", "t");
        short.token_sha256 = "abc".to_owned();
        let e = validate(&[short], &[], f).unwrap_err();
        assert_eq!(e.0, "console.operators[0].token_sha256");
        let e = validate(&[op("a b", "t")], &[], f).unwrap_err();
        assert_eq!(e.0, "console.operators[0].name");
    }
}
