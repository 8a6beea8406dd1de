//! Plain text tables for people, stable pretty JSON for `--json`.

use crate::error::Result;
use serde::Serialize;
use std::fmt;
use std::io::Write;

/// Print `value` as pretty JSON on stdout (one document, trailing newline).
pub fn json<T: Serialize + ?Sized>(value: &T) -> Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, value)?;
    writeln!(out)?;
    Ok(())
}

/// Print text as is on stdout.
pub fn text(s: impl fmt::Display) -> Result<()> {
    let mut out = std::io::stdout().lock();
    write!(out, "{s}")?;
    Ok(())
}

/// Left-aligned columns; the last column is never padded.
#[derive(Debug, Default, Clone)]
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Table {
        Table {
            rows: vec![header.iter().map(|s| s.to_string()).collect()],
        }
    }

    pub fn row<I, S>(&mut self, cells: I)
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cols = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..cols)
            .map(|c| {
                self.rows
                    .iter()
                    .filter_map(|r| r.get(c))
                    .map(|s| s.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for row in &self.rows {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                if i + 1 == row.len() {
                    line.push_str(cell);
                } else {
                    let w = widths.get(i).copied().unwrap_or(0);
                    line.push_str(&format!("{cell:<w$}  "));
                }
            }
            writeln!(f, "{}", line.trim_end())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_and_last_is_unpadded() {
        let mut t = Table::new(&["A", "LONGER", "C"]);
        t.row(["xxxx", "y", "z"]);
        t.row(["1", "2", ""]);
        assert_eq!(t.to_string(), "A     LONGER  C\nxxxx  y       z\n1     2\n");
    }
}
