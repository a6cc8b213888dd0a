//! Intensity traces for `benches/carbon_sim` from a site's own grid history
//! (`CARBON_SIM_TRACES=FILE`, docs/carbon.md): one trace per line, `name,v1,v2,…` in
//! gCO2/kWh at the bench's tick. Pure: the text in, the traces or the first bad line out.

use thiserror::Error;

/// The highest intensity a trace may carry, gCO2/kWh: above the dirtiest generation (lignite
/// is about 1,100–1,300), so a value past it is a unit mistake (g/MWh, lb/MWh).
pub const MAX_G_PER_KWH: f64 = 2000.0;

/// One named trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    pub name: String,
    pub g_per_kwh: Vec<f64>,
}

#[derive(Debug, Error, PartialEq)]
pub enum TraceError {
    #[error("line {line}: expected `name,v1,v2,…`, got no values")]
    NoValues { line: usize },
    #[error("line {line}: the trace has no name (the first field)")]
    NoName { line: usize },
    #[error("line {line}: trace {name:?} appears twice")]
    Duplicate { line: usize, name: String },
    #[error("line {line}: trace {name:?} has {found} values; {expected} are needed (one per tick)")]
    Length { line: usize, name: String, found: usize, expected: usize },
    #[error("line {line}: trace {name:?}, value {index}: {text:?} is not a number of gCO2/kWh from 0 to {MAX_G_PER_KWH}")]
    Value { line: usize, name: String, index: usize, text: String },
    #[error("no trace in the file (one per line: `name,v1,v2,…`; blank lines and lines starting with # are skipped)")]
    Empty,
}

/// Every trace of `text`, each with exactly `ticks` values in 0..=[`MAX_G_PER_KWH`]. Blank
/// lines and lines starting with `#` are skipped; fields may have spaces around them.
pub fn parse(text: &str, ticks: usize) -> Result<Vec<Trace>, TraceError> {
    let mut out: Vec<Trace> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let mut fields = trimmed.split(',').map(str::trim);
        let name = fields.next().unwrap_or_default().to_string();
        if name.is_empty() {
            return Err(TraceError::NoName { line });
        }
        let texts: Vec<&str> = fields.collect();
        if texts.is_empty() {
            return Err(TraceError::NoValues { line });
        }
        if out.iter().any(|t| t.name == name) {
            return Err(TraceError::Duplicate { line, name });
        }
        if texts.len() != ticks {
            return Err(TraceError::Length { line, name, found: texts.len(), expected: ticks });
        }
        let mut values = Vec::with_capacity(ticks);
        for (index, text) in texts.iter().enumerate() {
            match text.parse::<f64>() {
                Ok(v) if v.is_finite() && (0.0..=MAX_G_PER_KWH).contains(&v) => values.push(v),
                _ => return Err(TraceError::Value { line, name, index: index + 1, text: text.to_string() }),
            }
        }
        out.push(Trace { name, g_per_kwh: values });
    }
    if out.is_empty() {
        return Err(TraceError::Empty);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(name: &str, values: &[&str]) -> String {
        std::iter::once(name).chain(values.iter().copied()).collect::<Vec<_>>().join(",")
    }

    #[test]
    fn reads_traces_and_skips_comments_and_blank_lines() {
        let text = format!("# two days of CAISO\n\n{}\n {} \n", line("a", &["0", "12.5", "900"]), line("b", &[" 1 ", "2", "3"]));
        let traces = parse(&text, 3).unwrap();
        assert_eq!(traces, vec![
            Trace { name: "a".into(), g_per_kwh: vec![0.0, 12.5, 900.0] },
            Trace { name: "b".into(), g_per_kwh: vec![1.0, 2.0, 3.0] },
        ]);
    }

    #[test]
    fn each_mistake_is_one_line_naming_the_line_and_the_trace() {
        let cases = [
            (line("a", &["1", "2"]), "line 1: trace \"a\" has 2 values; 3 are needed (one per tick)"),
            (line("a", &["1", "-2", "3"]), "line 1: trace \"a\", value 2: \"-2\" is not a number of gCO2/kWh from 0 to 2000"),
            (line("a", &["1", "2", "2500"]), "line 1: trace \"a\", value 3: \"2500\" is not a number of gCO2/kWh from 0 to 2000"),
            (line("a", &["1", "NaN", "3"]), "line 1: trace \"a\", value 2: \"NaN\" is not a number of gCO2/kWh from 0 to 2000"),
            (line("a", &["1", "", "3"]), "line 1: trace \"a\", value 2: \"\" is not a number of gCO2/kWh from 0 to 2000"),
            (",1,2,3".to_string(), "line 1: the trace has no name (the first field)"),
            ("a".to_string(), "line 1: expected `name,v1,v2,…`, got no values"),
            (format!("{}\n{}", line("a", &["1", "2", "3"]), line("a", &["1", "2", "3"])), "line 2: trace \"a\" appears twice"),
            ("# nothing\n".to_string(), "no trace in the file (one per line: `name,v1,v2,…`; blank lines and lines starting with # are skipped)"),
        ];
        for (text, message) in cases {
            let e = parse(&text, 3).unwrap_err();
            assert_eq!(e.to_string(), message, "{text:?}");
            assert!(!e.to_string().contains('\n'));
        }
    }
}
