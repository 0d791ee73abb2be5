//! The CLI's commands on a running node: `flashpool volume|drive|job|
//! cluster|node|events|api ...`, each a thin client of the management API
//! ([`crate::client`]) that prints what it answers as a table or, with
//! `--json`, as the JSON the node sent.

pub mod cluster;
pub mod drive;
pub mod events;
pub mod job;
pub mod qos;
pub mod snapshot;
pub mod token;
pub mod volume;

use anyhow::Result;

use crate::client::{Client, Endpoint};
use crate::config::DEFAULT_API_ADDRESS;
use crate::output::outln;

#[derive(clap::Args, Debug)]
pub struct ApiArgs {
    /// Management API of the node (ADDR:PORT, or https://ADDR:PORT).
    #[arg(long, global = true, env = "FLASHPOOL_API", default_value = DEFAULT_API_ADDRESS)]
    pub(crate) api: String,
    /// The file with the API token. Default: $FLASHPOOL_TOKEN, else the file the node
    /// left for this --api address (see docs/api.md, Authentication).
    #[arg(long, global = true, env = "FLASHPOOL_TOKEN_FILE")]
    pub(crate) token_file: Option<std::path::PathBuf>,
    /// CA certificates (PEM) that an https:// --api's certificate is checked against.
    #[arg(long, global = true, env = "FLASHPOOL_CA_FILE")]
    pub(crate) ca_file: Option<std::path::PathBuf>,
    /// A client certificate chain (PEM) for an https:// --api whose node asks for one
    /// ([api] client_ca); with --client-key.
    #[arg(
        long,
        global = true,
        env = "FLASHPOOL_CLIENT_CERT",
        requires = "client_key"
    )]
    pub(crate) client_cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of --client-cert.
    #[arg(
        long,
        global = true,
        env = "FLASHPOOL_CLIENT_KEY",
        requires = "client_cert"
    )]
    pub(crate) client_key: Option<std::path::PathBuf>,
    /// Print the API's JSON answer instead of a table.
    #[arg(long, global = true)]
    pub(crate) json: bool,
}

impl ApiArgs {
    /// The node these flags name, for [`crate::client`].
    pub fn endpoint(&self) -> Endpoint {
        Endpoint {
            api: self.api.clone(),
            token_file: self.token_file.clone(),
            ca_file: self.ca_file.clone(),
            client_cert: self.client_cert.clone(),
            client_key: self.client_key.clone(),
        }
    }

    /// A client of that node.
    pub fn client(&self) -> Result<Client> {
        Client::new(&self.endpoint())
    }

    /// Prints an answer as the JSON the node sent (`--json`).
    pub fn print_json(&self, v: &serde_json::Value) -> Result<()> {
        outln!("{}", serde_json::to_string_pretty(v)?);
        Ok(())
    }
}
