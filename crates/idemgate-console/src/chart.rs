//! Per-tool charts over time, as SVG drawn on the server: executed, replayed and newly unknown
//! calls from the audit log, refused calls from this process's [`crate::Tally`].

use std::collections::BTreeMap;
use std::fmt::Write as _;

use idemgate::Timestamp;

use crate::audit;
use crate::html::esc;

const HOUR_MS: i64 = 3_600_000;

/// The series, in the order they are drawn and listed.
pub(crate) const SERIES: [&str; 4] = ["executed", "replayed", "refused", "unknown"];

/// One tool's counts per hour, oldest hour first, for each of [`SERIES`].
#[derive(Debug, Default)]
pub(crate) struct Counts {
    pub(crate) per_hour: [Vec<u64>; 4],
}

impl Counts {
    fn new(hours: usize) -> Self {
        Counts {
            per_hour: std::array::from_fn(|_| vec![0; hours]),
        }
    }

    pub(crate) fn total(&self, series: usize) -> u64 {
        self.per_hour[series].iter().sum()
    }
}

/// Counts per tool over the `hours` hours up to `now`, of the lines and refusals `visible`
/// (a tenant's own, or every tenant's for the operator).
pub(crate) fn count(
    log: &audit::Log,
    refused: &std::collections::HashMap<(String, String), Vec<(i64, u64)>>,
    visible: impl Fn(&str) -> bool,
    now: Timestamp,
    hours: usize,
) -> BTreeMap<String, Counts> {
    let last = now.as_millis().div_euclid(HOUR_MS);
    let first = last - i64::try_from(hours).unwrap_or(24) + 1;
    let slot = |hour: i64| {
        (first..=last)
            .contains(&hour)
            .then(|| (hour - first) as usize)
    };
    let mut tools: BTreeMap<String, Counts> = BTreeMap::new();
    for line in &log.lines {
        let series = match line.event.as_str() {
            "executed" => 0,
            "replayed" => 1,
            "unknown" => 3,
            _ => continue,
        };
        if !visible(&line.tenant) {
            continue;
        }
        if let Some(i) = slot(line.time.as_millis().div_euclid(HOUR_MS)) {
            tools
                .entry(line.tool.clone())
                .or_insert_with(|| Counts::new(hours))
                .per_hour[series][i] += 1;
        }
    }
    for ((tenant, tool), per_hour) in refused {
        if !visible(tenant) {
            continue;
        }
        for (hour, n) in per_hour {
            if let Some(i) = slot(*hour) {
                tools
                    .entry(tool.clone())
                    .or_insert_with(|| Counts::new(hours))
                    .per_hour[2][i] += n;
            }
        }
    }
    tools
}

/// One tool's chart: per hour, a bar for each series; the y axis up to the largest count.
pub(crate) fn svg(id: &str, tool: &str, counts: &Counts, hours: usize) -> String {
    const W: f64 = 560.0;
    const H: f64 = 180.0;
    const LEFT: f64 = 40.0;
    const BOTTOM: f64 = 24.0;
    const TOP: f64 = 10.0;
    let max = counts
        .per_hour
        .iter()
        .flat_map(|s| s.iter())
        .copied()
        .max()
        .unwrap_or(0)
        .max(1);
    let plot_w = W - LEFT - 10.0;
    let plot_h = H - BOTTOM - TOP;
    // Each hour a group of four bars, one per series, side by side.
    let slot_w = plot_w / (hours.max(1) as f64);
    let bar_w = (slot_w - 2.0) / (SERIES.len() as f64);
    let h_of = |n: u64| plot_h * (n as f64) / (max as f64);
    let summary = SERIES
        .iter()
        .enumerate()
        .map(|(i, s)| format!("{} {s}", counts.total(i)))
        .collect::<Vec<_>>()
        .join(", ");
    let mut out = format!(
        r#"<svg class="chart" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-labelledby="{id}-t"><title id="{id}-t">{tool}: {summary} in the last {hours} hours</title>"#,
        tool = esc(tool),
    );
    // Axes and the y axis's largest value.
    let _ = write!(
        out,
        r#"<line class="axis" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{b}"/><line class="axis" x1="{LEFT}" y1="{b}" x2="{r}" y2="{b}"/><text class="label" x="{tx}" y="{ty}" text-anchor="end">{max}</text><text class="label" x="{tx}" y="{b}" text-anchor="end">0</text><text class="label" x="{LEFT}" y="{lb}">{hours} h ago</text><text class="label" x="{r}" y="{lb}" text-anchor="end">now</text>"#,
        b = TOP + plot_h,
        r = LEFT + plot_w,
        tx = LEFT - 4.0,
        ty = TOP + 8.0,
        lb = H - 6.0,
    );
    for (s, name) in SERIES.iter().enumerate() {
        for (i, n) in counts.per_hour[s]
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
        {
            let h = h_of(*n);
            let _ = write!(
                out,
                r#"<rect class="s-{name}" x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}"/>"#,
                LEFT + 1.0 + slot_w * (i as f64) + bar_w * (s as f64),
                TOP + plot_h - h,
                bar_w,
                h
            );
        }
    }
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn line(event: &str, tenant: &str, tool: &str, at: i64) -> audit::Line {
        serde_json::from_value(serde_json::json!({
            "time": at, "event": event, "tenant": tenant, "tool": tool, "key_digest": "d",
        }))
        .unwrap()
    }

    #[test]
    fn counts_fall_in_their_hour_and_tenants_see_their_own() {
        let now = Timestamp::from_millis(100 * HOUR_MS + 5);
        let log = audit::Log {
            lines: vec![
                line("executed", "a", "charge", 100 * HOUR_MS),
                line("executed", "a", "charge", 99 * HOUR_MS + 1),
                line("replayed", "a", "charge", 100 * HOUR_MS + 1),
                line("unknown", "b", "charge", 100 * HOUR_MS + 1),
                line("reserved", "a", "charge", 100 * HOUR_MS + 1),
                // Older than the window.
                line("executed", "a", "charge", 50 * HOUR_MS),
            ],
            truncated: false,
        };
        let mut refused = HashMap::new();
        refused.insert(("a".to_owned(), "mail".to_owned()), vec![(100, 3)]);
        let all = count(&log, &refused, |_| true, now, 24);
        let charge = &all["charge"];
        assert_eq!(charge.per_hour[0][23], 1);
        assert_eq!(charge.per_hour[0][22], 1);
        assert_eq!(charge.total(0), 2);
        assert_eq!(charge.total(1), 1);
        assert_eq!(charge.total(3), 1);
        assert_eq!(all["mail"].total(2), 3);
        let only_b = count(&log, &refused, |t| t == "b", now, 24);
        assert_eq!(only_b["charge"].total(0), 0);
        assert_eq!(only_b["charge"].total(3), 1);
        assert!(!only_b.contains_key("mail"));
        let drawn = svg("c0", "charge", charge, 24);
        assert!(drawn.contains("2 executed, 1 replayed, 0 refused, 1 unknown"));
        // A bar for each hour and series with calls: 2 executed, 1 replayed, 1 unknown.
        assert_eq!(drawn.matches("<rect").count(), 4);
    }
}
