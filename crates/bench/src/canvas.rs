//! A small RGB canvas written as PNG, for the benchmarks' charts: rectangles, lines and text
//! in an 8x8 font.

use std::io;
use std::path::Path;

/// Series colours, in order.
pub const COLORS: [[u8; 3]; 4] = [[31, 119, 180], [255, 127, 14], [44, 160, 44], [214, 39, 40]];

pub struct Canvas {
    pixels: Vec<u8>,
    width: usize,
    height: usize,
}

impl Canvas {
    /// A white canvas.
    pub fn new(width: usize, height: usize) -> Canvas {
        Canvas { pixels: vec![255; width * height * 3], width, height }
    }

    pub fn rectangle(&mut self, x: usize, y: usize, width: usize, height: usize, color: [u8; 3]) {
        for row in y..(y + height).min(self.height) {
            for column in x..(x + width).min(self.width) {
                let at = (row * self.width + column) * 3;
                self.pixels[at..at + 3].copy_from_slice(&color);
            }
        }
    }

    /// A line `thickness` pixels wide from (x0, y0) to (x1, y1).
    pub fn line(&mut self, (x0, y0): (f64, f64), (x1, y1): (f64, f64), thickness: usize, color: [u8; 3]) {
        let steps = ((x1 - x0).abs().max((y1 - y0).abs()) as usize).max(1);
        for step in 0..=steps {
            let t = step as f64 / steps as f64;
            let (x, y) = (x0 + (x1 - x0) * t, y0 + (y1 - y0) * t);
            let half = thickness as f64 / 2.0;
            self.rectangle((x - half).max(0.0) as usize, (y - half).max(0.0) as usize, thickness, thickness, color);
        }
    }

    /// Writes ASCII text with the 8x8 font, each font pixel `scale` pixels wide.
    pub fn text(&mut self, x: usize, y: usize, text: &str, scale: usize, color: [u8; 3]) {
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

    pub fn write_png(&self, path: &Path) -> io::Result<()> {
        let file = std::fs::File::create(path)?;
        let mut encoder = png::Encoder::new(io::BufWriter::new(file), self.width as u32, self.height as u32);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header().map_err(io::Error::other)?;
        writer.write_image_data(&self.pixels).map_err(io::Error::other)
    }
}

/// A line chart: each series' points (x, y) joined, x on a log2 axis (rank counts), y from 0
/// to the largest value; a legend at the top.
pub fn line_chart(path: &Path, title: &str, x_label: &str, y_label: &str, series: &[(String, Vec<(f64, f64)>)]) -> io::Result<()> {
    const WIDTH: usize = 760;
    const HEIGHT: usize = 480;
    const LEFT: usize = 90;
    const RIGHT: usize = 30;
    const TOP: usize = 80;
    const BOTTOM: usize = 60;
    let mut canvas = Canvas::new(WIDTH, HEIGHT);
    canvas.text(10, 10, title, 2, [0, 0, 0]);
    for (index, (name, _)) in series.iter().take(COLORS.len()).enumerate() {
        let x = 10 + index * 180;
        canvas.rectangle(x, 40, 14, 14, COLORS[index]);
        canvas.text(x + 20, 43, name, 1, [0, 0, 0]);
    }
    let points = || series.iter().flat_map(|(_, points)| points.iter().copied());
    let x_max = points().map(|(x, _)| x).fold(1.0, f64::max);
    let y_max = points().map(|(_, y)| y).fold(0.0, f64::max).max(f64::MIN_POSITIVE) * 1.1;
    let (plot_width, plot_height) = ((WIDTH - LEFT - RIGHT) as f64, (HEIGHT - TOP - BOTTOM) as f64);
    let place = |(x, y): (f64, f64)| {
        let fraction = if x_max > 1.0 { x.max(1.0).log2() / x_max.log2() } else { 0.5 };
        (LEFT as f64 + fraction * plot_width, TOP as f64 + plot_height * (1.0 - y / y_max))
    };
    let axis = [90, 90, 90];
    canvas.rectangle(LEFT, TOP, 2, HEIGHT - TOP - BOTTOM, axis);
    canvas.rectangle(LEFT, HEIGHT - BOTTOM, WIDTH - LEFT - RIGHT, 2, axis);
    for tick in 0..=4 {
        let value = y_max / 1.1 * tick as f64 / 4.0;
        let (_, y) = place((1.0, value));
        canvas.rectangle(LEFT - 6, y as usize, 6, 1, axis);
        canvas.text(8, y as usize - 4, &format!("{value:.3}"), 1, [0, 0, 0]);
    }
    let mut xs: Vec<f64> = points().map(|(x, _)| x).collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    for x in xs {
        let (px, _) = place((x, 0.0));
        canvas.rectangle(px as usize, HEIGHT - BOTTOM, 1, 6, axis);
        canvas.text(px as usize - 4, HEIGHT - BOTTOM + 10, &format!("{x}"), 1, [0, 0, 0]);
    }
    canvas.text(LEFT + 200, HEIGHT - 24, x_label, 1, [0, 0, 0]);
    canvas.text(8, TOP - 18, y_label, 1, [0, 0, 0]);
    for (index, (_, points)) in series.iter().take(COLORS.len()).enumerate() {
        for pair in points.windows(2) {
            canvas.line(place(pair[0]), place(pair[1]), 3, COLORS[index]);
        }
        for point in points {
            let (x, y) = place(*point);
            canvas.rectangle(x as usize - 4, y as usize - 4, 9, 9, COLORS[index]);
        }
    }
    canvas.write_png(path)
}
