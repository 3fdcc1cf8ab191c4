//! The latency-against-N chart, written as SVG text by hand: one panel per setting, side by side.

use std::fmt::Write;

use crate::scenarios::ScalingPoint;
use crate::stats::Summary;

const PANEL_W: f64 = 390.0;
const PANEL_H: f64 = 320.0;
const LEFT: f64 = 70.0;
const GAP: f64 = 90.0;
const TOP: f64 = 96.0;
const LEGEND_H: f64 = 104.0;

const PARALLEL: &str = "#1f77b4";
const SEQUENTIAL: &str = "#d62728";
const BASELINE: &str = "#555555";
const RAW: &str = "#2ca02c";

/// One panel: latency against N in one setting.
pub struct Panel<'a> {
    pub title: String,
    pub points: &'a [ScalingPoint],
    /// The TransactWriteItems p50 (2 items), drawn as a reference line.
    pub baseline_p50: Option<f64>,
}

struct Series {
    label: &'static str,
    color: &'static str,
    dashed: bool,
    pick: fn(&ScalingPoint) -> &Summary,
    p95: bool,
}

const SERIES: [Series; 5] = [
    Series { label: "parallel prepares p50", color: PARALLEL, dashed: false, pick: |p| &p.parallel, p95: false },
    Series { label: "parallel prepares p95", color: PARALLEL, dashed: true, pick: |p| &p.parallel, p95: true },
    Series { label: "sequential prepares p50", color: SEQUENTIAL, dashed: false, pick: |p| &p.sequential, p95: false },
    Series { label: "sequential prepares p95", color: SEQUENTIAL, dashed: true, pick: |p| &p.sequential, p95: true },
    Series { label: "N plain UpdateItems at once p50", color: RAW, dashed: false, pick: |p| &p.raw, p95: false },
];

impl Series {
    fn value(&self, p: &ScalingPoint) -> Option<f64> {
        let s = (self.pick)(p);
        (s.count > 0).then_some(if self.p95 { s.p95 } else { s.p50 })
    }
}

pub fn latency_chart(panels: &[Panel<'_>], title: &str, subtitle: &str) -> String {
    let count = panels.len().max(1) as f64;
    let width = LEFT + count * PANEL_W + (count - 1.0) * GAP + 30.0;
    let height = TOP + PANEL_H + LEGEND_H;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="{width}" height="{height}" fill="white"/>"#);
    let _ = writeln!(svg, r#"<text x="{LEFT}" y="24" font-size="16" font-weight="bold">{}</text>"#, escape(title));
    let _ = writeln!(svg, r##"<text x="{LEFT}" y="44" fill="#444">{}</text>"##, escape(subtitle));
    for (i, panel) in panels.iter().enumerate() {
        draw_panel(&mut svg, LEFT + i as f64 * (PANEL_W + GAP), panel);
    }

    // Legend, two rows under the panels.
    let mut lx = LEFT;
    let mut ly = TOP + PANEL_H + 62.0;
    let mut entries: Vec<(String, &str, &str)> =
        SERIES.iter().map(|s| (s.label.to_owned(), s.color, if s.dashed { "6 4" } else { "" })).collect();
    entries.push(("TransactWriteItems p50 (2 items)".to_owned(), BASELINE, "2 4"));
    for (n, (label, color, dash)) in entries.iter().enumerate() {
        if n == 3 {
            lx = LEFT;
            ly += 22.0;
        }
        let dash = if dash.is_empty() { String::new() } else { format!(r#" stroke-dasharray="{dash}""#) };
        let _ = writeln!(
            svg,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="2"{dash}/><text x="{:.1}" y="{:.1}">{}</text>"#,
            lx + 28.0,
            lx + 36.0,
            ly + 4.0,
            escape(label)
        );
        lx += 36.0 + 6.3 * label.chars().count() as f64 + 30.0;
    }
    svg.push_str("</svg>\n");
    svg
}

fn draw_panel(svg: &mut String, left: f64, panel: &Panel<'_>) {
    let points = panel.points;
    let highest = points
        .iter()
        .flat_map(|p| SERIES.iter().filter_map(move |s| s.value(p)))
        .chain(panel.baseline_p50)
        .fold(0.0f64, f64::max);
    let (y_max, step) = axis(highest * 1.08);
    let slots = points.len().max(1) as f64;
    let bottom = TOP + PANEL_H;
    let x = |i: usize| left + (i as f64 + 0.5) * PANEL_W / slots;
    let y = |ms: f64| bottom - (ms / y_max) * PANEL_H;

    let _ =
        writeln!(svg, r#"<text x="{left}" y="{:.1}" font-weight="bold">{}</text>"#, TOP - 14.0, escape(&panel.title));
    // Grid and y axis.
    let mut tick = 0.0;
    while tick <= y_max + step / 2.0 {
        let ty = y(tick);
        let _ = writeln!(
            svg,
            r##"<line x1="{left}" y1="{ty:.1}" x2="{:.1}" y2="{ty:.1}" stroke="#e3e3e3"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            left + PANEL_W,
            left - 8.0,
            ty + 4.0,
            number(tick, step)
        );
        tick += step;
    }
    let _ = writeln!(
        svg,
        r##"<line x1="{left}" y1="{TOP}" x2="{left}" y2="{bottom:.1}" stroke="#333"/><line x1="{left}" y1="{bottom:.1}" x2="{:.1}" y2="{bottom:.1}" stroke="#333"/>"##,
        left + PANEL_W
    );
    let _ = writeln!(
        svg,
        r#"<text transform="translate({:.1} {:.1}) rotate(-90)" text-anchor="middle">latency (ms)</text>"#,
        left - 48.0,
        TOP + PANEL_H / 2.0
    );
    // X axis: one slot per N (1, 2, 4, 8: a log2 scale).
    for (i, p) in points.iter().enumerate() {
        let _ = writeln!(
            svg,
            r##"<line x1="{0:.1}" y1="{1:.1}" x2="{0:.1}" y2="{2:.1}" stroke="#333"/><text x="{0:.1}" y="{3:.1}" text-anchor="middle">{4}</text>"##,
            x(i),
            bottom,
            bottom + 5.0,
            bottom + 20.0,
            p.n
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">participants N (one item each)</text>"#,
        left + PANEL_W / 2.0,
        bottom + 38.0
    );
    if let Some(base) = panel.baseline_p50 {
        let by = y(base);
        let _ = writeln!(
            svg,
            r#"<line x1="{left}" y1="{by:.1}" x2="{:.1}" y2="{by:.1}" stroke="{BASELINE}" stroke-width="1.5" stroke-dasharray="2 4"/><text x="{:.1}" y="{:.1}" fill="{BASELINE}" font-size="11" text-anchor="end">{base:.1}</text>"#,
            left + PANEL_W,
            left + PANEL_W - 2.0,
            by - 4.0
        );
    }
    for series in &SERIES {
        let values: Vec<(usize, f64)> =
            points.iter().enumerate().filter_map(|(i, p)| series.value(p).map(|v| (i, v))).collect();
        if values.is_empty() {
            continue;
        }
        let color = series.color;
        let path: Vec<String> = values.iter().map(|(i, v)| format!("{:.1},{:.1}", x(*i), y(*v))).collect();
        let dash = if series.dashed { r#" stroke-dasharray="6 4""# } else { "" };
        let _ = writeln!(
            svg,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"{dash}/>"#,
            path.join(" ")
        );
        for (i, v) in &values {
            let (cx, cy) = (x(*i), y(*v));
            if series.dashed {
                let _ = writeln!(
                    svg,
                    r#"<circle cx="{cx:.1}" cy="{cy:.1}" r="3" fill="white" stroke="{color}" stroke-width="1.5"/>"#
                );
                continue;
            }
            let _ = writeln!(svg, r#"<circle cx="{cx:.1}" cy="{cy:.1}" r="4" fill="{color}"/>"#);
            // Sequential labels to the left and above, the others (below their p95 lines) to the
            // right and below.
            let (dx, dy, anchor) = if color == SEQUENTIAL { (-7.0, -7.0, "end") } else { (7.0, 15.0, "start") };
            let _ = writeln!(
                svg,
                r#"<text x="{:.1}" y="{:.1}" fill="{color}" font-size="11" text-anchor="{anchor}">{v:.1}</text>"#,
                cx + dx,
                cy + dy
            );
        }
    }
}

/// A rounded axis maximum and tick step (1, 2 or 5 × 10^k) for about five ticks.
fn axis(highest: f64) -> (f64, f64) {
    let highest = if highest.is_finite() && highest > 0.0 { highest } else { 1.0 };
    let raw = highest / 5.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * magnitude).find(|s| *s >= raw).unwrap_or(10.0 * magnitude);
    ((highest / step).ceil() * step, step)
}

fn number(value: f64, step: f64) -> String {
    if step >= 1.0 { format!("{value:.0}") } else { format!("{value:.1}") }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_steps_are_round() {
        assert_eq!(axis(37.0), (40.0, 10.0));
        assert_eq!(axis(9.3), (10.0, 2.0));
        assert_eq!(axis(0.0), (1.0, 0.2));
    }

    #[test]
    fn chart_is_well_formed() {
        let s = |v| Summary { count: 1, p50: v, p95: v * 1.5, p99: v * 2.0, mean: v, max: v * 2.0 };
        let points: Vec<ScalingPoint> = [1, 2, 4, 8]
            .iter()
            .map(|&n| ScalingPoint {
                n,
                parallel: s(10.0 + n as f64),
                sequential: s(8.0 + 4.0 * n as f64),
                raw: s(2.0 + n as f64),
            })
            .collect();
        let without_raw: Vec<ScalingPoint> =
            points.iter().map(|p| ScalingPoint { raw: Summary::default(), ..p.clone() }).collect();
        let panels = [
            Panel { title: "local".into(), points: &points, baseline_p50: Some(4.0) },
            Panel { title: "delayed".into(), points: &without_raw, baseline_p50: None },
        ];
        let svg = latency_chart(&panels, "t", "a & b");
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 9);
        assert!(svg.contains("a &amp; b"));
    }
}
