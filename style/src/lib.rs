//! The one output look shared by the host tool and the guest agent: every table is drawn the
//! same way and fits the terminal (or `$COLUMNS`, or 120 columns when the output is not a
//! terminal), and log records print as `warning: …` / `error: …` lines, never as raw
//! tracing records with module paths.

#![forbid(unsafe_code)]

use std::fmt;
use std::io::IsTerminal;

use comfy_table::{presets::UTF8_BORDERS_ONLY, ColumnConstraint, ContentArrangement, Table, Width};
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

/// The display width of the longest word (run without whitespace) of `text`: narrower than
/// that, a cell would have to break a number or a name.
pub fn longest_word(text: &str) -> usize {
    text.split_whitespace()
        .map(|w| w.chars().count())
        .max()
        .unwrap_or(0)
}

/// Columns, by index, split into groups that each fit `width` when laid out side by side:
/// column `i` takes `min_widths[i] + per_column`, a group `fixed` more. Every group starts
/// with the first `keep` columns (the row names), which are repeated; the others follow in
/// order, as many as fit. A column too wide for any group gets a group of its own.
pub fn column_groups(
    min_widths: &[usize],
    keep: usize,
    fixed: usize,
    per_column: usize,
    width: usize,
) -> Vec<Vec<usize>> {
    let keep = keep.min(min_widths.len());
    let base: usize = fixed
        + min_widths[..keep]
            .iter()
            .map(|w| w + per_column)
            .sum::<usize>();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut used = usize::MAX;
    for (i, w) in min_widths.iter().enumerate().skip(keep) {
        let cost = w + per_column;
        match groups.last_mut() {
            Some(g) if used + cost <= width => {
                g.push(i);
                used += cost;
            }
            _ => {
                groups.push((0..keep).chain([i]).collect());
                used = base + cost;
            }
        }
    }
    if groups.is_empty() {
        groups.push((0..keep).collect());
    }
    groups
}

/// A table in the project's look that fits the output width without breaking a word: each
/// column is at least as wide as its longest word (header included), longer cells wrap at
/// spaces, and when the columns cannot all stand side by side the ones after the first
/// `keep` go into further tables below, each repeating the first `keep` columns.
pub fn stacked_table(header: &[&str], rows: &[Vec<String>], keep: usize) -> String {
    stacked_table_at(header, rows, keep, output_width())
}

/// [`stacked_table`] at `width` columns.
pub fn stacked_table_at(header: &[&str], rows: &[Vec<String>], keep: usize, width: u16) -> String {
    let min_widths: Vec<usize> = (0..header.len())
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|cell| longest_word(cell))
                .chain([longest_word(header[c])])
                .max()
                .unwrap_or(0)
        })
        .collect();
    // UTF8_BORDERS_ONLY: a border on each side, one space of padding on each side of a cell
    // and a blank line between columns
    let groups = column_groups(&min_widths, keep, 1, 3, usize::from(width));
    let mut out = Vec::new();
    for group in groups {
        let mut t = table(group.iter().map(|&c| header[c]).collect::<Vec<_>>());
        t.set_width(width);
        for (n, &c) in group.iter().enumerate() {
            if let Some(column) = t.column_mut(n) {
                // comfy-table's boundaries count the cell's padding
                let w = u16::try_from(min_widths[c] + 2).unwrap_or(u16::MAX);
                column.set_constraint(ColumnConstraint::LowerBoundary(Width::Fixed(w)));
            }
        }
        for r in rows {
            t.add_row(
                group
                    .iter()
                    .map(|&c| r.get(c).cloned().unwrap_or_default())
                    .collect::<Vec<_>>(),
            );
        }
        out.push(t.to_string());
    }
    out.join("\n")
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

/// The width log lines (`warning: …`) wrap to: stderr's terminal, else `$COLUMNS`; `None`
/// when neither, so a log file or a pipe keeps each warning on one line.
pub fn stderr_width() -> Option<u16> {
    if std::io::stderr().is_terminal() {
        if let Some((terminal_size::Width(w), _)) =
            terminal_size::terminal_size_of(std::io::stderr())
        {
            return Some(w);
        }
    }
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.trim().parse::<u16>().ok())
        .filter(|w| *w >= 40)
}

/// A log record as printed: `label: message`, wrapped to `width` like the rest of the output
/// (continuation lines indented, backquoted commands whole) or on one line without one.
pub fn log_line(label: &str, message: &str, width: Option<u16>) -> String {
    let line = format!("{label}: {message}");
    match width {
        Some(w) => wrap(&line, w),
        None => line + "\n",
    }
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

/// Log records as `warning: message` (level word, colon, the message and its fields), wrapped
/// to [`stderr_width`]: the one way every warning of both binaries is printed.
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
        let mut message = String::new();
        ctx.field_format()
            .format_fields(Writer::new(&mut message), event)?;
        writer.write_str(&log_line(label, &message, stderr_width()))
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

/// How a row reads at a glance: on a colour terminal fail rows are red, warn rows yellow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tone {
    Plain,
    Warn,
    Fail,
}

/// Whether rows may be coloured, given `$NO_COLOR`: unset or empty (no-color.org). Colour
/// reaches a terminal only: comfy-table styles cells when stdout is one, never in a pipe.
pub fn colour_allowed(no_color: Option<&std::ffi::OsStr>) -> bool {
    no_color.is_none_or(|v| v.is_empty())
}

/// `cells` as a table row in `tone` (plain where colour is not allowed).
pub fn toned_row(cells: Vec<String>, tone: Tone) -> Vec<comfy_table::Cell> {
    let colour = match tone {
        Tone::Plain => None,
        Tone::Warn => Some(comfy_table::Color::Yellow),
        Tone::Fail => Some(comfy_table::Color::Red),
    }
    .filter(|_| colour_allowed(std::env::var_os("NO_COLOR").as_deref()));
    cells
        .into_iter()
        .map(|c| match colour {
            Some(fg) => comfy_table::Cell::new(c).fg(fg),
            None => comfy_table::Cell::new(c),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn rows_are_coloured_by_tone_unless_no_color() {
        assert!(colour_allowed(None));
        assert!(colour_allowed(Some(std::ffi::OsStr::new(""))));
        assert!(!colour_allowed(Some(std::ffi::OsStr::new("1"))));
        let styled = |tone| {
            let mut t = table(vec!["status"]);
            t.add_row(toned_row(vec!["fail".into()], tone));
            t.enforce_styling();
            t.to_string()
        };
        // NO_COLOR is not set in the test environment unless the caller sets it
        if std::env::var_os("NO_COLOR").is_none() {
            assert!(
                styled(Tone::Fail).contains("\u{1b}["),
                "{}",
                styled(Tone::Fail)
            );
        }
        assert!(!styled(Tone::Plain).contains("fail\u{1b}"));
        // never in a pipe: tables are styled only on a terminal
        let mut t = table(vec!["status"]);
        t.add_row(toned_row(vec!["fail".into()], Tone::Fail));
        assert!(!t.to_string().contains('\u{1b}'));
    }

    use super::*;

    /// gen's 190-character warnings (issue 29) at 80 and 120 columns, and whole without a width.
    #[test]
    fn log_lines_wrap_to_the_width_and_keep_commands_whole() {
        let message = "the CPU of /sys is unknown (no proc/cpuinfo there): the NCCL file's <cpu> has no arch, vendor, familyid, modelid; generate it from a root that has proc/cpuinfo (`vfio-p2p snapshot --output DIR`)";
        for width in [80u16, 120] {
            let text = log_line("warning", message, Some(width));
            assert!(text.starts_with("warning: the CPU"), "{text}");
            assert!(text.lines().count() > 1, "{text}");
            assert!(
                text.lines()
                    .all(|l| l.chars().count() <= usize::from(width)),
                "{text}"
            );
            assert!(text.lines().skip(1).all(|l| l.starts_with("  ")), "{text}");
            assert!(text.contains("`vfio-p2p snapshot --output DIR`"), "{text}");
        }
        let whole = log_line("warning", message, None);
        assert_eq!(whole, format!("warning: {message}\n"));
    }

    #[test]
    fn tables_wrap_to_the_width() {
        let mut t = table(vec!["check", "saw"]);
        t.set_width(40);
        t.add_row(vec!["mmio-window", &"a long explanation ".repeat(20)]);
        let text = t.to_string();
        assert!(text.lines().all(|l| l.chars().count() <= 40), "{text}");
        assert!(text.lines().count() > 5);
    }

    /// A bench-like table: eleven columns of numbers, rendered at 80 and 120 columns.
    fn numbers() -> (Vec<&'static str>, Vec<Vec<String>>) {
        let header = vec![
            "src → dst",
            "one-way µs",
            "other flag places µs",
            "remote read µs",
            "local read µs",
            "memcpy 4B µs",
            "CE GB/s",
            "CE both ways GB/s",
            "SM copy GB/s",
            "disabled GB/s",
            "disabled 4B µs",
        ];
        let row = |a: &str, b: &str| {
            let mut r = vec![
                format!("{a}\n→ {b}"),
                "0.665 ±0%".into(),
                "0.647–0.692".into(),
            ];
            r.extend(
                [
                    "0.799 ±0%",
                    "0.142 ±0%",
                    "2.07 ±11%",
                    "394.5 ±0%",
                    "780.0 ±0%",
                    "367.7 ±0%",
                    "37.4 ±0%",
                    "17.87 ±0%",
                ]
                .map(String::from),
            );
            r
        };
        (
            header,
            vec![
                row("0000:00:06.0", "0000:00:07.0"),
                row("0000:00:07.0", "0000:00:06.0"),
            ],
        )
    }

    #[test]
    fn stacked_tables_fit_and_never_break_a_word() {
        let (header, rows) = numbers();
        for width in [80u16, 120] {
            let text = stacked_table_at(&header, &rows, 1, width);
            assert!(
                text.lines()
                    .all(|l| l.chars().count() <= usize::from(width)),
                "{width}:\n{text}"
            );
            // every word of every cell and header is whole on some line
            let words: Vec<&str> = header
                .iter()
                .copied()
                .chain(rows.iter().flatten().map(String::as_str))
                .flat_map(str::split_whitespace)
                .collect();
            for w in words {
                assert!(
                    text.lines().any(|l| l.split_whitespace().any(|t| t == w)),
                    "{width}: `{w}` is broken:\n{text}"
                );
            }
            // the row names are repeated in each block
            let blocks = text.matches("src → dst").count();
            assert!(
                width > 80 || blocks >= 2,
                "{width}: one block cannot hold 11 columns:\n{text}"
            );
            assert_eq!(text.matches("0000:00:06.0").count(), 2 * blocks, "{text}");
        }
    }

    #[test]
    fn column_groups_repeat_the_kept_columns() {
        assert_eq!(
            column_groups(&[4, 3, 3, 3], 1, 0, 1, 13),
            [vec![0, 1, 2], vec![0, 3]]
        );
        assert_eq!(
            column_groups(&[4, 3, 3, 3], 1, 0, 1, 100),
            [vec![0, 1, 2, 3]]
        );
        // a column wider than the width still gets a group
        assert_eq!(
            column_groups(&[4, 30, 3], 1, 0, 1, 10),
            [vec![0, 1], vec![0, 2]]
        );
        assert_eq!(column_groups(&[4], 1, 0, 1, 10), [vec![0]]);
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
