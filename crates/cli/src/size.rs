//! Human sizes on the command line: 4096, 64K, 512M, 1G, 2T (binary multiples).

pub fn parse(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (digits, shift) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        None => (s, 0),
        Some((i, _)) => {
            let shift = match s[i..]
                .to_ascii_uppercase()
                .trim_end_matches("IB")
                .trim_end_matches('B')
            {
                "" => 0,
                "K" => 10,
                "M" => 20,
                "G" => 30,
                "T" => 40,
                "P" => 50,
                other => {
                    return Err(format!(
                        "unknown size suffix {other:?} (use K, M, G, T or P)"
                    ))
                }
            };
            (&s[..i], shift)
        }
    };
    let n: u64 = digits.parse().map_err(|_| format!("{s:?} is not a size"))?;
    let v = n
        .checked_shl(shift)
        .filter(|v| v >> shift == n)
        .ok_or_else(|| format!("{s:?} is too large"))?;
    if v == 0 {
        return Err("size must be greater than zero".into());
    }
    Ok(v)
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
        assert!(parse("1X").is_err());
        assert!(parse("0").is_err());
        assert!(parse("99999999999P").is_err());
        assert!(parse("").is_err());
    }
}
