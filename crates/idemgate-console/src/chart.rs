//! Per-tool charts over time, as SVG drawn on the server: executed, replayed and newly unknown
//! calls from the audit log, refused calls from this process's [`crate::Tally`], and the
//! duplicates answered without running, one series per tenant. Every chart spreads the window's
//! hours over its width, one bucket an hour, with the hours' clock times on the x axis.

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
    let first = first_hour(now, hours);
    let last = first + i64::try_from(hours).unwrap_or(24) - 1;
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

/// The first hour (since the epoch) of a window of `hours` hours ending with the hour of `now`.
pub(crate) fn first_hour(now: Timestamp, hours: usize) -> i64 {
    now.as_millis().div_euclid(HOUR_MS) - i64::try_from(hours).unwrap_or(24) + 1
}

/// Duplicates answered without running (replayed, or refused as expired) per tool, per tenant,
/// per hour of the `hours` up to `now`: one series per tenant, so tenants are never merged.
pub(crate) fn duplicates_by_tenant(
    log: &audit::Log,
    visible: impl Fn(&str) -> bool,
    now: Timestamp,
    hours: usize,
) -> BTreeMap<String, BTreeMap<String, Vec<u64>>> {
    let first = first_hour(now, hours);
    let mut tools: BTreeMap<String, BTreeMap<String, Vec<u64>>> = BTreeMap::new();
    for line in &log.lines {
        if !matches!(line.event.as_str(), "replayed" | "expired") || !visible(&line.tenant) {
            continue;
        }
        let slot = line.time.as_millis().div_euclid(HOUR_MS) - first;
        if let Some(i) = usize::try_from(slot).ok().filter(|i| *i < hours) {
            tools
                .entry(line.tool.clone())
                .or_default()
                .entry(line.tenant.clone())
                .or_insert_with(|| vec![0; hours])[i] += 1;
        }
    }
    tools
}

/// One series of a chart: its name (in the title and legend), its CSS class (its colour), and
/// its count per hour, oldest first.
pub(crate) struct Series<'a> {
    pub(crate) name: &'a str,
    pub(crate) class: String,
    pub(crate) per_hour: &'a [u64],
}

/// The CSS class of the `i`-th tenant's series: six colours, then they repeat (the legend and
/// the title still name each; the tenant filter shows one alone).
pub(crate) fn tenant_class(i: usize) -> String {
    format!("t-{}", i % 6)
}

/// Hours between two labelled ticks: about six labels over any window.
fn tick_step(hours: usize) -> usize {
    hours.div_ceil(6).max(1)
}

/// The clock time an hour since the epoch starts at, in UTC (`HH:00`).
fn clock(hour: i64) -> String {
    format!("{:02}:00", hour.rem_euclid(24))
}

/// One chart: per hour (the `hours` hours from `first_hour`), a bar for each series side by
/// side; x ticks labelled with the hour's UTC clock time about six times over the window, the y
/// axis labelled at 0, half and the largest count.
pub(crate) fn svg(
    id: &str,
    title: &str,
    series: &[Series<'_>],
    first_hour: i64,
    hours: usize,
) -> String {
    const W: f64 = 560.0;
    const H: f64 = 190.0;
    const LEFT: f64 = 40.0;
    const BOTTOM: f64 = 34.0;
    const TOP: f64 = 10.0;
    let max = series
        .iter()
        .flat_map(|s| s.per_hour.iter())
        .copied()
        .max()
        .unwrap_or(0)
        .max(1);
    let plot_w = W - LEFT - 10.0;
    let plot_h = H - BOTTOM - TOP;
    let slot_w = plot_w / (hours.max(1) as f64);
    let bar_w = (slot_w - 2.0) / (series.len().max(1) as f64);
    let h_of = |n: u64| plot_h * (n as f64) / (max as f64);
    let base = TOP + plot_h;
    let right = LEFT + plot_w;
    let mut out = format!(
        r#"<svg class="chart" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-labelledby="{id}-t"><title id="{id}-t">{}</title>"#,
        esc(title),
    );
    let _ = write!(
        out,
        r#"<line class="axis" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{base}"/><line class="axis" x1="{LEFT}" y1="{base}" x2="{right}" y2="{base}"/>"#,
    );
    // The y axis: 0, the middle (when it is a whole count) and the largest.
    let mut y_ticks = vec![0, max];
    if max >= 2 && max % 2 == 0 {
        y_ticks.insert(1, max / 2);
    }
    for n in y_ticks {
        let y = base - h_of(n);
        let _ = write!(
            out,
            r#"<line class="tick" x1="{x1}" y1="{y:.1}" x2="{LEFT}" y2="{y:.1}"/><text class="label y-tick" x="{tx}" y="{ty:.1}" text-anchor="end">{n}</text>"#,
            x1 = LEFT - 3.0,
            tx = LEFT - 5.0,
            ty = y + 4.0,
        );
    }
    // The x axis: a tick at each hour's start, labelled every few hours with its clock time,
    // and the axis named with the window's time zone.
    let step = tick_step(hours);
    for i in 0..hours {
        let x = LEFT + slot_w * (i as f64);
        let labelled = i % step == 0;
        let _ = write!(
            out,
            r#"<line class="tick" x1="{x:.1}" y1="{base}" x2="{x:.1}" y2="{y2}"/>"#,
            y2 = base + if labelled { 5.0 } else { 2.0 },
        );
        if labelled {
            let _ = write!(
                out,
                r#"<text class="label x-tick" x="{x:.1}" y="{y:.1}" text-anchor="middle">{}</text>"#,
                clock(first_hour + i as i64),
                y = base + 16.0,
            );
        }
    }
    let _ = write!(
        out,
        r#"<text class="label" x="{right}" y="{y}" text-anchor="end">hour (UTC)</text>"#,
        y = H - 3.0,
    );
    for (s, series) in series.iter().enumerate() {
        for (i, n) in series.per_hour.iter().enumerate().filter(|(_, n)| **n > 0) {
            let h = h_of(*n);
            let _ = write!(
                out,
                r#"<rect class="{}" x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}"><title>{}, {}: {n}</title></rect>"#,
                esc(&series.class),
                LEFT + 1.0 + slot_w * (i as f64) + bar_w * (s as f64),
                base - h,
                bar_w,
                h,
                esc(series.name),
                clock(first_hour + i as i64),
            );
        }
    }
    out.push_str("</svg>");
    out
}

/// The calls chart of one tool: the four [`SERIES`], with their totals in the title.
pub(crate) fn calls_svg(
    id: &str,
    tool: &str,
    counts: &Counts,
    first_hour: i64,
    hours: usize,
) -> String {
    let summary = SERIES
        .iter()
        .enumerate()
        .map(|(i, s)| format!("{} {s}", counts.total(i)))
        .collect::<Vec<_>>()
        .join(", ");
    let series: Vec<Series<'_>> = SERIES
        .iter()
        .enumerate()
        .map(|(i, name)| Series {
            name,
            class: format!("s-{name}"),
            per_hour: &counts.per_hour[i],
        })
        .collect();
    svg(
        id,
        &format!("{tool}: {summary} in the last {hours} hours"),
        &series,
        first_hour,
        hours,
    )
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
        let drawn = calls_svg("c0", "charge", charge, first_hour(now, 24), 24);
        assert!(drawn.contains("2 executed, 1 replayed, 0 refused, 1 unknown"));
        // A bar for each hour and series with calls: 2 executed, 1 replayed, 1 unknown.
        assert_eq!(drawn.matches("<rect").count(), 4);
    }

    /// The x of every bar of class `class` in a drawn chart.
    fn bar_xs(svg: &str, class: &str) -> Vec<f64> {
        svg.split(&format!(r#"<rect class="{class}" x=""#))
            .skip(1)
            .map(|rest| rest[..rest.find('"').unwrap()].parse().unwrap())
            .collect()
    }

    #[test]
    fn duplicates_an_hour_apart_land_in_different_buckets_one_series_per_tenant_with_labelled_ticks(
    ) {
        // 10:30 UTC on day 100; the window's first hour is 11:00 the day before.
        let now = Timestamp::from_millis(100 * 24 * HOUR_MS + 10 * HOUR_MS + HOUR_MS / 2);
        let at = |hours_ago: i64| now.as_millis() - hours_ago * HOUR_MS;
        let log = audit::Log {
            lines: vec![
                line("replayed", "acme", "charge", at(0)),
                line("replayed", "acme", "charge", at(1)),
                line("replayed", "acme", "charge", at(1)),
                line("expired", "globex", "charge", at(3)),
                line("executed", "acme", "charge", at(2)),
            ],
            truncated: false,
        };
        let tools = duplicates_by_tenant(&log, |_| true, now, 24);
        let charge = &tools["charge"];
        assert_eq!(charge.len(), 2, "a series per tenant: {charge:?}");
        assert_eq!(charge["acme"][23], 1);
        assert_eq!(charge["acme"][22], 2);
        assert_eq!(charge["globex"][20], 1);
        let series: Vec<Series<'_>> = charge
            .iter()
            .enumerate()
            .map(|(i, (tenant, per_hour))| Series {
                name: tenant,
                class: tenant_class(i),
                per_hour,
            })
            .collect();
        let drawn = svg("d0", "charge: duplicates", &series, first_hour(now, 24), 24);
        let acme = bar_xs(&drawn, "t-0");
        assert_eq!(acme.len(), 2, "{drawn}");
        assert!(
            acme[1] - acme[0] > 10.0,
            "an hour apart, a bucket apart on a 24-hour axis: {acme:?}"
        );
        let globex = bar_xs(&drawn, "t-1");
        assert_eq!(globex.len(), 1, "globex is its own series: {drawn}");
        assert!(
            globex[0] < acme[0],
            "three hours ago is left of one: {globex:?} {acme:?}"
        );
        // Labelled ticks: the window starts at 11:00 yesterday, and every 4 hours is labelled.
        for label in ["11:00", "15:00", "19:00", "23:00", "03:00", "07:00"] {
            assert!(
                drawn.contains(&format!(">{label}</text>")),
                "tick {label} missing: {drawn}"
            );
        }
        assert_eq!(drawn.matches("class=\"label x-tick\"").count(), 6);
        assert!(drawn.contains(r#"class="label y-tick""#) && drawn.contains(">2</text>"));
        // Each bar names its tenant and hour for a screen reader or a hover.
        assert!(drawn.contains("<title>globex, 07:00: 1</title>"), "{drawn}");
        // A tenant's view holds its own series only.
        let own = duplicates_by_tenant(&log, |t| t == "globex", now, 24);
        assert_eq!(own["charge"].keys().collect::<Vec<_>>(), ["globex"]);
    }
}
