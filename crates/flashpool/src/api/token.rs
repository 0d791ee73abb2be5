//! The API token: a secret the node generates, keeps in its token files
//! (mode 0600, written atomically) and compares in constant time; only its
//! id is ever logged.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result, bail};
use subtle::ConstantTimeEq;

/// A secret that opens the API. Its `id` is public (logged); the whole
/// text is the secret.
#[derive(Clone)]
pub struct Token {
    pub(super) id: String,
    text: String,
}

impl Token {
    /// A new token: `<id>.<secret>`, an 8-hex-digit id and 256 random bits.
    pub fn generate() -> Result<Token> {
        let mut b = [0u8; 36];
        getrandom::fill(&mut b).map_err(|e| anyhow::anyhow!("no randomness for a token: {e}"))?;
        let hex = |s: &[u8]| s.iter().map(|x| format!("{x:02x}")).collect::<String>();
        let id = hex(&b[..4]);
        Ok(Token {
            text: format!("{id}.{}", hex(&b[4..])),
            id,
        })
    }

    /// A token as written in a file (the part before a `.` is its id).
    pub fn parse(text: &str, from: &Path) -> Result<Token> {
        let text = text.trim();
        if text.len() < 32 || text.len() > 512 || !text.bytes().all(|c| c.is_ascii_graphic()) {
            bail!(
                "{}: not an API token (32 to 512 printable characters, no spaces); \
                 delete it and the node writes a new one at its next start",
                from.display()
            );
        }
        let id = match text.split_once('.') {
            Some((id, _)) if id.len() <= 16 => id.to_string(),
            _ => "-".to_string(),
        };
        Ok(Token {
            id,
            text: text.into(),
        })
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn secret(&self) -> &str {
        &self.text
    }

    pub(super) fn matches(&self, presented: &[u8]) -> bool {
        // The length is not secret; the content is compared in constant time.
        self.text.len() == presented.len() && bool::from(self.text.as_bytes().ct_eq(presented))
    }
}

/// Makes `dir` (mode 0700) or checks that the existing one is ours and
/// that no one else may write in it.
pub(super) fn private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    match std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
    {
        Ok(()) => {}
        Err(e) => return Err(e).with_context(|| format!("cannot make {}", dir.display())),
    }
    let m = std::fs::symlink_metadata(dir)?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    if !m.is_dir() || m.uid() != uid || m.mode() & 0o022 != 0 {
        bail!(
            "{} is not a directory owned by uid {uid} that only it may write to; \
             remove it, or set [api] token_file",
            dir.display()
        );
    }
    Ok(())
}

/// Writes `text` to `path` with mode 0600, atomically (a temporary file
/// renamed over it), so that a reader sees the old token or the new one.
pub fn write_secret_file(path: &Path, text: &str) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let r = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(format!("{text}\n").as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r.with_context(|| format!("cannot write the API token to {}", path.display()))
}

/// Reads a token file that only its owner may read.
pub fn read_secret_file(path: &Path) -> Result<Token> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).with_context(|| format!("{}", path.display()))?;
    if m.mode() & 0o077 != 0 {
        bail!(
            "{}: mode {:o} lets others read the API token; chmod 600 it (and rotate the token: it may be known)",
            path.display(),
            m.mode() & 0o777
        );
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    Token::parse(&text, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_has_an_id_and_256_bits() {
        let t = Token::generate().unwrap();
        assert_eq!(t.id().len(), 8);
        assert_eq!(t.secret().len(), 8 + 1 + 64);
        assert!(t.matches(t.secret().as_bytes()));
        assert!(!t.matches(Token::generate().unwrap().secret().as_bytes()));
        assert!(!t.matches(&t.secret().as_bytes()[1..]));
    }
}
