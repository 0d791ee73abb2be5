//! The standard output of the CLI and the bench. `println!` panics when
//! stdout is a closed pipe (`flashpool drive list | head -1`); every line
//! they print goes through [`out!`]/[`outln!`] here instead.
//!
//! When the reader has gone (EPIPE), the rest of the output is dropped
//! silently and the command finishes what it was doing: a bench still
//! writes its `--json` file and still fails on a verify error, a volume
//! create still answers with its own status. Any other write error (a full
//! disk) is reported once on stderr and makes the command exit 1.

use std::io::{self, Write};
use std::sync::atomic::{AtomicU8, Ordering};

/// What has happened to stdout so far.
const OPEN: u8 = 0;
const READER_GONE: u8 = 1;
const FAILED: u8 = 2;

static STDOUT: AtomicU8 = AtomicU8::new(OPEN);

/// Prints to stdout; see the module's comment for what a closed pipe does.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::output::write(format_args!($($arg)*))
    };
}

/// Prints a line to stdout; see the module's comment for what a closed pipe does.
#[macro_export]
macro_rules! outln {
    () => {
        $crate::output::write(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::output::write(format_args!("{}\n", format_args!($($arg)*)))
    };
}

// Exported at the crate root (the only way across crates); used as
// `flashpool_util::output::{out, outln}`, beside the functions they call.
pub use crate::{out, outln};

/// Writes to stdout and flushes, unless stdout is already known to be gone.
pub fn write(args: std::fmt::Arguments) {
    write_to(&mut io::stdout().lock(), &STDOUT, args);
}

/// True once the reader of stdout has gone away: nobody reads what a loop
/// would print any more, so it may stop.
pub fn reader_gone() -> bool {
    STDOUT.load(Ordering::Relaxed) != OPEN
}

/// True when writing stdout failed other than by a closed pipe (the error
/// was printed then): the command must not exit 0.
pub fn failed() -> bool {
    STDOUT.load(Ordering::Relaxed) == FAILED
}

fn write_to(w: &mut impl Write, state: &AtomicU8, args: std::fmt::Arguments) {
    if state.load(Ordering::Relaxed) != OPEN {
        return;
    }
    let Err(e) = w.write_fmt(args).and_then(|()| w.flush()) else {
        return;
    };
    if e.kind() == io::ErrorKind::BrokenPipe {
        state.store(READER_GONE, Ordering::Relaxed);
    } else {
        state.store(FAILED, Ordering::Relaxed);
        // stderr may be gone as well: nothing more to do then.
        let _ = writeln!(
            io::stderr(),
            "flashpool: error: cannot write to standard output: {e}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pipe whose reader left after `room` bytes.
    struct ClosedAfter {
        room: usize,
        got: Vec<u8>,
        kind: io::ErrorKind,
        calls: usize,
    }

    impl Write for ClosedAfter {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.calls += 1;
            if self.got.len() >= self.room {
                return Err(io::Error::from(self.kind));
            }
            let n = b.len().min(self.room - self.got.len());
            self.got.extend_from_slice(&b[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn pipe(room: usize, kind: io::ErrorKind) -> ClosedAfter {
        ClosedAfter {
            room,
            got: Vec::new(),
            kind,
            calls: 0,
        }
    }

    #[test]
    fn a_closed_pipe_drops_the_rest_quietly() {
        let state = AtomicU8::new(OPEN);
        let mut w = pipe(6, io::ErrorKind::BrokenPipe);
        write_to(&mut w, &state, format_args!("line 1\n"));
        assert_eq!(state.load(Ordering::Relaxed), READER_GONE);
        let calls = w.calls;
        for i in 2..100 {
            write_to(&mut w, &state, format_args!("line {i}\n"));
        }
        assert_eq!(w.calls, calls, "nothing is written once the reader is gone");
        assert_eq!(w.got, b"line 1");
    }

    #[test]
    fn another_write_error_is_a_failure() {
        let state = AtomicU8::new(OPEN);
        let mut w = pipe(0, io::ErrorKind::StorageFull);
        write_to(&mut w, &state, format_args!("x\n"));
        assert_eq!(state.load(Ordering::Relaxed), FAILED);
    }

    #[test]
    fn an_open_stdout_gets_everything() {
        let state = AtomicU8::new(OPEN);
        let mut w = pipe(usize::MAX, io::ErrorKind::BrokenPipe);
        write_to(&mut w, &state, format_args!("{}-{}\n", 1, 2));
        write_to(&mut w, &state, format_args!("3"));
        assert_eq!(w.got, b"1-2\n3");
        assert_eq!(state.load(Ordering::Relaxed), OPEN);
    }
}
