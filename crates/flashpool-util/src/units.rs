//! Sizes and durations as operators write them ("128KiB", "1.5s"),
//! shared by the config file and the bench.

use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::echo::Echo;

/// "4k", "128KiB", "1G", "4096", "1.5M" (binary units).
pub fn parse_size(s: &str) -> Result<u64> {
    let s_ = Echo(s);
    size_bytes(s).map_err(|e| match e {
        SizeError::NotANumber => {
            anyhow::anyhow!("size {s_} is not a number with an optional unit (k, M, G, T)")
        }
        SizeError::UnknownUnit(u) => anyhow::anyhow!(
            "size {s_} has an unknown unit {}; use k, M, G or T (binary)",
            Echo(&u)
        ),
        SizeError::NotWhole => anyhow::anyhow!("size {s_} is not a whole number of bytes"),
    })
}

/// What is wrong with a size, for callers that word the message themselves.
#[derive(Debug, PartialEq)]
pub enum SizeError {
    NotANumber,
    UnknownUnit(String),
    NotWhole,
}

impl std::fmt::Display for SizeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SizeError::NotANumber => f.write_str("not a number with an optional unit"),
            SizeError::UnknownUnit(u) => write!(f, "unknown unit {}", Echo(u)),
            SizeError::NotWhole => f.write_str("not a whole number of bytes"),
        }
    }
}

/// [`parse_size`] with the reason as a value.
pub fn size_bytes(s: &str) -> Result<u64, SizeError> {
    let (n, unit) = split_number(s).ok_or(SizeError::NotANumber)?;
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" | "kb" => 1 << 10,
        "m" | "mib" | "mb" => 1 << 20,
        "g" | "gib" | "gb" => 1 << 30,
        "t" | "tib" | "tb" => 1 << 40,
        _ => return Err(SizeError::UnknownUnit(unit.to_string())),
    };
    let v = n * mult as f64;
    if v.fract() != 0.0 || v > u64::MAX as f64 {
        return Err(SizeError::NotWhole);
    }
    Ok(v as u64)
}

/// "10s", "500ms", "2m", "1.5s", "30" (seconds).
pub fn parse_duration(s: &str) -> Result<Duration> {
    let (n, unit) = split_number(s).with_context(|| {
        format!(
            "duration {} is not a number with a unit (ms, s, m, h)",
            Echo(s)
        )
    })?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "us" => n / 1e6,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        u => bail!(
            "duration {} has an unknown unit {}; use ms, s, m or h",
            Echo(s),
            Echo(u)
        ),
    };
    Ok(Duration::from_secs_f64(secs))
}

/// Bytes for people: "1.0 GiB", "512.0 MiB", "4.0 KiB", "100 B".
pub fn human_bytes(bytes: u64) -> String {
    let units = [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")];
    match units.iter().find(|(shift, _)| bytes >= 1u64 << shift) {
        Some((shift, name)) => format!("{:.1} {name}", bytes as f64 / (1u64 << shift) as f64),
        None => format!("{bytes} B"),
    }
}

/// Splits "1.5 MiB" into a non-negative finite number and its unit ("MiB").
fn split_number(s: &str) -> Option<(f64, &str)> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .ok()
        .filter(|n: &f64| n.is_finite() && *n >= 0.0)?;
    Some((n, unit.trim()))
}
