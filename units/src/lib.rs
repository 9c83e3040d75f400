//! Byte counts and durations as people write them (`64M`, `1GiB`, `10s`)
//! and read them: what the `swarm` command's flags and the RDMA cluster
//! file share, so that a size means the same wherever a person types it.
#![forbid(unsafe_code)]

/// Parses a byte count: digits, then optionally a binary suffix `K`, `M`,
/// `G` or `T` (any case, optionally followed by `B` or `iB`), or `B`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits);
    if num.is_empty() {
        return Err(format!("'{s}' is not a size (expected digits, then optionally K, M, G or T)"));
    }
    let shift = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(format!("'{s}' has an unknown size suffix '{suffix}' (use K, M, G or T)")),
    };
    let n: u64 = num.parse().map_err(|_| format!("'{s}' is too large"))?;
    n.checked_mul(1 << shift).ok_or_else(|| format!("'{s}' is too large"))
}

/// Parses a duration into milliseconds: digits, then `ms`, `s`, `m`
/// (minutes) or `h` (any case); bare digits are milliseconds.
pub fn parse_duration_ms(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits);
    if num.is_empty() {
        return Err(format!("'{s}' is not a duration (expected digits, then ms, s, m or h)"));
    }
    let scale = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "ms" => 1,
        "s" => 1_000,
        "m" | "min" => 60_000,
        "h" => 3_600_000,
        other => return Err(format!("'{s}' has an unknown time unit '{other}' (use ms, s, m or h)")),
    };
    let n: u64 = num.parse().map_err(|_| format!("'{s}' is too long"))?;
    n.checked_mul(scale).ok_or_else(|| format!("'{s}' is too long"))
}

/// Formats a byte count for people: exact binary units where they fit.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(&str, u32); 4] = [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)];
    for (unit, shift) in UNITS {
        let scale = 1u64 << shift;
        if bytes >= scale {
            return if bytes.is_multiple_of(scale) {
                format!("{} {unit}", bytes >> shift)
            } else {
                format!("{:.1} {unit}", bytes as f64 / scale as f64)
            };
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ms("250"), Ok(250));
        assert_eq!(parse_duration_ms("250ms"), Ok(250));
        assert_eq!(parse_duration_ms("10s"), Ok(10_000));
        assert_eq!(parse_duration_ms("2M"), Ok(120_000));
        assert_eq!(parse_duration_ms(" 1h "), Ok(3_600_000));
        for bad in ["", "s", "-1s", "1.5s", "10 parsecs", "99999999999999999999h"] {
            assert!(parse_duration_ms(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("8KiB"), Ok(8192));
        assert_eq!(parse_size("2TB"), Ok(2 << 40));
        assert_eq!(parse_size("12b"), Ok(12));
        for bad in ["", "M", "-1", "1.5G", "12Q", "1 G x", "99999999999999999999", "16777216T"] {
            assert!(parse_size(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn formatted_sizes() {
        assert_eq!(format_size(0), "0 B");
        assert_eq!(format_size(4096), "4 KiB");
        assert_eq!(format_size(64 << 20), "64 MiB");
        assert_eq!(format_size(1536 << 10), "1.5 MiB");
    }
}
