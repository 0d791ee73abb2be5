//! `flashpool drive ...`: list drives, fail, replace and re-add them, and
//! export them to other nodes.

use anyhow::Result;

use super::ApiArgs;
use crate::api_types::{DriveInfo, ExportDriveRequest, FailRequest, ReAddInfo, ReplaceRequest};
use crate::output::outln;
use crate::units::human_bytes;

#[derive(clap::Subcommand, Debug)]
pub enum DriveCmd {
    /// All drives and what uses them.
    List,
    /// Mark a drive failed; its volume runs degraded. Refused when that
    /// would take the volume beyond its redundancy (data lost), unless --force.
    Fail {
        name: String,
        /// Fail it even if its volume then fails (the error says what is lost).
        #[arg(long)]
        force: bool,
    },
    /// Put drive WITH in the place of NAME in its volume and rebuild onto it.
    Replace {
        name: String,
        #[arg(long)]
        with: String,
    },
    /// Serve a drive to other nodes (JBOF mode) as nqn.2026-01.io.flashpool:drive:NODE:NAME.
    Export {
        name: String,
        /// Host NQNs allowed to connect, comma separated (default: the [[peer]]s').
        #[arg(long, value_delimiter = ',')]
        hosts: Vec<String>,
    },
    /// Stop serving a drive to other nodes; their connections end.
    Unexport { name: String },
    /// Put a failed drive back: into its volume (resyncing only what it missed, or
    /// rebuilding it in full when that is unknown), or, in no volume, back to free.
    ReAdd { name: String },
}

/// `flashpool drive ...`.
pub fn drive(api: ApiArgs, cmd: DriveCmd) -> Result<()> {
    let c = api.client()?;
    let seg = crate::client::segment;
    let (a, list) = match cmd {
        DriveCmd::List => (c.get("/drives")?, true),
        DriveCmd::Fail { name, force } => (
            c.post(
                &format!("/drives/{}/fail", seg(&name)),
                force.then_some(&FailRequest { force: true }),
            )?,
            false,
        ),
        DriveCmd::Export { name, hosts } => (
            c.post(
                &format!("/drives/{}/export", seg(&name)),
                Some(&ExportDriveRequest { hosts }),
            )?,
            false,
        ),
        DriveCmd::Unexport { name } => {
            (c.delete(&format!("/drives/{}/export", seg(&name)))?, false)
        }
        DriveCmd::ReAdd { name } => {
            let a = c.post::<()>(&format!("/drives/{}/re-add", seg(&name)), None)?;
            if api.json {
                api.print_json(a.json())?;
            } else {
                let r: ReAddInfo = a.parse()?;
                outln!("{}", r.message);
            }
            return Ok(());
        }
        DriveCmd::Replace { name, with } => {
            let a = c.post(
                &format!("/drives/{}/replace", seg(&name)),
                Some(&ReplaceRequest { with }),
            )?;
            if api.json {
                api.print_json(a.json())?;
            } else {
                super::volume::print_volume(&a.parse()?);
            }
            return Ok(());
        }
    };
    if api.json {
        return api.print_json(a.json());
    }
    let rows: Vec<DriveInfo> = if list { a.parse()? } else { vec![a.parse()?] };
    outln!(
        "{:<12} {:<7} {:>10} {:<8} {:<12} device",
        "DRIVE",
        "BACKEND",
        "SIZE",
        "STATE",
        "VOLUME"
    );
    let note = |d: &DriveInfo| -> String {
        let mut s = String::new();
        if let Some(x) = &d.export {
            s += &format!(" [exported as {}]", x.nqn);
        }
        if let Some(l) = &d.link {
            s += &format!(" [link {l}]");
        }
        s
    };
    for d in &rows {
        let user = match (&d.volume, d.position) {
            (Some(v), Some(p)) => format!("{v}[{p}]"),
            _ => "-".into(),
        };
        outln!(
            "{:<12} {:<7} {:>10} {:<8} {:<12} {}{}",
            d.name,
            d.backend,
            human_bytes(d.size_bytes),
            d.state,
            user,
            d.device,
            note(d)
        );
    }
    Ok(())
}
