//! A small SVG bar chart of drain throughput against worker concurrency,
//! with the baseline drawn as a line, written beside the bench's output.

use std::fmt::Write;

/// `points` are (label, tasks/s) for waymark; `baseline` is the raw-SQL
/// figure of the same run.
pub fn drain_svg(points: &[(String, f64)], baseline: f64) -> String {
    let (w, h, left, bottom, top) = (640.0, 360.0, 70.0, 60.0, 40.0);
    let max = points.iter().map(|p| p.1).fold(baseline, f64::max) * 1.15;
    let plot_h = h - bottom - top;
    let y = |v: f64| top + plot_h * (1.0 - v / max);
    let slot = (w - left - 20.0) / points.len().max(1) as f64;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="22" text-anchor="middle" font-size="14">drain: no-op tasks/s against worker concurrency (synchronous_commit=on)</text>
"#,
        w / 2.0
    );
    for i in 0..=4 {
        let v = max * i as f64 / 4.0;
        let _ = writeln!(
            s,
            r##"<line x1="{left}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{:.0}</text>"##,
            w - 20.0,
            left - 6.0,
            y(v) + 4.0,
            v,
            y = y(v)
        );
    }
    for (i, (label, v)) in points.iter().enumerate() {
        let x = left + slot * i as f64 + slot * 0.2;
        let _ = writeln!(
            s,
            r##"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#3b6ea5"/><text x="{:.1}" y="{:.1}" text-anchor="middle">{label}</text><text x="{:.1}" y="{:.1}" text-anchor="middle">{v:.0}</text>"##,
            y(*v),
            slot * 0.6,
            y(0.0) - y(*v),
            x + slot * 0.3,
            h - bottom + 18.0,
            x + slot * 0.3,
            y(*v) - 6.0
        );
    }
    let _ = writeln!(
        s,
        r##"<line x1="{left}" x2="{}" y1="{b:.1}" y2="{b:.1}" stroke="#c0392b" stroke-dasharray="6 4" stroke-width="2"/><text x="{}" y="{:.1}" text-anchor="end" fill="#c0392b">raw-SQL baseline {baseline:.0}</text>"##,
        w - 20.0,
        w - 24.0,
        y(baseline) - 6.0,
        b = y(baseline)
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">worker concurrency (settle batch)</text></svg>"#,
        w / 2.0,
        h - 18.0
    );
    s
}
