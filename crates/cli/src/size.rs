//! `--size` on the command line: the same grammar as `size` in the resource files
//! (`tandem_config::parse_size`: 4096, 64K, 512M, 1G, 2T, binary multiples), and not zero.

pub fn parse(s: &str) -> Result<u64, String> {
    match tandem_config::parse_size(s.trim())? {
        0 => Err("size must be greater than zero".into()),
        v => Ok(v),
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

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
