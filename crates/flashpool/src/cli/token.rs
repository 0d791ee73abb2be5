//! `flashpool api rotate-token`: the management API's own calls.

use anyhow::Result;

use super::ApiArgs;
use crate::api_types::TokenRotated;
use crate::output::outln;

#[derive(clap::Subcommand, Debug)]
pub enum ApiCmd {
    /// Replace the node's API token: the node writes the new one to its token files
    /// (mode 0600) and the old one stops working at once.
    RotateToken,
}

/// `flashpool api ...`.
pub fn api(api: ApiArgs, cmd: ApiCmd) -> Result<()> {
    let c = api.client()?;
    match cmd {
        ApiCmd::RotateToken => {
            let a = c.post::<()>("/api/token/rotate", None)?;
            if api.json {
                api.print_json(a.json())?;
            } else {
                let r: TokenRotated = a.parse()?;
                let files: Vec<String> = r.files.iter().map(|f| f.display().to_string()).collect();
                outln!(
                    "API token rotated: the new one is {} (id), written to {}; the old one no longer works",
                    r.token_id,
                    if files.is_empty() {
                        "no file (the node has none; --json shows the token)".to_string()
                    } else {
                        files.join(" and ")
                    }
                );
            }
        }
    }
    Ok(())
}
