//! Keeping the secrets of store addresses (PostgreSQL passwords, bearer
//! tokens) out of every printed line: each one parsed is remembered, and
//! [`redact`] replaces it wherever it shows up. This is the one
//! process-wide registry of the store module, on purpose: an error from any
//! depth may quote a connection string.

pub(super) fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// `scheme://…@host…` with every `password=` value replaced by `…`: the
/// only form of a PostgreSQL URL this binary prints.
pub(super) fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "postgres://…".into();
    };
    // Everything up to the last `@` is user information (over-redacting a
    // query value holding `@` is safe; printing a password is not).
    let rest = match rest.rfind('@') {
        Some(at) => format!("…@{}", &rest[at + 1..]),
        None => rest.to_string(),
    };
    let rest = match rest.split_once('?') {
        Some((base, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((k, _)) if k == "password" => format!("{k}=…"),
                    _ => pair.to_string(),
                })
                .collect();
            format!("{base}?{}", query.join("&"))
        }
        None => rest,
    };
    format!("{scheme}://{rest}")
}

/// Every password met in a `--store` URL of this process.
static SECRETS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

pub(super) fn register_secrets(secrets: Vec<String>) {
    let mut all = SECRETS.lock().unwrap_or_else(|p| p.into_inner());
    for s in secrets {
        if !all.contains(&s) {
            all.push(s);
        }
    }
    // Longest first, so a secret containing another is replaced whole.
    all.sort_by_key(|s| std::cmp::Reverse(s.len()));
}

/// `text` with every password of a store URL this process parsed replaced
/// by `…`: the last line of defence of every error and report line (a
/// driver message quoting its connection string would otherwise print it).
pub fn redact(text: &str) -> String {
    let all = SECRETS.lock().unwrap_or_else(|p| p.into_inner());
    let mut out = text.to_string();
    for s in all.iter() {
        if out.contains(s.as_str()) {
            out = out.replace(s.as_str(), "…");
        }
    }
    out
}
