//! Standard output for command results. A reader that goes away
//! (`bf4ps-ops status | head`) ends the process quietly with status 0
//! instead of a broken-pipe panic; any other write error is reported.
//!
//! Invariant: every string a command prints for people that it did not
//! write itself (read from the database, or given by an operator: collector
//! names, hostnames, egress keys, server messages) goes through `escape`,
//! so it can neither drive the terminal (ESC sequences), forge lines (CR,
//! LF) nor reorder what follows it (bidi overrides). JSON output needs no
//! such care: serde escapes every control character.

use std::borrow::Cow;
use std::io::Write;

/// Writes `args` (plus a newline when `newline`) to stdout.
pub fn write(args: std::fmt::Arguments<'_>, newline: bool) {
    let mut out = std::io::stdout().lock();
    let result = out
        .write_fmt(args)
        .and_then(|()| {
            if newline {
                out.write_all(b"\n")
            } else {
                Ok(())
            }
        })
        .and_then(|()| out.flush());
    match result {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => {
            eprintln!("error: cannot write to standard output: {e}");
            std::process::exit(1);
        }
    }
}

/// `println!` to stdout through [`write()`].
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => { $crate::output::write(format_args!($($arg)*), true) };
}

/// `print!` to stdout through [`write()`].
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => { $crate::output::write(format_args!($($arg)*), false) };
}

/// Whether `c` must not reach a terminal as it is: a control character (C0,
/// DEL, C1) or a Unicode bidi embedding, override or isolate (U+202A–U+202E,
/// U+2066–U+2069).
fn needs_escape(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` for a terminal: each character of [`needs_escape`] written visibly
/// (`\t`, `\n`, `\r`, `\x1b` for the other ASCII ones, `\u{85}` or
/// `\u{202e}` beyond), everything else as it is. Borrowed when nothing needs
/// escaping. Pads like a `str` (`{:<20}`).
pub(crate) fn escape(s: &str) -> Cow<'_, str> {
    if !s.chars().any(needs_escape) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c.is_ascii() && needs_escape(c) => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if needs_escape(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn control_characters_are_shown_not_obeyed() {
        assert!(matches!(
            escape("c1 égress-a"),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(escape("a\x1b[2Jb"), "a\\x1b[2Jb");
        assert_eq!(escape("x\r\nFAKE LINE\t."), "x\\r\\nFAKE LINE\\t.");
        assert_eq!(escape("\0\x07\x7f"), "\\x00\\x07\\x7f");
        assert_eq!(escape("\u{9b}31m\u{85}"), "\\u{9b}31m\\u{85}");
        assert_eq!(
            escape("ab\u{202e}cd\u{202a}\u{2066}\u{2069}"),
            "ab\\u{202e}cd\\u{202a}\\u{2066}\\u{2069}"
        );
        // Neighbours of the bidi ranges, and ordinary non-ASCII, are left alone.
        assert_eq!(
            escape("\u{2029}\u{202f}\u{2065}\u{206a}日本"),
            "\u{2029}\u{202f}\u{2065}\u{206a}日本"
        );
        // Escaped output has no control character left, and pads like a str.
        let s = escape("\u{1b}]0;title\u{7}");
        assert!(!s.chars().any(|c| c.is_control()));
        assert_eq!(format!("[{:<14}]", escape("\n")), "[\\n            ]");
    }
}
