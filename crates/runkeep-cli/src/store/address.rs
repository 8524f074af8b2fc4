//! Store addresses: parsing `--store`, printing it without secrets, and
//! the flags that adjust it (`--pg-schema`, `--token`).

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use super::secrets::{percent_decode, redact_url, register_secrets};
use crate::error::{CliError, CliResult};

/// Where the runs live (`--store` / `RUNKEEP_STORE`).
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum StoreAddress {
    /// `fs:PATH`: one session's `runs/` directory.
    Fs(PathBuf),
    /// `root:PATH`: a root of many tenants, projects and sessions.
    Root(PathBuf),
    /// `memory:`: an empty in-process store (demos, doctor self-test).
    Memory,
    /// `postgres://…` or `postgresql://…`: the PostgreSQL backend.
    Postgres(PgAddress),
    /// `http://HOST:PORT` or `https://…`: a `runkeep serve` API, through
    /// [`runkeep_http::client::HttpStore`]; its bearer token comes from
    /// `--token` / `RUNKEEP_TOKEN` (never from the URL, never printed).
    Http(HttpAddress),
}

/// A `runkeep serve` address: the base URL and the bearer token to send
/// (`--token` / `RUNKEEP_TOKEN`, attached by [`with_token`]). The token is
/// secret: `Display` shows the URL only, `Debug` never the token, and
/// every printed line passes through [`redact`](super::redact).
#[derive(Clone, PartialEq, Eq)]
pub struct HttpAddress {
    url: String,
    token: Option<String>,
}

impl fmt::Debug for HttpAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "HttpAddress({}, token {})",
            self.url,
            if self.token.is_some() { "set" } else { "unset" }
        )
    }
}

impl HttpAddress {
    /// `http://HOST:PORT` without a trailing `/`, or several servers in
    /// front of one store separated by commas
    /// (`http://HOST:PORT,http://HOST2:PORT2`: requests fail over from one
    /// to the next, [`runkeep_http::client::HttpStore::with_servers`]). A
    /// URL carrying user information (`http://user:secret@…`) is refused:
    /// the token goes in `RUNKEEP_TOKEN` or `--token`.
    fn parse(s: &str) -> Result<Self, String> {
        let mut urls = Vec::new();
        for one in s.split(',') {
            if !(one.starts_with("http://") || one.starts_with("https://")) {
                return Err(format!(
                    "{one:?} is not an http:// or https:// URL: several servers are given as http://HOST:PORT,http://HOST2:PORT2"
                ));
            }
            urls.push(Self::parse_one(one)?);
        }
        Ok(Self {
            url: urls.join(","),
            token: None,
        })
    }

    /// One server's URL, without a trailing `/`.
    fn parse_one(s: &str) -> Result<String, String> {
        let rest = s.split_once("://").map_or(s, |(_, r)| r);
        let authority = rest.split('/').next().unwrap_or("");
        if let Some(at) = authority.rfind('@') {
            // clap quotes the refused value: register the credentials so
            // the error line redacts them.
            let userinfo = &authority[..at];
            let mut secrets = vec![userinfo.to_string(), percent_decode(userinfo)];
            if let Some((_, password)) = userinfo.split_once(':') {
                secrets.push(password.to_string());
                secrets.push(percent_decode(password));
            }
            secrets.retain(|s| !s.is_empty());
            register_secrets(secrets);
            return Err(
                "an http:// store address carries no credentials; pass the token in RUNKEEP_TOKEN or --token".into(),
            );
        }
        if authority.is_empty() {
            return Err("`http://` needs a host and port, e.g. http://127.0.0.1:7420".into());
        }
        Ok(s.trim_end_matches('/').to_string())
    }

    /// The base URL (not secret): several servers' separated by commas.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Each server's base URL, in the order given.
    pub fn urls(&self) -> Vec<String> {
        self.url.split(',').map(str::to_string).collect()
    }

    /// The token, when one was given (secret: hand it to a child process in
    /// its environment, never on its command line).
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// The same server with `token`.
    pub fn with_token(&self, token: &str) -> Self {
        register_secrets(vec![token.to_string()]);
        Self {
            url: self.url.clone(),
            token: Some(token.to_string()),
        }
    }
}

/// Attaches `--token` / `RUNKEEP_TOKEN` to an `http://` address (other
/// stores take no token: a `RUNKEEP_TOKEN` left in the environment does not
/// change what they open).
pub fn with_token(address: &StoreAddress, token: Option<&str>) -> StoreAddress {
    match (address, token) {
        (StoreAddress::Http(h), Some(t)) if !t.is_empty() => StoreAddress::Http(h.with_token(t)),
        _ => address.clone(),
    }
}

/// A PostgreSQL address: the connection URL (it may carry a password, so
/// it is never printed: `Display` redacts it) and the schema named by its
/// `schema=` query parameter, if any (removed from the URL the driver sees).
#[derive(Clone, PartialEq, Eq)]
pub struct PgAddress {
    /// The URL as given (secret: only the driver and child processes'
    /// environment see it).
    original: String,
    /// The URL without `schema=`, for the driver.
    url: String,
    /// `?schema=NAME`, when given.
    schema: Option<String>,
}

impl fmt::Debug for PgAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PgAddress({})", redact_url(&self.original))
    }
}

/// The schema a PostgreSQL store uses when neither `?schema=` nor
/// `--pg-schema` names one.
pub const DEFAULT_PG_SCHEMA: &str = "runkeep";

impl PgAddress {
    fn parse(s: &str) -> Self {
        let (base, query) = match s.split_once('?') {
            Some((b, q)) => (b, Some(q)),
            None => (s, None),
        };
        let mut schema = None;
        let mut kept = Vec::new();
        for pair in query.into_iter().flat_map(|q| q.split('&')) {
            match pair.split_once('=') {
                Some(("schema", v)) => schema = Some(percent_decode(v)),
                _ if pair.is_empty() => {}
                _ => kept.push(pair),
            }
        }
        let url = if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        let address = Self {
            original: s.to_string(),
            url,
            schema,
        };
        register_secrets(address.secrets());
        address
    }

    /// The URL the driver connects with (secret).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The URL exactly as given (secret), to hand to a child process in its
    /// environment (never on its command line, which `ps` shows).
    pub fn original(&self) -> &str {
        &self.original
    }

    /// The schema `?schema=` names.
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// The same server and database with another `schema=` (the soak's
    /// fresh schema).
    pub fn with_schema(&self, schema: &str) -> Self {
        let sep = if self.url.contains('?') { '&' } else { '?' };
        Self::parse(&format!("{}{sep}schema={schema}", self.url))
    }

    /// The same address with `application_name=NAME` unless one is set.
    pub fn with_application_name(&self, name: &str) -> Self {
        if self.url.contains("application_name=") {
            return self.clone();
        }
        let sep = if self.original.contains('?') {
            '&'
        } else {
            '?'
        };
        Self::parse(&format!("{}{sep}application_name={name}", self.original))
    }

    /// The passwords in the URL: the userinfo's and `password=`'s, as
    /// written and percent-decoded.
    fn secrets(&self) -> Vec<String> {
        let mut out = Vec::new();
        let (base, query) = match self.original.split_once('?') {
            Some((b, q)) => (b, Some(q)),
            None => (self.original.as_str(), None),
        };
        if let Some((_, rest)) = base.split_once("://") {
            if let Some(at) = rest.rfind('@') {
                if let Some((_, password)) = rest[..at].split_once(':') {
                    out.push(password.to_string());
                }
            }
        }
        for pair in query.into_iter().flat_map(|q| q.split('&')) {
            if let Some(("password", v)) = pair.split_once('=') {
                out.push(v.to_string());
            }
        }
        let decoded: Vec<String> = out.iter().map(|s| percent_decode(s)).collect();
        out.extend(decoded);
        out.retain(|s| !s.is_empty());
        out
    }
}

impl FromStr for StoreAddress {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "memory:" || s == "memory" {
            return Ok(StoreAddress::Memory);
        }
        if let Some(path) = s.strip_prefix("fs:") {
            if path.is_empty() {
                return Err(
                    "`fs:` needs one session's runs/ directory, e.g. fs:./session/runs".into(),
                );
            }
            return Ok(StoreAddress::Fs(PathBuf::from(path)));
        }
        if let Some(path) = s.strip_prefix("root:") {
            if path.is_empty() {
                return Err("`root:` needs a directory, e.g. root:./runkeep-data".into());
            }
            return Ok(StoreAddress::Root(PathBuf::from(path)));
        }
        if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            return Ok(StoreAddress::Postgres(PgAddress::parse(s)));
        }
        if s.starts_with("http://") || s.starts_with("https://") {
            return HttpAddress::parse(s).map(StoreAddress::Http);
        }
        // Never echo what might be a connection string with a password
        // (clap quotes the value it refused: register its password so the
        // error line redacts it).
        if s.contains("://") {
            register_secrets(
                PgAddress {
                    original: s.to_string(),
                    url: String::new(),
                    schema: None,
                }
                .secrets(),
            );
        }
        let shown = if s.contains('@') || s.contains("password") {
            "the given address".to_string()
        } else {
            format!("{s:?}")
        };
        Err(format!(
            "{shown} is not a store address; use root:PATH, fs:PATH, memory:, postgres://… or http://HOST:PORT{}",
            if shown.starts_with('"') {
                format!(" (did you mean root:{s}, or fs:{s} for one session's runs/ directory?)")
            } else {
                String::new()
            }
        ))
    }
}

impl fmt::Display for StoreAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreAddress::Fs(p) => write!(f, "fs:{}", p.display()),
            StoreAddress::Root(p) => write!(f, "root:{}", p.display()),
            StoreAddress::Memory => f.write_str("memory:"),
            // Never print a password.
            StoreAddress::Postgres(pg) => f.write_str(&redact_url(&pg.original)),
            // The URL only: the token is never part of it.
            StoreAddress::Http(h) => f.write_str(&h.url),
        }
    }
}

impl StoreAddress {
    /// The directory of a directory store (`fs:` or `root:`).
    pub fn directory(&self) -> Option<&Path> {
        match self {
            StoreAddress::Fs(p) | StoreAddress::Root(p) => Some(p),
            _ => None,
        }
    }
}

/// Applies `--pg-schema` to a PostgreSQL address. Refused (exit 64): a
/// schema for another backend, or one that contradicts the URL's
/// `?schema=`.
pub fn with_pg_schema(address: &StoreAddress, schema: Option<&str>) -> CliResult<StoreAddress> {
    let Some(schema) = schema else {
        return Ok(address.clone());
    };
    match address {
        StoreAddress::Postgres(pg) => match pg.schema() {
            Some(s) if s != schema => Err(CliError::usage(format!(
                "--pg-schema {schema} contradicts the store URL's schema={s}"
            ))
            .hint("name the schema once: in the URL (?schema=NAME) or with --pg-schema")),
            Some(_) => Ok(address.clone()),
            None => Ok(StoreAddress::Postgres(pg.with_schema(schema))),
        },
        other => Err(CliError::usage(format!(
            "--pg-schema {schema} applies to a postgres:// store, not {other}"
        ))
        .hint("drop --pg-schema (or RUNKEEP_PG_SCHEMA), or pass --store postgres://…")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::secrets::redact;

    #[test]
    fn addresses_parse_and_passwords_never_print() {
        assert_eq!(
            "memory:".parse::<StoreAddress>().unwrap(),
            StoreAddress::Memory
        );
        assert_eq!(
            "fs:/tmp/x".parse::<StoreAddress>().unwrap(),
            StoreAddress::Fs(PathBuf::from("/tmp/x"))
        );
        assert!("fs:".parse::<StoreAddress>().is_err());
        assert_eq!(
            "root:/tmp/x".parse::<StoreAddress>().unwrap(),
            StoreAddress::Root(PathBuf::from("/tmp/x"))
        );
        assert_eq!(
            StoreAddress::Root(PathBuf::from("/tmp/x")).to_string(),
            "root:/tmp/x"
        );
        assert!("root:".parse::<StoreAddress>().is_err());
        let e = "./data".parse::<StoreAddress>().unwrap_err();
        assert!(e.contains("did you mean root:./data"), "{e}");
        assert!(e.contains("fs:./data"), "{e}");
        let pg: StoreAddress = "postgres://u:secret@db:5432/test".parse().unwrap();
        assert_eq!(pg.to_string(), "postgres://…@db:5432/test");
    }

    #[test]
    fn http_addresses_show_the_url_only_and_refuse_credentials() {
        let a: StoreAddress = "http://127.0.0.1:7420/".parse().unwrap();
        let a = with_token(&a, Some("rk_abc_0123456789sekrit"));
        assert_eq!(a.to_string(), "http://127.0.0.1:7420");
        assert!(!format!("{a:?}").contains("sekrit"), "{a:?}");
        let StoreAddress::Http(h) = &a else {
            panic!("not http: {a:?}")
        };
        assert_eq!(h.token(), Some("rk_abc_0123456789sekrit"));
        // Every printed line redacts the token once it was met.
        assert_eq!(redact("token rk_abc_0123456789sekrit here"), "token … here");
        // Other stores take no token.
        let root = with_token(&StoreAddress::Memory, Some("rk_x"));
        assert_eq!(root, StoreAddress::Memory);

        let e = "http://alice:pa55word@h:1"
            .parse::<StoreAddress>()
            .unwrap_err();
        assert!(e.contains("RUNKEEP_TOKEN"), "{e}");
        assert!(!e.contains("pa55word"), "{e}");
        // clap quotes the refused value: its credentials are redacted.
        assert!(!redact("'http://alice:pa55word@h:1'").contains("pa55word"));
        assert!("http://".parse::<StoreAddress>().is_err());
    }

    #[test]
    fn several_servers_are_one_http_address_separated_by_commas() {
        let a: StoreAddress = "http://127.0.0.1:1/,http://127.0.0.1:2".parse().unwrap();
        assert_eq!(a.to_string(), "http://127.0.0.1:1,http://127.0.0.1:2");
        let StoreAddress::Http(h) = &a else {
            panic!("not http: {a:?}")
        };
        assert_eq!(h.urls(), ["http://127.0.0.1:1", "http://127.0.0.1:2"]);
        let e = "http://127.0.0.1:1,127.0.0.1:2"
            .parse::<StoreAddress>()
            .unwrap_err();
        assert!(e.contains("http://HOST:PORT,http://HOST2:PORT2"), "{e}");
        let e = "http://h:1,http://bob:pa55@h:2"
            .parse::<StoreAddress>()
            .unwrap_err();
        assert!(e.contains("RUNKEEP_TOKEN"), "{e}");
        assert!(!e.contains("pa55"), "{e}");
    }
}
