//! Every error as RFC 9457 problem details (`application/problem+json`).
//!
//! One `type` per [`runkeep::Error`] variant, plus the HTTP and auth ones
//! ([`ProblemType`]). The status fits the variant: fenced out is 409 with
//! the `presented` and `current` fences, contended and unavailable are 503
//! with `Retry-After`, invalid input is 400 naming the `field` when the
//! server knows it. Nothing leaks: a backend, I/O or corruption error is
//! answered with a generic detail (the full error goes to the log through
//! `tracing`), and the details that do carry the store's message (invalid
//! input, conflict, not found, unsupported) have anything shaped like an
//! absolute path replaced by `<path>`.
//!
//! [`ProblemType::from_uri`] and [`Problem::into_error`] map a problem back
//! to the same `runkeep::Error` variant: that is how `HttpStore` gives a
//! caller (and the conformance kit) the variant the backing store returned.

use std::time::Duration;

use http::StatusCode;
use runkeep::lease::Fence;
use runkeep::Error;
use serde::{Deserialize, Serialize};

/// The media type of a problem body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The prefix of every problem `type` URI.
pub const TYPE_PREFIX: &str = "urn:runkeep:problem:";

/// What `Retry-After` says for a contended or unavailable answer, seconds.
pub const RETRY_AFTER_SECS: u64 = 1;

macro_rules! problem_types {
    ($($(#[$doc:meta])* $variant:ident => $slug:literal, $status:expr, $title:literal;)*) => {
        /// The kinds of problem the API answers, one `type` URI each.
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
        pub enum ProblemType {
            $($(#[$doc])* $variant,)*
        }

        impl ProblemType {
            /// Every problem type.
            pub const ALL: &'static [ProblemType] = &[$(ProblemType::$variant),*];

            /// The short name (the end of the `type` URI).
            pub fn slug(self) -> &'static str {
                match self { $(ProblemType::$variant => $slug,)* }
            }

            /// The HTTP status it is answered with.
            pub fn status(self) -> StatusCode {
                match self { $(ProblemType::$variant => $status,)* }
            }

            /// The human title (the same for every occurrence).
            pub fn title(self) -> &'static str {
                match self { $(ProblemType::$variant => $title,)* }
            }
        }
    };
}

problem_types! {
    /// `runkeep::Error::NotFound`, an unknown route, and every request that
    /// addresses another tenant (answered exactly like a missing run).
    NotFound => "not-found", StatusCode::NOT_FOUND, "Not found";
    /// `runkeep::Error::InvalidInput`: nothing was changed.
    InvalidInput => "invalid-input", StatusCode::BAD_REQUEST, "Invalid input";
    /// `runkeep::Error::FencedOut`: the presented fence no longer holds the run.
    FencedOut => "fenced-out", StatusCode::CONFLICT, "Fenced out";
    /// `runkeep::Error::Cancelled`: an operator cancelled the run; the
    /// holder's write is refused for that reason. Stop the run's step.
    Cancelled => "cancelled", StatusCode::CONFLICT, "Run cancelled";
    /// `runkeep::Error::Contended`: retry later.
    Contended => "contended", StatusCode::SERVICE_UNAVAILABLE, "Contended";
    /// `runkeep::Error::Conflict`: a compare-and-set found the record changed.
    Conflict => "conflict", StatusCode::CONFLICT, "Conflict";
    /// `runkeep::Error::Unsupported`: the store refuses a capability it cannot honour.
    Unsupported => "unsupported", StatusCode::UNPROCESSABLE_ENTITY, "Unsupported";
    /// `runkeep::Error::Corrupted`: stored data could not be understood.
    Corrupted => "corrupted", StatusCode::INTERNAL_SERVER_ERROR, "Stored data is damaged";
    /// `runkeep::Error::Unavailable`: the store is unreachable; retry later.
    Unavailable => "unavailable", StatusCode::SERVICE_UNAVAILABLE, "Store unavailable";
    /// `runkeep::Error::Backend`: any other store failure.
    Backend => "backend", StatusCode::INTERNAL_SERVER_ERROR, "Store failure";
    /// No or an unknown bearer token.
    Unauthorized => "unauthorized", StatusCode::UNAUTHORIZED, "Unauthorized";
    /// The token's role does not allow the operation.
    Forbidden => "forbidden", StatusCode::FORBIDDEN, "Forbidden";
    /// The body is not JSON, or not the JSON the route takes.
    MalformedBody => "malformed-body", StatusCode::BAD_REQUEST, "Malformed request body";
    /// The body is not declared `application/json`.
    UnsupportedMediaType => "unsupported-media-type", StatusCode::UNSUPPORTED_MEDIA_TYPE, "Unsupported media type";
    /// The body is larger than the server accepts.
    PayloadTooLarge => "payload-too-large", StatusCode::PAYLOAD_TOO_LARGE, "Payload too large";
    /// The route exists but not with this method.
    MethodNotAllowed => "method-not-allowed", StatusCode::METHOD_NOT_ALLOWED, "Method not allowed";
    /// The request took longer than the server allows.
    Timeout => "timeout", StatusCode::REQUEST_TIMEOUT, "Request timeout";
    /// The server is at its concurrency limit or shutting down.
    Overloaded => "overloaded", StatusCode::SERVICE_UNAVAILABLE, "Server overloaded";
}

impl ProblemType {
    /// The `type` URI.
    pub fn uri(self) -> String {
        format!("{TYPE_PREFIX}{}", self.slug())
    }

    /// The problem type of a `type` URI, if it is one of runkeep's.
    pub fn from_uri(uri: &str) -> Option<Self> {
        let slug = uri.strip_prefix(TYPE_PREFIX)?;
        Self::ALL.iter().copied().find(|t| t.slug() == slug)
    }

    /// The problem type of a store error.
    pub fn of(error: &Error) -> Self {
        match error {
            Error::NotFound { .. } => ProblemType::NotFound,
            Error::InvalidInput { .. } => ProblemType::InvalidInput,
            Error::FencedOut { .. } => ProblemType::FencedOut,
            Error::NotYourHolding { .. } => ProblemType::Forbidden,
            Error::Cancelled { .. } => ProblemType::Cancelled,
            Error::Contended { .. } => ProblemType::Contended,
            Error::Conflict { .. } => ProblemType::Conflict,
            Error::Unsupported { .. } => ProblemType::Unsupported,
            Error::Corrupted { .. } => ProblemType::Corrupted,
            Error::Unavailable { .. } => ProblemType::Unavailable,
            Error::Backend { .. } => ProblemType::Backend,
            // `Error` is non-exhaustive: a new variant is a store failure
            // until it gets its own type.
            _ => ProblemType::Backend,
        }
    }
}

/// An RFC 9457 problem, with runkeep's extension members: the
/// [`ProblemDetails`] it carries, boxed, so that every `Result<_, Problem>`
/// the parsers and handlers return is a pointer wide (the details are
/// some 250 bytes). It reads and writes as its details (`Deref`), and
/// travels as them (`serde(transparent)`; the document's `Problem`).
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Problem(Box<ProblemDetails>);

impl std::ops::Deref for Problem {
    type Target = ProblemDetails;
    fn deref(&self) -> &ProblemDetails {
        &self.0
    }
}

impl std::ops::DerefMut for Problem {
    fn deref_mut(&mut self) -> &mut ProblemDetails {
        &mut self.0
    }
}

impl Problem {
    /// The details, unboxed.
    pub fn into_details(self) -> ProblemDetails {
        *self.0
    }
}

impl From<ProblemDetails> for Problem {
    fn from(details: ProblemDetails) -> Self {
        Self(Box::new(details))
    }
}

impl utoipa::PartialSchema for Problem {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        <ProblemDetails as utoipa::PartialSchema>::schema()
    }
}

impl utoipa::ToSchema for Problem {
    fn name() -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed("Problem")
    }
}

/// The members of a [`Problem`].
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(description = "An RFC 9457 problem, with runkeep's extension members.")]
pub struct ProblemDetails {
    /// `urn:runkeep:problem:<slug>`, one per kind ([`ProblemType`]).
    #[serde(rename = "type")]
    pub problem_type: String,
    /// The kind's title.
    pub title: String,
    /// The HTTP status, repeated.
    #[schema(minimum = 100, maximum = 599)]
    pub status: u16,
    /// What happened, for a person. Never a path, SQL or a secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The request path the problem answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// The input field at fault (`invalid-input`, `malformed-body`): a path
    /// segment (`run`), a query parameter (`limit`) or a body path
    /// (`step.events[0].type`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The run the problem is about (`fenced-out`, `contended`, and
    /// `forbidden` for another principal's holding).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// The refused operation (`fenced-out`; `forbidden` for another
    /// principal's holding).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    /// The fence the caller presented (`fenced-out`; `forbidden` for
    /// another principal's holding, absent for an unfenced write).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 999_999_999_999_999_i64)]
    pub presented: Option<u64>,
    /// The run's current fence (`fenced-out`; `forbidden`: the fence of
    /// the holding that is another principal's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 999_999_999_999_999_i64)]
    pub current: Option<u64>,
    /// Claim attempts lost (`contended`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(format = Int64, minimum = 0, maximum = 4_294_967_295_i64)]
    pub attempts: Option<u32>,
    /// The write may or may not have been stored (`unavailable`): read back
    /// before repeating it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub outcome_unknown: bool,
    /// For a park answered twice (`conflict`): the first answer, as stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_answer: Option<serde_json::Value>,
    /// When the first answer was recorded (`conflict` on a park).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub resolved_at: Option<i64>,
    /// The role the operation needs (`forbidden`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required_role: Option<String>,
    /// The operator's reason (`cancelled`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Problem {
    /// A problem of `kind` with a detail.
    pub fn new(kind: ProblemType, detail: impl Into<String>) -> Self {
        Self::from(ProblemDetails {
            problem_type: kind.uri(),
            title: kind.title().to_string(),
            status: kind.status().as_u16(),
            detail: Some(detail.into()),
            instance: None,
            field: None,
            run: None,
            operation: None,
            presented: None,
            current: None,
            attempts: None,
            outcome_unknown: false,
            first_answer: None,
            resolved_at: None,
            required_role: None,
            reason: None,
        })
    }

    /// `invalid-input` naming `field`.
    pub fn invalid(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(ProblemType::InvalidInput, detail).with_field(field)
    }

    /// The answer for a run that does not exist, and for every request that
    /// addresses another tenant: the same body, so the two cannot be told
    /// apart.
    pub fn no_such_run() -> Self {
        Self::new(
            ProblemType::NotFound,
            "nothing exists at this address for this token",
        )
    }

    /// With the input field at fault.
    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    /// With the request path.
    pub fn with_instance(mut self, path: impl Into<String>) -> Self {
        self.instance = Some(path.into());
        self
    }

    /// Its kind, when the `type` is one of runkeep's.
    pub fn kind(&self) -> Option<ProblemType> {
        ProblemType::from_uri(&self.problem_type)
    }

    /// The store error for this problem (what `HttpStore` answers):
    /// the variant its `type` names, with the members it carries.
    /// `operation` names the client's call (it is `&'static` in
    /// `Error::FencedOut`). HTTP and auth problems become `InvalidInput`
    /// (400s), `NotFound` (404), `Unsupported` (401, 403, 405, 415: the
    /// request cannot be served as made; the detail says why) or
    /// `Unavailable` (408, 503, other 5xx).
    pub fn into_error(self, operation: &'static str) -> Error {
        let detail = self.detail.clone().unwrap_or_else(|| self.title.clone());
        let run = self.run.clone().unwrap_or_default();
        let fence = |n: Option<u64>| n.and_then(|n| Fence::new(n).ok());
        match self.kind() {
            Some(ProblemType::NotFound) => Error::NotFound { what: detail },
            Some(ProblemType::InvalidInput) | Some(ProblemType::MalformedBody) => {
                Error::InvalidInput { message: detail }
            }
            Some(ProblemType::PayloadTooLarge) => Error::InvalidInput { message: detail },
            Some(ProblemType::FencedOut) => match (fence(self.presented), fence(self.current)) {
                (Some(presented), Some(current)) => Error::FencedOut {
                    run,
                    operation,
                    presented,
                    current,
                },
                _ => Error::corrupted(format!(
                    "the server answered fenced-out without its fences: {detail}"
                )),
            },
            Some(ProblemType::Cancelled) => Error::Cancelled {
                run,
                operation,
                reason: self.reason.clone(),
            },
            Some(ProblemType::Contended) => Error::Contended {
                run,
                attempts: self.attempts.unwrap_or(0),
            },
            Some(ProblemType::Conflict) => Error::Conflict { message: detail },
            Some(ProblemType::Unsupported) => Error::Unsupported { message: detail },
            Some(ProblemType::Corrupted) => Error::Corrupted { message: detail },
            Some(ProblemType::Unavailable) if self.outcome_unknown => Error::outcome_unknown(
                detail,
                std::io::Error::other("the server's store lost the acknowledgement"),
            ),
            Some(ProblemType::Unavailable)
            | Some(ProblemType::Timeout)
            | Some(ProblemType::Overloaded) => Error::Unavailable {
                message: detail,
                source: None,
                outcome_unknown: false,
            },
            Some(ProblemType::Backend) => Error::Backend {
                message: detail,
                source: None,
            },
            // Another principal's holding (the store's refusal carries the
            // run and the holding's fence; a role refusal carries neither).
            Some(ProblemType::Forbidden) if !run.is_empty() && self.current.is_some() => {
                match fence(self.current) {
                    Some(f) => Error::NotYourHolding {
                        run,
                        operation,
                        fence: f,
                        fenced: self.presented.is_some(),
                    },
                    None => Error::corrupted(format!(
                        "the server answered forbidden with a fence that is not one: {detail}"
                    )),
                }
            }
            Some(ProblemType::Unauthorized)
            | Some(ProblemType::Forbidden)
            | Some(ProblemType::MethodNotAllowed)
            | Some(ProblemType::UnsupportedMediaType) => Error::Unsupported {
                message: format!("the server refused the request ({}): {detail}", self.status),
            },
            None => Error::Backend {
                message: format!(
                    "the server answered {} with a problem of unknown type {:?}: {detail}",
                    self.status, self.problem_type
                ),
                source: None,
            },
        }
    }
}

impl From<Error> for Problem {
    fn from(error: Error) -> Self {
        let kind = ProblemType::of(&error);
        let mut p = Problem::new(kind, String::new());
        p.detail = Some(match &error {
            Error::NotFound { what } => redact_paths(what),
            Error::InvalidInput { message } => redact_paths(message),
            Error::Conflict { message } => redact_paths(message),
            Error::Unsupported { message } => redact_paths(message),
            Error::FencedOut { .. }
            | Error::Contended { .. }
            | Error::NotYourHolding { .. }
            | Error::Cancelled { .. } => error.to_string(),
            Error::Corrupted { .. } => {
                tracing::error!(error = %error, "stored data could not be read");
                "stored data of this run could not be read; nothing was changed. An operator can find it with `runkeep doctor`".to_string()
            }
            Error::Unavailable { .. } => {
                tracing::warn!(error = %error, source = ?std::error::Error::source(&error), "store unavailable");
                if error.is_outcome_unknown() {
                    "outcome unknown: the store lost the acknowledgement of this write; it may or may not be stored: read it back before repeating it".to_string()
                } else {
                    "the store is temporarily unavailable; nothing was changed; retry".to_string()
                }
            }
            _ => {
                tracing::error!(error = %error, source = ?std::error::Error::source(&error), "store failure");
                "the store failed to serve this request; the server's log has the details"
                    .to_string()
            }
        });
        match error {
            Error::FencedOut {
                run,
                operation,
                presented,
                current,
            } => {
                p.run = Some(run);
                p.operation = Some(operation.to_string());
                p.presented = Some(presented.get());
                p.current = Some(current.get());
            }
            Error::NotYourHolding {
                run,
                operation,
                fence,
                fenced,
            } => {
                p.run = Some(run);
                p.operation = Some(operation.to_string());
                p.presented = fenced.then_some(fence.get());
                p.current = Some(fence.get());
            }
            Error::Contended { run, attempts } => {
                p.run = Some(run);
                p.attempts = Some(attempts);
            }
            Error::Cancelled {
                run,
                operation,
                reason,
            } => {
                p.run = Some(run);
                p.operation = Some(operation.to_string());
                p.reason = reason;
            }
            ref e @ Error::Unavailable { .. } => {
                p.outcome_unknown = e.is_outcome_unknown();
            }
            _ => {}
        }
        p
    }
}

#[cfg(feature = "into-response")]
impl axum_core::response::IntoResponse for Problem {
    fn into_response(self) -> axum_core::response::Response {
        use http::{header, HeaderValue};
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&self).unwrap_or_else(|_| b"{}".to_vec());
        let mut r = (status, body).into_response();
        let h = r.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if status == StatusCode::SERVICE_UNAVAILABLE {
            h.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
        }
        if status == StatusCode::UNAUTHORIZED {
            h.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"runkeep\""),
            );
        }
        r
    }
}

/// The `Retry-After` a 503 answer carries.
pub fn retry_after() -> Duration {
    Duration::from_secs(RETRY_AFTER_SECS)
}

/// Replaces every word that looks like an absolute filesystem path (starts
/// with `/` and has another `/` in it, or starts with `~/`) by `<path>`, so a
/// store message that names a file cannot leak it. Quotes and brackets
/// around the word are kept.
pub fn redact_paths(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for (i, word) in message.split(' ').enumerate() {
        if i > 0 {
            out.push(' ');
        }
        let start = word
            .find(|c: char| !matches!(c, '"' | '\'' | '(' | '[' | '`' | '<'))
            .unwrap_or(word.len());
        let (lead, rest) = word.split_at(start);
        let pathlike = (rest.starts_with('/') && rest[1..].contains('/'))
            || rest.starts_with("~/")
            || (rest.len() > 2 && rest.as_bytes()[1] == b':' && rest[2..].starts_with('\\'));
        if pathlike {
            let end = rest
                .rfind(|c: char| {
                    !matches!(
                        c,
                        '"' | '\'' | ')' | ']' | '`' | '>' | ',' | ';' | ':' | '.'
                    )
                })
                .map(|i| i + 1)
                .unwrap_or(rest.len());
            out.push_str(lead);
            out.push_str("<path>");
            out.push_str(&rest[end..]);
        } else {
            out.push_str(word);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_redacted_and_other_words_kept() {
        assert_eq!(
            redact_paths("this store is bound to t/p/s (directory /var/lib/runkeep/runs), but"),
            "this store is bound to t/p/s (directory <path>), but"
        );
        assert_eq!(
            redact_paths("file \"/a/b.json\": bad"),
            "file \"<path>\": bad"
        );
        assert_eq!(redact_paths("see ~/x/y"), "see <path>");
        assert_eq!(
            redact_paths("run tnt/prj/ses/run_a"),
            "run tnt/prj/ses/run_a"
        );
        assert_eq!(redact_paths("a / b"), "a / b");
    }

    #[cfg(feature = "into-response")]
    #[test]
    fn retryable_answers_carry_retry_after_and_401_carries_www_authenticate() {
        use axum_core::response::IntoResponse;
        use http::header;
        let contended = Problem::from(Error::Contended {
            run: "run_a".into(),
            attempts: 8,
        })
        .into_response();
        assert_eq!(contended.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(contended.headers()[header::RETRY_AFTER], "1");
        assert_eq!(contended.headers()[header::CONTENT_TYPE], PROBLEM_JSON);
        let unavailable =
            Problem::from(Error::unavailable("db", std::io::Error::other("x"))).into_response();
        assert_eq!(unavailable.headers()[header::RETRY_AFTER], "1");
        let fenced = Problem::from(Error::FencedOut {
            run: "run_a".into(),
            operation: "finish",
            presented: Fence::new(1).unwrap(),
            current: Fence::new(2).unwrap(),
        })
        .into_response();
        assert_eq!(fenced.status(), StatusCode::CONFLICT);
        assert!(fenced.headers().get(header::RETRY_AFTER).is_none());
        let unauthorized = Problem::new(ProblemType::Unauthorized, "x").into_response();
        assert!(unauthorized
            .headers()
            .contains_key(header::WWW_AUTHENTICATE));
        let invalid = Problem::from(Error::invalid("bad")).into_response();
        assert_eq!(invalid.status(), StatusCode::BAD_REQUEST);
    }

    #[test]
    fn every_store_variant_round_trips_through_its_problem() {
        let f = |n| Fence::new(n).unwrap();
        let cases = vec![
            Error::NotFound { what: "x".into() },
            Error::invalid("bad"),
            Error::FencedOut {
                run: "run_a".into(),
                operation: "write_checkpoint",
                presented: f(1),
                current: f(3),
            },
            Error::Contended {
                run: "run_a".into(),
                attempts: 8,
            },
            Error::Conflict {
                message: "c".into(),
            },
            Error::Unsupported {
                message: "u".into(),
            },
            Error::corrupted("/secret/path damaged"),
            Error::unavailable("db", std::io::Error::other("x")),
            Error::outcome_unknown("commit", std::io::Error::other("x")),
            Error::backend("open /etc/shadow", std::io::Error::other("denied")),
        ];
        for e in cases {
            let kind = e.kind();
            let unknown = e.is_outcome_unknown();
            let p = Problem::from(e);
            let text = serde_json::to_string(&p).unwrap();
            assert!(
                !text.contains("/secret") && !text.contains("/etc"),
                "{text}"
            );
            let back: Problem = serde_json::from_str(&text).unwrap();
            let again = back.into_error("write_checkpoint");
            assert_eq!(again.kind(), kind, "{text}");
            assert_eq!(again.is_outcome_unknown(), unknown, "{text}");
            if let Error::FencedOut {
                presented, current, ..
            } = again
            {
                assert_eq!((presented.get(), current.get()), (1, 3));
            }
        }
    }
}
