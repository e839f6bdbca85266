//! The query options of store URLs (`redis://host?key_prefix=a:`), checked against the options a
//! store knows, so that a misspelt option is refused rather than silently ignored.

use crate::error::StoreError;

/// The query of a store URL: everything before the first `?`, and its `name=value` pairs as
/// written (not percent-decoded; a name without `=` has the value `""`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UrlQuery<'a> {
    /// The URL up to (without) the `?`.
    pub base: &'a str,
    /// The options in the order written; empty pairs (`?&a=1`) are skipped.
    pub options: Vec<(&'a str, &'a str)>,
}

impl<'a> UrlQuery<'a> {
    /// Splits `url` and refuses any option whose name is not in `known`.
    ///
    /// # Errors
    /// [`StoreError::Misconfigured`] naming the first unknown option and listing `known`. The
    /// message never repeats the URL, which may carry a password.
    pub fn parse(url: &'a str, store: &str, known: &[&str]) -> Result<Self, StoreError> {
        let Some((base, query)) = url.split_once('?') else {
            return Ok(UrlQuery {
                base: url,
                options: Vec::new(),
            });
        };
        let mut options = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            if !known.contains(&name) {
                return Err(unknown_option(store, name, known));
            }
            options.push((name, value));
        }
        Ok(UrlQuery { base, options })
    }
}

/// The error for an option `store` does not know.
fn unknown_option(store: &str, name: &str, known: &[&str]) -> StoreError {
    let valid = if known.is_empty() {
        format!("{store} URLs take no options")
    } else {
        format!("the options are {}", known.join(", "))
    };
    StoreError::Misconfigured(format!(
        "failed to parse the {store} URL: unknown option {name:?}; {valid} (docs/STORES.md \
         describes them)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_options_are_split_out_in_order() {
        let q = UrlQuery::parse("redis://h:1/2?b=x=y&&a&b=2", "redis", &["a", "b"]).unwrap();
        assert_eq!(q.base, "redis://h:1/2");
        assert_eq!(q.options, vec![("b", "x=y"), ("a", ""), ("b", "2")]);
        let q = UrlQuery::parse("sqlite://x.db", "sqlite", &[]).unwrap();
        assert_eq!((q.base, q.options.len()), ("sqlite://x.db", 0));
        assert_eq!(UrlQuery::parse("m:?", "m", &[]).unwrap().base, "m:");
    }

    #[test]
    fn unknown_options_are_named_with_the_valid_ones() {
        let e = UrlQuery::parse(
            "redis://u:secret@h?key_prefix=a&prefx=x",
            "redis",
            &["key_prefix", "protocol"],
        )
        .unwrap_err();
        let StoreError::Misconfigured(m) = &e else {
            panic!("expected Misconfigured, got {e:?}")
        };
        assert!(m.starts_with("failed to parse the redis URL"), "{m}");
        assert!(m.contains("\"prefx\""), "{m}");
        assert!(m.contains("key_prefix, protocol"), "{m}");
        assert!(!m.contains("secret"), "{m}");
        let e = UrlQuery::parse("sqlite://x.db?mode=ro", "sqlite", &[]).unwrap_err();
        assert!(
            e.to_string()
                .contains("\"mode\"; sqlite URLs take no options"),
            "{e}"
        );
    }
}
