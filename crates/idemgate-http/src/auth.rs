//! The gateway's side of bearer tokens and tenants (idemgate_kit::tenants): the extractor that
//! names a request's tenant, and its 401.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse as _, Response};
use idemgate::Verdict;
use idemgate_kit::tenants::{authenticate, AuthError, Tenant};

use crate::error::Problem;
use crate::gateway::Gateway;

/// The tenant whose token a request carried (and that passed its rate limit).
#[derive(Clone, Debug)]
pub(crate) struct Caller(pub(crate) Arc<Tenant>);

impl FromRequestParts<Gateway> for Caller {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, gw: &Gateway) -> Result<Self, Response> {
        let authorization = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let tenant = authenticate(gw.tenants(), authorization).map_err(unauthorized)?;
        tenant.admit().map_err(|after| {
            gw.metrics()
                .call(tenant.id.as_str(), "-", Verdict::RateLimited);
            Problem::of(
                Verdict::RateLimited,
                "the tenant's request rate limit is exhausted; retry after the time given",
            )
            .with_retry_after(after)
            .into_response()
        })?;
        Ok(Caller(tenant))
    }
}

/// 401 with the RFC 6750 challenge.
fn unauthorized(why: AuthError) -> Response {
    let mut problem = Problem::unauthorized();
    why.detail().clone_into(&mut problem.detail);
    let mut res = problem.into_response();
    res.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static(why.challenge()),
    );
    res
}
