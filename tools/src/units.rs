//! Human-readable quantities for command output: byte counts, ratios, durations.

use std::time::Duration;

/// `512 B`, `3.0 KiB`, `1.25 MiB`, `2.00 GiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    let digits = if value < 10.0 { 2 } else { 1 };
    format!("{value:.digits$} {}", UNITS[unit])
}

/// How many times `bound` `value` is, as `1.25x`; `n/a` when the bound is 0 and the value not.
pub fn ratio(value: u64, bound: u64) -> String {
    match (value, bound) {
        (0, 0) => "1.00x".to_string(),
        (_, 0) => "n/a".to_string(),
        _ => format!("{:.2}x", value as f64 / bound as f64),
    }
}

/// `850 µs`, `12.345 ms`, `3.210 s`.
pub fn duration(d: Duration) -> String {
    let secs = d.as_secs_f64();
    if secs < 1e-3 {
        format!("{:.0} µs", secs * 1e6)
    } else if secs < 1.0 {
        format!("{:.3} ms", secs * 1e3)
    } else {
        format!("{secs:.3} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(3 * 1024), "3.00 KiB");
        assert_eq!(bytes(100 * 1024 * 1024 + 1), "100.0 MiB");
        assert_eq!(bytes(2 << 30), "2.00 GiB");
        assert_eq!(ratio(0, 0), "1.00x");
        assert_eq!(ratio(5, 0), "n/a");
        assert_eq!(ratio(125, 100), "1.25x");
        assert_eq!(duration(Duration::from_micros(850)), "850 µs");
        assert_eq!(duration(Duration::from_micros(12_345)), "12.345 ms");
        assert_eq!(duration(Duration::from_millis(3_210)), "3.210 s");
    }
}
