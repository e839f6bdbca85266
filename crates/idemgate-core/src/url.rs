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

/// A duration option of a `store` URL: milliseconds, or a whole number with `ms` or `s`
/// (`500ms`, `2s`); more than zero and at most `max`.
///
/// # Errors
/// [`StoreError::Misconfigured`] naming the option and what it takes.
pub fn duration_option(
    store: &str,
    name: &str,
    value: &str,
    max: std::time::Duration,
) -> Result<std::time::Duration, StoreError> {
    let (number, unit_ms) = if let Some(n) = value.strip_suffix("ms") {
        (n, 1)
    } else if let Some(n) = value.strip_suffix('s') {
        (n, 1000)
    } else {
        (value, 1)
    };
    let ms = number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(unit_ms))
        .map(std::time::Duration::from_millis);
    match ms {
        Some(d) if !d.is_zero() && d <= max => Ok(d),
        _ => Err(StoreError::misconfigured(format!(
            "failed to read {name}={value:?} in the {store} URL: expected a duration such as \
             500ms or 2s, more than zero and at most {}s",
            max.as_secs()
        ))),
    }
}

/// The error for an option `store` does not know.
fn unknown_option(store: &str, name: &str, known: &[&str]) -> StoreError {
    let valid = if known.is_empty() {
        format!("{store} URLs take no options")
    } else {
        format!("the options are {}", known.join(", "))
    };
    StoreError::misconfigured(format!(
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
    fn durations_take_ms_or_s() {
        let max = std::time::Duration::from_secs(60);
        let d = |v| duration_option("sqlite", "busy_timeout", v, max);
        assert_eq!(d("250").unwrap().as_millis(), 250);
        assert_eq!(d("250ms").unwrap().as_millis(), 250);
        assert_eq!(d("2s").unwrap().as_millis(), 2000);
        assert_eq!(d("60s").unwrap().as_millis(), 60_000);
        for bad in [
            "",
            "0",
            "0s",
            "61s",
            "2m",
            "-1",
            "1.5s",
            "99999999999999999999s",
        ] {
            let e = d(bad).unwrap_err().to_string();
            assert!(
                e.contains("busy_timeout=") && e.contains("500ms or 2s"),
                "{bad}: {e}"
            );
        }
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
