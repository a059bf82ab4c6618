//! Go's `time.Duration` text form, which `metav1.Duration` uses in JSON:
//! `Duration.String()` ("1h2m3.5s", "1.5µs", "0s") and `time.ParseDuration`.

const NS: u128 = 1;
const US: u128 = 1_000;
const MS: u128 = 1_000_000;
const S: u128 = 1_000_000_000;
const MIN: u128 = 60 * S;
const H: u128 = 60 * MIN;

/// Go's `time.Duration(nanos).String()`.
pub(crate) fn format(nanos: i64) -> String {
    if nanos == 0 {
        return "0s".to_string();
    }
    let sign = if nanos < 0 { "-" } else { "" };
    let u = u128::from(nanos.unsigned_abs());
    if u < S {
        let (unit, div) = if u < US {
            ("ns", NS)
        } else if u < MS {
            ("µs", US)
        } else {
            ("ms", MS)
        };
        return format!("{sign}{}{unit}", decimal(u, div));
    }
    let (h, rest) = (u / H, u % H);
    let (m, rest) = (rest / MIN, rest % MIN);
    let secs = decimal(rest, S);
    if h > 0 {
        format!("{sign}{h}h{m}m{secs}s")
    } else if m > 0 {
        format!("{sign}{m}m{secs}s")
    } else {
        format!("{sign}{secs}s")
    }
}

/// `v / div` with the fraction's trailing zeros trimmed (Go's `fmtFrac`).
fn decimal(v: u128, div: u128) -> String {
    let (int, frac) = (v / div, v % div);
    if frac == 0 {
        return int.to_string();
    }
    let width = div.ilog10() as usize;
    let digits = format!("{frac:0width$}");
    format!("{int}.{}", digits.trim_end_matches('0'))
}

/// Go's `time.ParseDuration`: `[-+]?([0-9]*(\.[0-9]*)?[a-zµμ]+)+`, or "0".
pub(crate) fn parse(s: &str) -> Option<i64> {
    let (neg, mut rest) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Some(0);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let (int, after) = rest.split_at(int_len);
        let (frac, after) = match after.strip_prefix('.') {
            Some(a) => {
                let n = a.bytes().take_while(u8::is_ascii_digit).count();
                a.split_at(n)
            }
            None => ("", after),
        };
        if int.is_empty() && frac.is_empty() {
            return None;
        }
        let unit_len = after
            .char_indices()
            .find(|(_, c)| c.is_ascii_digit() || *c == '.')
            .map_or(after.len(), |(i, _)| i);
        let (unit, after) = after.split_at(unit_len);
        let unit = match unit {
            "ns" => NS,
            "us" | "µs" | "μs" => US,
            "ms" => MS,
            "s" => S,
            "m" => MIN,
            "h" => H,
            _ => return None,
        };
        let int: u128 = if int.is_empty() { 0 } else { int.parse().ok()? };
        let mut value = int.checked_mul(unit)?;
        if !frac.is_empty() {
            // Digits beyond nanosecond precision cannot matter; cap them.
            let digits = &frac[..frac.len().min(30)];
            let f: u128 = digits.parse().ok()?;
            value = value.checked_add(f.checked_mul(unit)? / 10u128.pow(digits.len() as u32))?;
        }
        total = total.checked_add(value)?;
        rest = after;
    }
    let total = i128::try_from(total).ok()?;
    i64::try_from(if neg { -total } else { total }).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_go() {
        for (nanos, text) in [
            (0, "0s"),
            (1, "1ns"),
            (1_100, "1.1µs"),
            (2_200_000, "2.2ms"),
            (3_300_000_000, "3.3s"),
            (4 * 60 * 1_000_000_000 + 5_000_000_000, "4m5s"),
            (3_600_000_000_000, "1h0m0s"),
            (-1_500_000_000, "-1.5s"),
            (i64::MIN, "-2562047h47m16.854775808s"),
        ] {
            assert_eq!(format(nanos), text, "{nanos}");
            assert_eq!(parse(text), Some(nanos), "{text}");
        }
    }

    #[test]
    fn parses_like_go() {
        assert_eq!(parse("1h30m"), Some(5_400_000_000_000));
        assert_eq!(parse(".5s"), Some(500_000_000));
        assert_eq!(parse("1us"), Some(1_000));
        for bad in ["", "1", "s", "1x", "-", "1.s.", "99999999999999999999h"] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}
