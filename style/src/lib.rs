//! The one output look shared by the host tool and the guest agent: every table is drawn the
//! same way and fits the terminal (or `$COLUMNS`, or 120 columns when the output is not a
//! terminal), and log records print as `warning: …` / `error: …` lines, never as raw
//! tracing records with module paths.

use std::fmt;
use std::io::IsTerminal;

use comfy_table::{presets::UTF8_BORDERS_ONLY, ContentArrangement, Table};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The width used when the output is not a terminal and `$COLUMNS` is not set.
pub const DEFAULT_WIDTH: u16 = 120;

/// The width tables wrap to when stdout is not a terminal: `$COLUMNS`, else 120.
fn width_without_terminal() -> u16 {
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.trim().parse::<u16>().ok())
        .filter(|w| *w >= 40)
        .unwrap_or(DEFAULT_WIDTH)
}

/// A table in the project's look, with `header`, wrapping its cells to fit the width.
pub fn table<T: Into<comfy_table::Row>>(header: T) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(header);
    if !std::io::stdout().is_terminal() {
        t.set_width(width_without_terminal());
    }
    t
}

/// The width text is wrapped to: the terminal's, else `$COLUMNS`, else 120.
pub fn output_width() -> u16 {
    if std::io::stdout().is_terminal() {
        if let Some(w) = Table::new().width() {
            return w;
        }
    }
    width_without_terminal()
}

/// Words of `text`, split at spaces outside backquotes: a `command you can run` stays whole.
fn words(text: &str) -> Vec<&str> {
    let mut words = Vec::new();
    let (mut start, mut quoted) = (0, false);
    for (i, c) in text.char_indices() {
        match c {
            '`' => quoted = !quoted,
            ' ' if !quoted => {
                words.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    words.push(&text[start..]);
    words
}

/// `text` word-wrapped to `width` columns; continuation lines are indented by two spaces.
/// Backquoted commands are never broken, so they can be copied as printed.
pub fn wrap(text: &str, width: u16) -> String {
    let width = usize::from(width.max(20));
    let mut out = String::new();
    let mut line = String::new();
    for word in words(text) {
        let fresh = line.is_empty() || line == "  ";
        if !fresh && line.chars().count() + 1 + word.chars().count() > width {
            out.push_str(&line);
            out.push('\n');
            line = String::from("  ");
        } else if !fresh {
            line.push(' ');
        }
        line.push_str(word);
    }
    out.push_str(&line);
    out.push('\n');
    out
}

/// An error and its causes on one line, `outer: cause: cause`, leaving out a cause whose
/// text the line already holds (errors that print their source themselves would otherwise
/// say it twice: "No such file or directory (os error 2): No such file or directory …").
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

/// Log records as `warning: message` (level word, colon, the message and its fields).
struct PlainLines;

impl<S, N> FormatEvent<S, N> for PlainLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let label = match *event.metadata().level() {
            Level::ERROR => "error",
            Level::WARN => "warning",
            Level::INFO => "info",
            Level::DEBUG => "debug",
            Level::TRACE => "trace",
        };
        write!(writer, "{label}: ")?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// Logs to stderr as plain `warning: …` lines; `env` (e.g. `VFIO_P2P_LOG`) overrides
/// `default` (a tracing filter such as `warn`).
pub fn init_logging(env: &str, default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env(env)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .event_format(PlainLines)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_wrap_to_the_width() {
        let mut t = table(vec!["check", "saw"]);
        t.set_width(40);
        t.add_row(vec!["mmio-window", &"a long explanation ".repeat(20)]);
        let text = t.to_string();
        assert!(text.lines().all(|l| l.chars().count() <= 40), "{text}");
        assert!(text.lines().count() > 5);
    }

    #[derive(Debug)]
    struct Outer(std::io::Error);

    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "cannot read x: {}", self.0)
        }
    }

    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_cause_already_said_is_not_repeated() {
        let e = Outer(std::io::Error::from(std::io::ErrorKind::NotFound));
        let text = error_chain(&e);
        assert_eq!(text.matches("not found").count(), 1, "{text}");
        assert!(text.starts_with("cannot read x: "));
    }

    #[test]
    fn text_wraps_with_a_hanging_indent() {
        let text = wrap(&format!("warning: {}", "word ".repeat(30).trim_end()), 40);
        assert!(text.lines().all(|l| l.chars().count() <= 40), "{text}");
        assert!(text.starts_with("warning: word word"));
        assert!(
            text.lines().skip(1).all(|l| l.starts_with("  word")),
            "{text}"
        );
        assert_eq!(wrap("short", 40), "short\n");
        let cmd = wrap(
            "fix: run `vfio-p2p bind 0000:07:00.0 0000:07:00.1 0000:08:00.0` now",
            30,
        );
        assert!(
            cmd.contains("`vfio-p2p bind 0000:07:00.0 0000:07:00.1 0000:08:00.0`"),
            "{cmd}"
        );
    }
}
