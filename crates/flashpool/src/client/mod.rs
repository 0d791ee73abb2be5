//! The typed client of the management API, used by the CLI and by
//! node-to-node calls ([`PeerApi`]): the URL of `--api`, the token it sends
//! ([`token`]), its TLS ([`tls`]), and one call at a time with the API's
//! error message as the error. Answers parse into [`crate::api_types`].

mod endpoint;
mod peer;
pub mod sse;
pub mod tls;
mod token;

use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::api_types::ErrorBody;

/// Bytes a name keeps as they are in a path segment: RFC 3986's unreserved
/// ones, and `:` (drive names such as `e1:d3` stay readable).
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~')
    .remove(b':');

/// `name` as one segment of an API path. A remote drive's name may be its
/// URL (`tcp://10.0.1.21:4420/nqn...?nsid=1`), whose slashes and `?` would
/// otherwise make another path; the server decodes it back.
pub fn segment(name: &str) -> String {
    percent_encoding::utf8_percent_encode(name, SEGMENT).to_string()
}

pub use endpoint::{Endpoint, api_agent, api_base};
pub use peer::{BearerToken, PeerApi, PeerError};
#[cfg(test)]
pub use token::runtime_token_name;
pub use token::{ApiToken, runtime_token_path};

/// A client of one node's API, as the CLI calls it (one call at a time,
/// waiting as long as a call takes).
pub struct Client {
    base: String,
    agent: ureq::Agent,
    token: ApiToken,
}

/// One answer of the API: its JSON as sent (what `--json` prints), parsed
/// into the call's type where the CLI reads it.
pub struct Answer(Value);

impl Answer {
    /// The JSON as the node sent it.
    pub fn json(&self) -> &Value {
        &self.0
    }

    /// The answer as `T`; a shape this CLI does not know is an error that
    /// says so (a node of another version).
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T> {
        T::deserialize(&self.0).with_context(|| {
            format!(
                "the API's answer is not what this CLI expects ({}); is the node another version?",
                std::any::type_name::<T>()
                    .rsplit("::")
                    .next()
                    .unwrap_or("?")
            )
        })
    }
}

/// The API's message in an error answer's `text`, else the text itself.
pub fn error_message(text: &str) -> String {
    serde_json::from_str::<ErrorBody>(text).map_or_else(|_| text.to_string(), |e| e.error)
}

impl Client {
    pub fn new(api: &Endpoint) -> Result<Client> {
        let agent = api_agent(api, |b| b.timeout_global(Some(Duration::from_secs(3600))))?;
        Ok(Client {
            base: format!("{}/v1", api_base(&api.api).0),
            agent,
            token: ApiToken::find(api)?,
        })
    }

    /// `GET /v1<path>`.
    pub fn get(&self, path: &str) -> Result<Answer> {
        self.call("GET", path, None)
    }

    /// `DELETE /v1<path>`.
    pub fn delete(&self, path: &str) -> Result<Answer> {
        self.call("DELETE", path, None)
    }

    /// `POST /v1<path>` with `body` as JSON, or with no body.
    pub fn post<B: Serialize>(&self, path: &str, body: Option<&B>) -> Result<Answer> {
        let body = body
            .map(serde_json::to_string)
            .transpose()
            .context("encoding the request")?;
        self.call("POST", path, body)
    }

    /// One call; an error answer becomes an error carrying the API's message.
    fn call(&self, method: &str, path: &str, body: Option<String>) -> Result<Answer> {
        let url = format!("{}{path}", self.base);
        let t = &self.token;
        let sent = match (method, body) {
            ("GET", _) => t.apply(self.agent.get(&url)).call(),
            ("DELETE", _) => t.apply(self.agent.delete(&url)).call(),
            (_, Some(b)) => t
                .apply(self.agent.post(&url))
                .header("Content-Type", "application/json")
                .send(b),
            (_, None) => t.apply(self.agent.post(&url)).send_empty(),
        };
        let mut resp = sent.with_context(|| {
            format!(
                "cannot reach the management API at {}: is `flashpool serve` running? (set --api or FLASHPOOL_API)",
                self.base
            )
        })?;
        let status = resp.status();
        let text = resp
            .body_mut()
            .read_to_string()
            .context("reading the API's answer")?;
        let v: Value = serde_json::from_str(&text).with_context(|| {
            format!("the API answered {status} with something that is not JSON: {text}")
        })?;
        if !status.is_success() {
            bail!(
                "{}{}",
                error_message(&text),
                self.token.hint(status.as_u16())
            );
        }
        Ok(Answer(v))
    }
}
