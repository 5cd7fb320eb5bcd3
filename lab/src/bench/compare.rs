//! `bench compare BEFORE.json AFTER.json`: two sets of `bench … --json`
//! output side by side. Reports are matched by benchmark name and
//! parameters; a file may hold several runs (appended one after the other),
//! whose figures are summarized by their median and range. Each figure is
//! printed with its after ÷ before ratio.

use std::collections::BTreeMap;
use std::path::Path;

use super::{BenchError, other};

/// Figures of one report kind (name and parameters): every run's value.
type Runs = BTreeMap<String, BTreeMap<String, Vec<f64>>>;

/// Reads a `--json` output: `(name params)` → figure → values, in file
/// order. Lines that are not JSON objects (e.g. a run's stderr mixed in)
/// are an error naming the line.
fn read(path: &Path) -> Result<(Vec<String>, Runs), BenchError> {
    let text =
        std::fs::read_to_string(path).map_err(|e| other(format!("{}: {e}", path.display())))?;
    parse(&text).map_err(|e| other(format!("{}: {e}", path.display())))
}

fn parse(text: &str) -> Result<(Vec<String>, Runs), String> {
    let mut order = Vec::new();
    let mut runs = Runs::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| format!("line {}: not a JSON report ({e})", i + 1))?;
        let (Some(name), Some(params), Some(figures)) = (
            v["name"].as_str(),
            v["params"].as_object(),
            v["figures"].as_object(),
        ) else {
            return Err(format!(
                "line {}: not a report (no name, params or figures)",
                i + 1
            ));
        };
        let params = params
            .iter()
            .map(|(k, v)| format!("{k}={}", v.to_string().trim_matches('"')))
            .collect::<Vec<_>>()
            .join(" ");
        let key = format!("{name} {params}");
        if !runs.contains_key(&key) {
            order.push(key.clone());
        }
        let entry = runs.entry(key).or_default();
        for (figure, value) in figures {
            if let Some(x) = value.as_f64() {
                entry.entry(figure.clone()).or_default().push(x);
            }
        }
    }
    Ok((order, runs))
}

/// Median, minimum and maximum of a non-empty list.
fn summary(values: &[f64]) -> (f64, f64, f64) {
    let mut v = values.to_vec();
    let median = super::percentile(&mut v, 50.0);
    (median, v[0], v[v.len() - 1])
}

fn cell(values: Option<&Vec<f64>>) -> String {
    match values {
        None => "—".to_owned(),
        Some(v) if v.len() == 1 => format!("{}", v[0]),
        Some(v) => {
            let (median, min, max) = summary(v);
            format!("{median} ({min}–{max}, {} runs)", v.len())
        }
    }
}

/// The comparison as text lines.
fn render(before: &(Vec<String>, Runs), after: &(Vec<String>, Runs)) -> Vec<String> {
    let mut keys = before.0.clone();
    keys.extend(
        after
            .0
            .iter()
            .filter(|k| !before.1.contains_key(*k))
            .cloned(),
    );
    let mut lines = vec![format!(
        "{:<32} {:>28} {:>28} {:>8}",
        "figure", "before", "after", "ratio"
    )];
    for key in keys {
        lines.push(key.trim_end().to_owned());
        let (b, a) = (before.1.get(&key), after.1.get(&key));
        let mut figures: Vec<&String> = b.into_iter().flat_map(|m| m.keys()).collect();
        figures.extend(a.into_iter().flat_map(|m| m.keys()));
        figures.sort();
        figures.dedup();
        for figure in figures {
            let (bv, av) = (b.and_then(|m| m.get(figure)), a.and_then(|m| m.get(figure)));
            let ratio = match (bv, av) {
                (Some(bv), Some(av)) if summary(bv).0 != 0.0 => {
                    format!("×{:.3}", summary(av).0 / summary(bv).0)
                }
                _ => "—".to_owned(),
            };
            lines.push(format!(
                "    {figure:<28} {:>28} {:>28} {ratio:>8}",
                cell(bv),
                cell(av)
            ));
        }
    }
    lines
}

/// Prints the comparison of two `--json` outputs.
pub fn run(before: &Path, after: &Path) -> Result<(), BenchError> {
    let (before, after) = (read(before)?, read(after)?);
    for line in render(&before, &after) {
        bf4ps_ops::outln!("{line}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compares_medians_by_name_and_params() {
        let before = parse(concat!(
            r#"{"name":"claim","params":{"workers":4},"figures":{"jobs_per_s":1000.0}}"#,
            "\n",
            r#"{"name":"claim","params":{"workers":4},"figures":{"jobs_per_s":1200.0}}"#,
            "\n",
            r#"{"name":"claim","params":{"workers":4},"figures":{"jobs_per_s":1100.0}}"#,
            "\n",
        ))
        .unwrap();
        let after = parse(
            r#"{"name":"claim","params":{"workers":4},"figures":{"jobs_per_s":1650.0,"p50_ms":1.5}}"#,
        )
        .unwrap();
        let text = render(&before, &after).join("\n");
        assert!(text.contains("claim workers=4"), "{text}");
        assert!(text.contains("1100 (1000–1200, 3 runs)"), "{text}");
        assert!(text.contains("×1.500"), "{text}");
        assert!(text.contains("p50_ms"), "{text}");
    }

    #[test]
    fn names_the_bad_line() {
        let err = parse("{\"name\":\"x\",\"params\":{},\"figures\":{}}\nbench claim: plain-1…\n")
            .unwrap_err();
        assert!(err.starts_with("line 2: not a JSON report"), "{err}");
    }
}
