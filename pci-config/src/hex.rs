/// Error from [`parse_hex_dump`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("not a hex dump: {0}")]
pub struct HexError(pub String);

/// Parses a config-space dump written as hex: either a plain string of hex pairs
/// (`"de103023..."`, as in snapshots) or `lspci -xxx`/`hexdump` lines
/// (`"00: de 10 30 23 ..."`), whose leading offsets are skipped.
pub fn parse_hex_dump(text: &str) -> Result<Vec<u8>, HexError> {
    let mut out = Vec::with_capacity(text.len() / 2);
    for line in text.lines() {
        let body = match line.split_once(':') {
            Some((off, rest)) if off.trim().bytes().all(|b| b.is_ascii_hexdigit()) => rest,
            _ => line,
        };
        let digits: Vec<u8> = body.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
        if !digits.len().is_multiple_of(2) {
            return Err(HexError(format!(
                "odd number of hex digits in line {line:?}"
            )));
        }
        for pair in digits.chunks(2) {
            let s = std::str::from_utf8(pair)
                .map_err(|_| HexError(format!("non-ASCII in {line:?}")))?;
            out.push(
                u8::from_str_radix(s, 16)
                    .map_err(|_| HexError(format!("'{s}' in line {line:?}")))?,
            );
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forms() {
        assert_eq!(
            parse_hex_dump("de103023").unwrap(),
            [0xde, 0x10, 0x30, 0x23]
        );
        assert_eq!(
            parse_hex_dump("00: de 10\n02: 30 23\n").unwrap(),
            [0xde, 0x10, 0x30, 0x23]
        );
        assert!(parse_hex_dump("de1").is_err());
        assert!(parse_hex_dump("zz").is_err());
    }
}
