//! `http://` stores: how every command reaches `runkeep serve`.

use runkeep_http::client::{HttpStore, HttpStoreOptions};

use super::{HttpAddress, StoreOptions};
use crate::error::{CliError, CliResult};
use crate::scope::ScopeParts;

/// The options an `HttpStore` is opened with: the client's defaults, with
/// the request timeout of `options` when it sets one (`runkeep
/// soak-worker` lowers it to its lease TTL, so a server that went away is
/// an error within it, never a hang; long-polls add their own wait).
pub fn options(options: &StoreOptions) -> HttpStoreOptions {
    let mut o = HttpStoreOptions::default();
    if let Some(d) = options.http_request_timeout {
        o.request_timeout = d;
        o.connect_timeout = o.connect_timeout.min(d);
    }
    o
}

/// An `HttpStore` sending the token for `--tenant`. Nothing is sent
/// yet: a server that is down (restarting) is met by the first call as
/// `Unavailable`, which callers retry, and a token for another tenant
/// is refused by the server on the first call (403). Refused here: no
/// token (exit 78).
pub async fn open(
    address: &HttpAddress,
    scope: &ScopeParts,
    options: &StoreOptions,
) -> CliResult<HttpStore> {
    let Some(token) = address.token() else {
        return Err(CliError::config(format!(
            "store {} needs a bearer token",
            address.url()
        ))
        .hint("set RUNKEEP_TOKEN (or pass --token); create one with `runkeep token create --tenant T --role worker` where the server runs"));
    };
    Ok(
        HttpStore::with_servers(address.urls(), self::options(options))?
            .with_token(scope.tenant.clone(), token),
    )
}
