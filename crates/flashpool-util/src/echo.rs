//! User input echoed in error messages, cut to a readable length: a 1.5 MB
//! name sent to the API must not come back whole in the error.

use std::fmt;

/// Characters of the input an error message shows.
pub const SHOWN_CHARS: usize = 64;

/// Displays a string as `{:?}` does, but only its first [`SHOWN_CHARS`]
/// characters when it is longer, followed by `… (N bytes)`.
pub struct Echo<'a>(pub &'a str);

impl fmt::Display for Echo<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0;
        match s.char_indices().nth(SHOWN_CHARS) {
            None => write!(f, "{s:?}"),
            Some((cut, _)) => write!(f, "{:?}… ({} bytes)", &s[..cut], s.len()),
        }
    }
}

/// Characters of a whole error message the API sends back at most.
pub const MAX_MESSAGE_CHARS: usize = 4096;

/// A message cut to [`MAX_MESSAGE_CHARS`]: the backstop for input that
/// reaches a message through a path [`Echo`] does not guard (a parser's
/// own error quoting the value, a list of names).
pub fn bounded(msg: String) -> String {
    match msg.char_indices().nth(MAX_MESSAGE_CHARS) {
        None => msg,
        Some((cut, _)) => format!("{}… (message cut; {} bytes)", &msg[..cut], msg.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_are_bounded() {
        assert_eq!(bounded("short".into()), "short");
        let m = bounded("m".repeat(1 << 20));
        assert!(m.len() < MAX_MESSAGE_CHARS + 50, "{}", m.len());
        assert!(
            m.ends_with("… (message cut; 1048576 bytes)"),
            "{}",
            &m[m.len() - 60..]
        );
    }

    #[test]
    fn short_input_is_quoted_whole() {
        assert_eq!(Echo("d0").to_string(), "\"d0\"");
        assert_eq!(Echo("a\"b").to_string(), "\"a\\\"b\"");
        let exactly = "x".repeat(SHOWN_CHARS);
        assert_eq!(Echo(&exactly).to_string(), format!("\"{exactly}\""));
    }

    #[test]
    fn long_input_is_cut_and_its_length_given() {
        let big = "n".repeat(1_500_000);
        let e = Echo(&big).to_string();
        assert_eq!(
            e,
            format!("\"{}\"… (1500000 bytes)", "n".repeat(SHOWN_CHARS))
        );
        // Cut on a character boundary.
        let wide = "é".repeat(100);
        assert_eq!(
            Echo(&wide).to_string(),
            format!("\"{}\"… (200 bytes)", "é".repeat(SHOWN_CHARS))
        );
    }
}
