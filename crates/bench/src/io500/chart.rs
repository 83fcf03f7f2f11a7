//! A PNG chart comparing IO500 results: one row per phase (and score), one bar per target,
//! each row scaled to its largest value, with the values written beside the bars.

use std::io;
use std::path::Path;

use super::Io500Result;
use super::report::scored_phases;
use crate::canvas::Canvas;

const WIDTH: usize = 1040;
const ROW: usize = 34;
const LABEL_WIDTH: usize = 216;
const BAR_AREA: usize = 560;
const TOP: usize = 70;
use crate::canvas::COLORS;

fn format_value(value: f64) -> String {
    if value >= 100.0 {
        format!("{value:.0}")
    } else if value >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.3}")
    }
}

/// Draws the chart of `results` (up to four targets) into a PNG file.
pub fn write_png(results: &[Io500Result], path: &Path) -> io::Result<()> {
    let mut rows: Vec<(String, Vec<f64>)> = scored_phases()
        .map(|phase| {
            let label = format!("{} {}", phase.name(), phase.unit());
            (label, results.iter().map(|result| result.measurement(phase).map_or(0.0, |m| m.value)).collect())
        })
        .collect();
    rows.push(("score bandwidth".into(), results.iter().map(|result| result.score.bandwidth).collect()));
    rows.push(("score iops".into(), results.iter().map(|result| result.score.iops).collect()));
    rows.push(("score total".into(), results.iter().map(|result| result.score.total).collect()));

    let targets = results.len().clamp(1, COLORS.len());
    let row_height = ROW.max(targets * 12 + 10);
    let height = TOP + rows.len() * row_height + 20;
    let mut canvas = Canvas::new(WIDTH, height);
    canvas.text(10, 10, "IO500 phases (bars scaled per row)", 2, [0, 0, 0]);
    for (index, result) in results.iter().take(COLORS.len()).enumerate() {
        let x = 10 + index * 240;
        canvas.rectangle(x, 40, 14, 14, COLORS[index]);
        let label: String = result.target.chars().take(26).collect();
        canvas.text(x + 20, 43, &label, 1, [0, 0, 0]);
    }
    for (row_index, (label, values)) in rows.iter().enumerate() {
        let y = TOP + row_index * row_height;
        if row_index % 2 == 0 {
            canvas.rectangle(0, y, WIDTH, row_height, [245, 245, 245]);
        }
        canvas.text(8, y + row_height / 2 - 4, label, 1, [0, 0, 0]);
        let largest = values.iter().copied().fold(0.0, f64::max);
        for (target, value) in values.iter().take(COLORS.len()).enumerate() {
            let bar_y = y + 5 + target * 12;
            let length = if largest > 0.0 { ((value / largest) * BAR_AREA as f64) as usize } else { 0 };
            canvas.rectangle(LABEL_WIDTH, bar_y, length.max(1), 10, COLORS[target]);
            canvas.text(LABEL_WIDTH + length + 6, bar_y + 1, &format_value(*value), 1, [40, 40, 40]);
        }
    }
    canvas.write_png(path)
}
