//! HTML by hand: escaping, query strings, and the page every view sits in.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// The Content-Security-Policy of every console answer: nothing but the console's own script,
/// stylesheet and images; no inline script or style, no framing, forms post only here.
pub(crate) const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Text made safe for HTML content and quoted attribute values.
pub(crate) fn esc(s: &str) -> String {
    idemgate_kit::html::escape(s)
}

/// Percent-encoding for a query string value (everything but RFC 3986's unreserved characters),
/// as the kit encodes the gateway's paths.
pub(crate) fn enc(s: &str) -> String {
    idemgate_kit::path_segment(s)
}

/// A query string of `pairs`, with those whose value is empty left out.
pub(crate) fn query(pairs: &[(&str, &str)]) -> String {
    let parts: Vec<String> = pairs
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| format!("{k}={}", enc(v)))
        .collect();
    parts.join("&")
}

/// Who is signed in, for the page's header and its sign-out form.
pub(crate) struct Header<'a> {
    pub(crate) who: String,
    pub(crate) csrf: &'a str,
}

/// A whole page: `title`, the navigation when signed in, and `body`.
pub(crate) fn page(
    status: StatusCode,
    title: &str,
    header: Option<Header<'_>>,
    body: &str,
) -> Response {
    page_with_head(status, title, header, body, "")
}

/// A page that sends the browser on to `location` (same-site) as soon as it is shown: after a
/// sign-in that came back from another site, where a redirect would still count as that site's
/// navigation and the browser would hold back the new `SameSite=Strict` session cookie.
pub(crate) fn page_moving_on(
    status: StatusCode,
    title: &str,
    header: Option<Header<'_>>,
    body: &str,
    location: &str,
) -> Response {
    let head = format!(
        r#"<meta http-equiv="refresh" content="0; url={}">
"#,
        esc(location)
    );
    page_with_head(status, title, header, body, &head)
}

fn page_with_head(
    status: StatusCode,
    title: &str,
    header: Option<Header<'_>>,
    body: &str,
    head: &str,
) -> Response {
    let nav = match header {
        Some(h) => format!(
            r#"<nav aria-label="Console"><a href="/ui">Records</a> <a href="/ui/charts">Charts</a>
<span class="who">Signed in as {}</span>
<form method="post" action="/ui/logout" class="inline"><input type="hidden" name="csrf" value="{}"><button type="submit">Sign out</button></form></nav>"#,
            esc(&h.who),
            esc(h.csrf)
        ),
        None => String::new(),
    };
    let html = format!(
        r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · idemgate console</title>
<link rel="icon" type="image/svg+xml" href="/ui/assets/favicon.svg">
<link rel="stylesheet" href="/ui/assets/console.css">
<script src="/ui/assets/console.js" defer></script>
{head}</head>
<body>
<header><p class="brand">idemgate console</p>{nav}</header>
<main>
<h1>{title}</h1>
{body}
</main>
</body>
</html>
"#,
        title = esc(title),
    );
    with_headers(status, "text/html; charset=utf-8", html.into_bytes())
}

/// An answer with the console's security headers.
pub(crate) fn with_headers(
    status: StatusCode,
    content_type: &'static str,
    body: Vec<u8>,
) -> Response {
    let mut res = (status, body).into_response();
    let h = res.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    secure(h);
    res
}

/// The security headers every console answer carries.
pub(crate) fn secure(h: &mut axum::http::HeaderMap) {
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
}

/// A 303 to `location` (after a form: the browser then GETs it).
pub(crate) fn see_other(location: &str) -> Response {
    let mut res = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(location) {
        res.headers_mut().insert(header::LOCATION, v);
    }
    secure(res.headers_mut());
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_and_values_encoded() {
        assert_eq!(
            esc(r#"<a href="x">'&'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
        assert_eq!(enc("a b/c&d=é"), "a%20b%2Fc%26d%3D%C3%A9");
        assert_eq!(query(&[("a", "1"), ("b", ""), ("c", "x y")]), "a=1&c=x%20y");
    }
}
