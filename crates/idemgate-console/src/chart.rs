//! Per-tool charts over time, as SVG drawn on the server: executed, replayed and newly unknown
//! calls from the audit log, refused calls from this process's [`crate::Tally`], and the
//! duplicates answered without running, one series per tenant. Every chart spreads the chosen
//! window over its width in about 24 buckets (5 minutes each over 2 hours, an hour over a day),
//! so calls of the last hour are not all one bar at "now", with the buckets' UTC clock times on
//! the x axis.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use idemgate::Timestamp;

use crate::audit;
use crate::html::esc;

const MINUTE_MS: i64 = 60_000;
#[cfg(test)]
const HOUR_MS: i64 = 3_600_000;

/// The bucket sizes a window is cut into, in minutes: the smallest that gives at most
/// [`MAX_BUCKETS`] buckets. Each is a multiple of [`crate::tally::SLOT_MS`], so the refusals
/// counted in slots add up into them exactly, and each divides a day, so buckets start on the
/// clock's round times.
const BUCKET_MINUTES: [i64; 7] = [5, 10, 15, 20, 30, 60, 120];
const MAX_BUCKETS: i64 = 24;

/// The series, in the order they are drawn and listed.
pub(crate) const SERIES: [&str; 4] = ["executed", "replayed", "refused", "unknown"];

/// The time a chart covers, cut into buckets of equal length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Window {
    /// When the first bucket starts (milliseconds since the epoch).
    pub(crate) first_ms: i64,
    /// The length of each bucket.
    pub(crate) bucket_ms: i64,
    /// How many buckets, the last one holding `now`.
    pub(crate) buckets: usize,
}

impl Window {
    /// The `hours` up to `now`, in buckets of the smallest [`BUCKET_MINUTES`] that gives at most
    /// [`MAX_BUCKETS`]; the last bucket is the one `now` is in.
    pub(crate) fn ending(now: Timestamp, hours: usize) -> Self {
        let span = i64::try_from(hours).unwrap_or(24) * 60;
        let minutes = BUCKET_MINUTES
            .into_iter()
            .find(|m| (span + m - 1) / m <= MAX_BUCKETS)
            .unwrap_or(BUCKET_MINUTES[BUCKET_MINUTES.len() - 1]);
        let bucket_ms = minutes * MINUTE_MS;
        // Whole buckets covering the span (both positive: a ceiling division).
        let buckets = (span + minutes - 1) / minutes;
        let last = now.as_millis().div_euclid(bucket_ms);
        Window {
            first_ms: (last - buckets + 1) * bucket_ms,
            bucket_ms,
            buckets: usize::try_from(buckets).unwrap_or(24),
        }
    }

    /// The bucket a time falls in, if it is in the window.
    pub(crate) fn index(&self, ms: i64) -> Option<usize> {
        usize::try_from((ms - self.first_ms).div_euclid(self.bucket_ms))
            .ok()
            .filter(|i| *i < self.buckets)
    }

    /// When bucket `i` starts, as a UTC clock time (`HH:MM`).
    fn clock(&self, i: usize) -> String {
        let minute = (self.first_ms + self.bucket_ms * i as i64).div_euclid(MINUTE_MS);
        format!(
            "{:02}:{:02}",
            minute.div_euclid(60).rem_euclid(24),
            minute.rem_euclid(60)
        )
    }

    /// The bucket's length in words, for the page and the charts' titles.
    pub(crate) fn bucket_words(&self) -> String {
        match self.bucket_ms / MINUTE_MS {
            60 => "hour".to_owned(),
            m if m % 60 == 0 => format!("{} hours", m / 60),
            m => format!("{m} minutes"),
        }
    }
}

/// One tool's counts per bucket, oldest first, for each of [`SERIES`].
#[derive(Debug, Default)]
pub(crate) struct Counts {
    pub(crate) per_bucket: [Vec<u64>; 4],
}

impl Counts {
    fn new(buckets: usize) -> Self {
        Counts {
            per_bucket: std::array::from_fn(|_| vec![0; buckets]),
        }
    }

    pub(crate) fn total(&self, series: usize) -> u64 {
        self.per_bucket[series].iter().sum()
    }
}

/// Counts per tool over `window`, of the lines and refusals `visible` (a tenant's own, or
/// every tenant's for the operator). `refused` is per (tenant, tool): (slot start in ms, count).
pub(crate) fn count(
    log: &audit::Log,
    refused: &std::collections::HashMap<(String, String), Vec<(i64, u64)>>,
    visible: impl Fn(&str) -> bool,
    window: &Window,
) -> BTreeMap<String, Counts> {
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
        if let Some(i) = window.index(line.time.as_millis()) {
            tools
                .entry(line.tool.clone())
                .or_insert_with(|| Counts::new(window.buckets))
                .per_bucket[series][i] += 1;
        }
    }
    for ((tenant, tool), slots) in refused {
        if !visible(tenant) {
            continue;
        }
        for (slot_ms, n) in slots {
            if let Some(i) = window.index(*slot_ms) {
                tools
                    .entry(tool.clone())
                    .or_insert_with(|| Counts::new(window.buckets))
                    .per_bucket[2][i] += n;
            }
        }
    }
    tools
}

/// Duplicates answered without running (replayed, or refused as expired) per tool, per tenant,
/// per bucket of `window`: one series per tenant, so tenants are never merged.
pub(crate) fn duplicates_by_tenant(
    log: &audit::Log,
    visible: impl Fn(&str) -> bool,
    window: &Window,
) -> BTreeMap<String, BTreeMap<String, Vec<u64>>> {
    let mut tools: BTreeMap<String, BTreeMap<String, Vec<u64>>> = BTreeMap::new();
    for line in &log.lines {
        if !matches!(line.event.as_str(), "replayed" | "expired") || !visible(&line.tenant) {
            continue;
        }
        if let Some(i) = window.index(line.time.as_millis()) {
            tools
                .entry(line.tool.clone())
                .or_default()
                .entry(line.tenant.clone())
                .or_insert_with(|| vec![0; window.buckets])[i] += 1;
        }
    }
    tools
}

/// One series of a chart: its name (in the title and legend), its CSS class (its colour), and
/// its count per bucket, oldest first.
pub(crate) struct Series<'a> {
    pub(crate) name: &'a str,
    pub(crate) class: String,
    pub(crate) per_bucket: &'a [u64],
}

/// The CSS class of the `i`-th tenant's series: six colours, then they repeat (the legend and
/// the title still name each; the tenant filter shows one alone).
pub(crate) fn tenant_class(i: usize) -> String {
    format!("t-{}", i % 6)
}

/// One chart: per bucket of `window`, a bar for each series side by side; x ticks at every
/// bucket, labelled with its UTC clock time about six times over the window; the y axis
/// labelled at 0, half (when a whole count) and the largest count.
pub(crate) fn svg(id: &str, title: &str, series: &[Series<'_>], window: &Window) -> String {
    const W: f64 = 560.0;
    const H: f64 = 190.0;
    const LEFT: f64 = 40.0;
    const BOTTOM: f64 = 34.0;
    const TOP: f64 = 10.0;
    let max = series
        .iter()
        .flat_map(|s| s.per_bucket.iter())
        .copied()
        .max()
        .unwrap_or(0)
        .max(1);
    let plot_w = W - LEFT - 10.0;
    let plot_h = H - BOTTOM - TOP;
    let slot_w = plot_w / (window.buckets.max(1) as f64);
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
    let step = window.buckets.div_ceil(6).max(1);
    for i in 0..window.buckets {
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
                window.clock(i),
                y = base + 16.0,
            );
        }
    }
    let _ = write!(
        out,
        r#"<text class="label" x="{right}" y="{y}" text-anchor="end">time (UTC), a bar a {}</text>"#,
        window.bucket_words(),
        y = H - 3.0,
    );
    for (s, series) in series.iter().enumerate() {
        for (i, n) in series
            .per_bucket
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
        {
            let h = h_of(*n);
            let _ = write!(
                out,
                r#"<rect class="{}" x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}"><title>{}, from {}: {n}</title></rect>"#,
                esc(&series.class),
                LEFT + 1.0 + slot_w * (i as f64) + bar_w * (s as f64),
                base - h,
                bar_w,
                h,
                esc(series.name),
                window.clock(i),
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
    window: &Window,
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
            per_bucket: &counts.per_bucket[i],
        })
        .collect();
    svg(
        id,
        &format!("{tool}: {summary} in the last {hours} hours"),
        &series,
        window,
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
        refused.insert(
            ("a".to_owned(), "mail".to_owned()),
            vec![(100 * HOUR_MS, 3)],
        );
        let window = Window::ending(now, 24);
        assert_eq!((window.buckets, window.bucket_ms), (24, HOUR_MS));
        let all = count(&log, &refused, |_| true, &window);
        let charge = &all["charge"];
        assert_eq!(charge.per_bucket[0][23], 1);
        assert_eq!(charge.per_bucket[0][22], 1);
        assert_eq!(charge.total(0), 2);
        assert_eq!(charge.total(1), 1);
        assert_eq!(charge.total(3), 1);
        assert_eq!(all["mail"].total(2), 3);
        let only_b = count(&log, &refused, |t| t == "b", &window);
        assert_eq!(only_b["charge"].total(0), 0);
        assert_eq!(only_b["charge"].total(3), 1);
        assert!(!only_b.contains_key("mail"));
        let drawn = calls_svg("c0", "charge", charge, &window, 24);
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
        let window = Window::ending(now, 24);
        let tools = duplicates_by_tenant(&log, |_| true, &window);
        let charge = &tools["charge"];
        assert_eq!(charge.len(), 2, "a series per tenant: {charge:?}");
        assert_eq!(charge["acme"][23], 1);
        assert_eq!(charge["acme"][22], 2);
        assert_eq!(charge["globex"][20], 1);
        let series: Vec<Series<'_>> = charge
            .iter()
            .enumerate()
            .map(|(i, (tenant, per_bucket))| Series {
                name: tenant,
                class: tenant_class(i),
                per_bucket,
            })
            .collect();
        let drawn = svg("d0", "charge: duplicates", &series, &window);
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
        assert!(
            drawn.contains("<title>globex, from 07:00: 1</title>"),
            "{drawn}"
        );
        // A tenant's view holds its own series only.
        let own = duplicates_by_tenant(&log, |t| t == "globex", &window);
        assert_eq!(own["charge"].keys().collect::<Vec<_>>(), ["globex"]);
    }

    /// Calls of the last hour, minutes apart, are not one bar at "now" on a short window: the
    /// buckets shrink with the window, and the ticks say the minutes.
    #[test]
    fn a_short_window_spreads_the_last_hour_over_minute_buckets() {
        // 10:52 UTC.
        let now = Timestamp::from_millis(100 * 24 * HOUR_MS + 10 * HOUR_MS + 52 * MINUTE_MS);
        let window = Window::ending(now, 2);
        assert_eq!((window.buckets, window.bucket_ms), (24, 5 * MINUTE_MS));
        // The first bucket starts at 08:55, the last (10:50) holds now.
        assert_eq!(window.index(now.as_millis()), Some(23));
        let at = |minutes_ago: i64| now.as_millis() - minutes_ago * MINUTE_MS;
        let log = audit::Log {
            lines: vec![
                line("replayed", "acme", "charge", at(1)),
                line("replayed", "acme", "charge", at(20)),
                line("replayed", "acme", "charge", at(45)),
            ],
            truncated: false,
        };
        let tools = duplicates_by_tenant(&log, |_| true, &window);
        let acme = &tools["charge"]["acme"];
        assert_eq!(acme.iter().filter(|n| **n > 0).count(), 3, "{acme:?}");
        let drawn = svg(
            "d0",
            "charge",
            &[Series {
                name: "acme",
                class: tenant_class(0),
                per_bucket: acme,
            }],
            &window,
        );
        assert_eq!(bar_xs(&drawn, "t-0").len(), 3, "{drawn}");
        for label in ["08:55", "09:15", "09:35", "09:55", "10:15", "10:35"] {
            assert!(
                drawn.contains(&format!(">{label}</text>")),
                "tick {label}: {drawn}"
            );
        }
        assert!(drawn.contains("a bar a 5 minutes"), "{drawn}");
        // Over two days, two hours a bucket.
        let long = Window::ending(now, 48);
        assert_eq!((long.buckets, long.bucket_ms), (24, 2 * HOUR_MS));
        assert_eq!(long.bucket_words(), "2 hours");
    }
}
