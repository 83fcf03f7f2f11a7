//! A PNG chart comparing IO500 results: one row per phase (and score), one bar per target,
//! each row scaled to its largest value, with the values written beside the bars.

use std::io;
use std::path::Path;

use super::Io500Result;
use super::report::scored_phases;

const WIDTH: usize = 1040;
const ROW: usize = 34;
const LABEL_WIDTH: usize = 216;
const BAR_AREA: usize = 560;
const TOP: usize = 70;
const COLORS: [[u8; 3]; 4] = [[31, 119, 180], [255, 127, 14], [44, 160, 44], [214, 39, 40]];

struct Canvas {
    pixels: Vec<u8>,
    height: usize,
}

impl Canvas {
    fn new(height: usize) -> Canvas {
        Canvas { pixels: vec![255; WIDTH * height * 3], height }
    }

    fn rectangle(&mut self, x: usize, y: usize, width: usize, height: usize, color: [u8; 3]) {
        for row in y..(y + height).min(self.height) {
            for column in x..(x + width).min(WIDTH) {
                let at = (row * WIDTH + column) * 3;
                self.pixels[at..at + 3].copy_from_slice(&color);
            }
        }
    }

    /// Writes ASCII text with the 8x8 font, each font pixel `scale` pixels wide.
    fn text(&mut self, x: usize, y: usize, text: &str, scale: usize, color: [u8; 3]) {
        for (position, character) in text.chars().enumerate() {
            let glyph = font8x8::legacy::BASIC_LEGACY.get(character as usize).copied().unwrap_or([0; 8]);
            for (row, bits) in glyph.iter().enumerate() {
                for column in 0..8 {
                    if bits & (1 << column) != 0 {
                        self.rectangle(x + (position * 8 + column) * scale, y + row * scale, scale, scale, color);
                    }
                }
            }
        }
    }
}

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
    let mut canvas = Canvas::new(height);
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
    let file = std::fs::File::create(path)?;
    let mut encoder = png::Encoder::new(io::BufWriter::new(file), WIDTH as u32, height as u32);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().map_err(io::Error::other)?;
    writer.write_image_data(&canvas.pixels).map_err(io::Error::other)
}
