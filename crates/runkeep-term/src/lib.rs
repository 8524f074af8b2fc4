//! Terminal output shared by the `runkeep` command and `runkeep-bench`:
//! colour (only on a TTY, never with `NO_COLOR`) and aligned tables.

use std::io::IsTerminal;

/// ANSI colours.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Color {
    Red,
    Green,
    Yellow,
    Blue,
    Dim,
    Bold,
}

impl Color {
    fn sgr(self) -> &'static str {
        match self {
            Color::Red => "31",
            Color::Green => "32",
            Color::Yellow => "33",
            Color::Blue => "34",
            Color::Dim => "2",
            Color::Bold => "1",
        }
    }
}

/// Whether a stream gets colour.
#[derive(Clone, Copy, Debug)]
pub struct Style {
    color: bool,
}

/// `NO_COLOR` present and not empty disables colour (no-color.org).
fn no_color_env() -> bool {
    std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty())
}

impl Style {
    /// For stdout.
    pub fn stdout() -> Self {
        Self {
            color: std::io::stdout().is_terminal() && !no_color_env(),
        }
    }

    /// For stderr.
    pub fn stderr() -> Self {
        Self {
            color: std::io::stderr().is_terminal() && !no_color_env(),
        }
    }

    /// Never colour (tests, files).
    pub fn plain() -> Self {
        Self { color: false }
    }

    /// `text` in `color` when colour is on.
    pub fn paint(&self, text: &str, color: Color) -> String {
        if self.color && !text.is_empty() {
            format!("\x1b[{}m{text}\x1b[0m", color.sgr())
        } else {
            text.to_string()
        }
    }
}

/// One table cell.
#[derive(Clone, Debug)]
pub struct Cell {
    text: String,
    color: Option<Color>,
}

impl Cell {
    /// A coloured cell.
    pub fn colored(text: impl Into<String>, color: Color) -> Self {
        Self {
            text: text.into(),
            color: Some(color),
        }
    }
}

impl Cell {
    /// The text, without colour.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The text, in its colour when `style` has colour on.
    pub fn painted(&self, style: &Style) -> String {
        match self.color {
            Some(c) => style.paint(&self.text, c),
            None => self.text.clone(),
        }
    }
}

impl From<String> for Cell {
    fn from(text: String) -> Self {
        Self { text, color: None }
    }
}

impl From<&str> for Cell {
    fn from(text: &str) -> Self {
        Self::from(text.to_string())
    }
}

/// A table with a header row, columns padded to their widest cell.
#[derive(Debug)]
pub struct Table {
    headers: Vec<&'static str>,
    rows: Vec<Vec<Cell>>,
}

impl Table {
    /// A table with these column titles.
    pub fn new(headers: &[&'static str]) -> Self {
        Self {
            headers: headers.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Appends a row (as many cells as headers).
    pub fn row(&mut self, cells: Vec<Cell>) {
        debug_assert_eq!(cells.len(), self.headers.len());
        self.rows.push(cells);
    }

    /// Renders the table; the last column is not padded.
    pub fn render(&self, style: &Style) -> String {
        let n = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (w, c) in widths.iter_mut().zip(row) {
                *w = (*w).max(c.text.chars().count());
            }
        }
        let mut out = String::new();
        let line = |out: &mut String, cells: Vec<(String, Option<Color>)>| {
            let mut text = String::new();
            for (i, (t, color)) in cells.into_iter().enumerate() {
                let pad = if i + 1 < n {
                    widths[i].saturating_sub(t.chars().count())
                } else {
                    0
                };
                text.push_str(&match color {
                    Some(c) => style.paint(&t, c),
                    None => t,
                });
                if i + 1 < n {
                    text.push_str(&" ".repeat(pad + 2));
                }
            }
            out.push_str(text.trim_end());
            out.push('\n');
        };
        line(
            &mut out,
            self.headers
                .iter()
                .map(|h| (h.to_string(), Some(Color::Bold)))
                .collect(),
        );
        for row in &self.rows {
            line(
                &mut out,
                row.iter().map(|c| (c.text.clone(), c.color)).collect(),
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns_and_do_not_pad_the_last() {
        let mut t = Table::new(&["A", "LONGER"]);
        t.row(vec!["xyz".into(), "1".into()]);
        t.row(vec!["q".into(), "22".into()]);
        let style = Style { color: false };
        assert_eq!(t.render(&style), "A    LONGER\nxyz  1\nq    22\n");
    }

    #[test]
    fn plain_never_paints() {
        assert_eq!(Style::plain().paint("x", Color::Red), "x");
    }
}
