//! `--size` on the command line: the same grammar as `size` in the resource files
//! (`tandem_config::parse_size`: 4096, 64K, 512M, 1G, 2T, binary multiples), and not zero.

pub fn parse(s: &str) -> Result<u64, String> {
    match tandem_config::parse_size(s.trim())? {
        0 => Err("size must be greater than zero".into()),
        v => Ok(v),
    }
}

/// KiB as a person reads them: `812 KiB`, `3.4 MiB`, `1.2 GiB`, `2.0 TiB`.
pub fn human_kib(kib: u64) -> String {
    const UNITS: [&str; 3] = ["MiB", "GiB", "TiB"];
    if kib < 1024 {
        return format!("{kib} KiB");
    }
    let mut v = kib as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

#[cfg(test)]
mod tests {
    use super::{human_kib, parse};

    #[test]
    fn human_sizes() {
        assert_eq!(human_kib(812), "812 KiB");
        assert_eq!(human_kib(3 * 1024 + 400), "3.4 MiB");
        assert_eq!(human_kib(1258291), "1.2 GiB");
        assert_eq!(human_kib(2 << 30), "2.0 TiB");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse("4096"), Ok(4096));
        assert_eq!(parse("64K"), Ok(64 << 10));
        assert_eq!(parse("1G"), Ok(1 << 30));
        assert_eq!(parse("2GiB"), Ok(2 << 30));
        assert_eq!(parse(" 8M "), Ok(8 << 20));
        assert!(parse("1X").is_err());
        assert!(parse("0").is_err());
        assert!(parse("99999999999T").is_err());
        assert!(parse("").is_err());
        // One grammar with the resource files: what one accepts, the other does.
        for s in ["1G", "1GiB", "512m", "1.5G", "1GB", "1P"] {
            assert_eq!(
                parse(s).is_ok(),
                tandem_config::parse_size(s).is_ok(),
                "{s}"
            );
        }
    }
}
