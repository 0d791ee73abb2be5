//! SVG to PNG in process, through resvg (pure Rust), with the system's fonts.

use anyhow::{Context, Result};
use resvg::{tiny_skia, usvg};

/// Renders SVG strings; holds the font database, which is slow to build.
pub struct PngRenderer {
    opt: usvg::Options<'static>,
    /// The family text falls back to; `None`: no font was found, text is left out.
    pub family: Option<String>,
}

/// Families tried first, in order (the charts ask for the first).
const PREFERRED: [&str; 4] = ["DejaVu Sans", "Liberation Sans", "Noto Sans", "Arial"];

impl PngRenderer {
    /// Loads the system fonts and maps `sans-serif` to one that exists.
    pub fn new() -> PngRenderer {
        let mut opt = usvg::Options::default();
        let db = opt.fontdb_mut();
        db.load_system_fonts();
        let families: Vec<String> = db
            .faces()
            .flat_map(|f| f.families.iter().map(|(name, _)| name.clone()))
            .collect();
        let family = PREFERRED
            .iter()
            .find(|p| families.iter().any(|f| f == *p))
            .map(|s| s.to_string())
            .or_else(|| families.iter().find(|f| f.contains("Sans")).cloned())
            .or_else(|| families.first().cloned());
        if let Some(f) = &family {
            db.set_sans_serif_family(f.clone());
            opt.font_family = f.clone();
        }
        PngRenderer { opt, family }
    }

    /// `svg` at `scale` times its size, as PNG bytes.
    pub fn render(&self, svg: &str, scale: f32) -> Result<Vec<u8>> {
        let tree = usvg::Tree::from_str(svg, &self.opt).context("parsing the chart's SVG")?;
        let size = tree
            .size()
            .to_int_size()
            .scale_by(scale)
            .context("chart size out of range")?;
        let mut pixmap = tiny_skia::Pixmap::new(size.width(), size.height())
            .context("cannot allocate the chart's pixels")?;
        pixmap.fill(tiny_skia::Color::WHITE);
        resvg::render(
            &tree,
            tiny_skia::Transform::from_scale(scale, scale),
            &mut pixmap.as_mut(),
        );
        pixmap.encode_png().context("encoding the chart as PNG")
    }
}

/// Width and height from a PNG's IHDR chunk, after checking the signature.
#[cfg(test)]
pub fn png_dimensions(png: &[u8]) -> Option<(u32, u32)> {
    const SIG: [u8; 8] = [0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n'];
    if png.len() < 24 || png[..8] != SIG || &png[12..16] != b"IHDR" {
        return None;
    }
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    Some((be(&png[16..20]), be(&png[20..24])))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_at_scale() {
        let r = PngRenderer::new();
        let svg = r##"<svg xmlns="http://www.w3.org/2000/svg" width="40" height="30" viewBox="0 0 40 30"><rect x="0" y="0" width="20" height="30" fill="#ff0000"/><text x="2" y="20" font-family="sans-serif">x</text></svg>"##;
        let png = r.render(svg, 2.0).unwrap();
        assert_eq!(png_dimensions(&png), Some((80, 60)));
        assert!(png_dimensions(b"GIF89a.................").is_none());
        assert!(r.render("<svg", 1.0).is_err());
    }
}
