//! Durations (`"500ms"`, `"1s"`, `"2m"`) and sizes (`"64M"`, `"1G"`, `4096`).

use std::time::Duration;

/// Parses a duration written as an unsigned integer followed by a unit: `ns`, `us`, `ms`, `s` or
/// `m` (minutes), e.g. `"500ms"`, `"1s"`, `"2m"`. No whitespace, no fractions, no bare numbers.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(tandem_config::parse_duration("500ms"), Ok(Duration::from_millis(500)));
/// assert!(tandem_config::parse_duration("5").is_err());
/// ```
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(digits_end);
    if digits.is_empty() {
        return Err(format!(
            "{s:?} is not a duration: expected a whole number followed by a unit (ns, us, ms, s, m), e.g. \"1s\""
        ));
    }
    if unit.is_empty() {
        return Err(format!(
            "{s:?} has no unit; use a unit, e.g. \"1s\" (units: ns, us, ms, s, m)"
        ));
    }
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a duration: the number is too large"))?;
    let too_large = || format!("{s:?} is not a duration: the number is too large");
    let d = match unit {
        "ns" => Duration::from_nanos(n),
        "us" => Duration::from_micros(n),
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(too_large)?),
        _ => {
            return Err(format!(
                "{s:?} is not a duration: unknown unit {unit:?} (expected ns, us, ms, s or m), e.g. \"1s\""
            ))
        }
    };
    Ok(d)
}

/// Parses a size in bytes: a whole number optionally followed by a binary multiplier `K`, `M`,
/// `G` or `T` (powers of 1024; lower case and the `KiB`/`MiB`/`GiB`/`TiB` spellings are accepted
/// too), e.g. `"4096"`, `"64M"`, `"1G"`.
///
/// ```
/// assert_eq!(tandem_config::parse_size("64M"), Ok(64 << 20));
/// assert!(tandem_config::parse_size("1.5G").is_err());
/// ```
pub fn parse_size(s: &str) -> Result<u64, String> {
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, suffix) = s.split_at(digits_end);
    if digits.is_empty() {
        return Err(format!(
            "{s:?} is not a size: expected a whole number of bytes, optionally followed by K, M, G or T, e.g. \"64M\""
        ));
    }
    let shift = match suffix {
        "" => 0,
        "K" | "k" | "KiB" | "kiB" => 10,
        "M" | "m" | "MiB" => 20,
        "G" | "g" | "GiB" => 30,
        "T" | "t" | "TiB" => 40,
        _ => {
            return Err(format!(
                "{s:?} is not a size: unknown suffix {suffix:?} (expected K, M, G or T; binary multiples)"
            ))
        }
    };
    let too_large = || format!("{s:?} is too large");
    let n: u64 = digits.parse().map_err(|_| too_large())?;
    n.checked_mul(1u64 << shift).ok_or_else(too_large)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("7ns"), Ok(Duration::from_nanos(7)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("0010s"), Ok(Duration::from_secs(10)));
    }

    #[test]
    fn duration_errors() {
        let e = parse_duration("5").unwrap_err();
        assert!(e.contains("no unit; use a unit, e.g. \"1s\""), "{e}");
        for bad in [
            "", "s", "-1s", "+1s", "1.5s", " 1s", "1s ", "1 s", "1h", "1S", "1sec", "1m30s", "ms",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be rejected");
        }
        let e = parse_duration("1h").unwrap_err();
        assert!(e.contains("unknown unit \"h\""), "{e}");
        let e = parse_duration("99999999999999999999s").unwrap_err();
        assert!(e.contains("too large"), "{e}");
        let e = parse_duration("18446744073709551615m").unwrap_err();
        assert!(e.contains("too large"), "{e}");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("64M"), Ok(64 * 1024 * 1024));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("2T"), Ok(2 << 40));
        assert_eq!(parse_size("16777215T"), Ok(16_777_215u64 << 40));
    }

    #[test]
    fn size_errors() {
        for bad in [
            "", "M", "-1", "+1", "1.5G", " 1G", "1G ", "1 G", "1GB", "1P", "1e9", "0x10",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?} should be rejected");
        }
        let e = parse_size("1P").unwrap_err();
        assert!(e.contains("unknown suffix \"P\""), "{e}");
        let e = parse_size("16777216T").unwrap_err();
        assert!(e.contains("too large"), "{e}");
        let e = parse_size("99999999999999999999").unwrap_err();
        assert!(e.contains("too large"), "{e}");
    }
}
