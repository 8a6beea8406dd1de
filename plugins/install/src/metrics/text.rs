//! The Prometheus text exposition format (version 0.0.4), written by hand:
//! HELP and TYPE once per family, label values escaped, histograms as
//! cumulative `_bucket{le}` plus `_sum` and `_count`.

use std::fmt::Write;

#[derive(Debug, Default)]
pub struct Text {
    out: String,
}

fn escape(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

fn labels(pairs: &[(&str, &str)]) -> String {
    if pairs.is_empty() {
        return String::new();
    }
    let inner: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    format!("{{{}}}", inner.join(","))
}

fn number(v: f64) -> String {
    if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_string()
    } else if v.is_nan() {
        "NaN".to_string()
    } else {
        format!("{v}")
    }
}

impl Text {
    /// Start a metric family.
    pub fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {}", help.replace('\n', " "));
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    pub fn sample(&mut self, name: &str, pairs: &[(&str, &str)], value: f64) {
        let _ = writeln!(self.out, "{name}{} {}", labels(pairs), number(value));
    }

    /// One histogram series: `bounds` ascending, `counts[i]` observations in
    /// (bounds[i-1], bounds[i]], `counts[bounds.len()]` above the last bound.
    pub fn histogram(
        &mut self,
        name: &str,
        pairs: &[(&str, &str)],
        bounds: &[f64],
        counts: &[u64],
        sum: f64,
    ) {
        let mut cumulative = 0u64;
        for (i, b) in bounds.iter().enumerate() {
            cumulative += counts.get(i).copied().unwrap_or(0);
            let le = number(*b);
            let mut p = pairs.to_vec();
            p.push(("le", &le));
            self.sample(&format!("{name}_bucket"), &p, cumulative as f64);
        }
        let total = counts.iter().sum::<u64>();
        let mut p = pairs.to_vec();
        p.push(("le", "+Inf"));
        self.sample(&format!("{name}_bucket"), &p, total as f64);
        self.sample(&format!("{name}_sum"), pairs, sum);
        self.sample(&format!("{name}_count"), pairs, total as f64);
    }

    pub fn finish(self) -> String {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_families_escapes_labels_and_histograms() {
        let mut t = Text::default();
        t.family("x_total", "counter", "things");
        t.sample("x_total", &[("a", "q\"b\\c\nd")], 3.0);
        t.family("d_seconds", "histogram", "time");
        t.histogram("d_seconds", &[("p", "r")], &[0.1, 1.0], &[2, 1, 4], 9.5);
        assert_eq!(
            t.finish(),
            "# HELP x_total things\n# TYPE x_total counter\nx_total{a=\"q\\\"b\\\\c\\nd\"} 3\n\
             # HELP d_seconds time\n# TYPE d_seconds histogram\n\
             d_seconds_bucket{p=\"r\",le=\"0.1\"} 2\nd_seconds_bucket{p=\"r\",le=\"1\"} 3\n\
             d_seconds_bucket{p=\"r\",le=\"+Inf\"} 7\nd_seconds_sum{p=\"r\"} 9.5\nd_seconds_count{p=\"r\"} 7\n"
        );
    }
}
