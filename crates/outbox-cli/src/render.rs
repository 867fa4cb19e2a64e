//! Small pieces of text output shared by the commands.

/// `1234567` as `1,234,567`.
#[must_use]
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// `showing 50 of 1,234 matching rows` when a listing shows fewer rows than
/// match, `None` when it shows them all.
#[must_use]
pub fn showing(shown: u64, matching: u64) -> Option<String> {
    (shown < matching).then(|| {
        format!(
            "showing {} of {} matching rows",
            thousands(shown),
            thousands(matching)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_get_thousands_separators() {
        let cases = [
            (0, "0"),
            (999, "999"),
            (1000, "1,000"),
            (1234, "1,234"),
            (123_456, "123,456"),
            (1_234_567, "1,234,567"),
            (u64::MAX, "18,446,744,073,709,551,615"),
        ];
        for (n, text) in cases {
            assert_eq!(thousands(n), text);
        }
    }

    #[test]
    fn showing_says_so_only_when_rows_are_left_out() {
        assert_eq!(
            showing(50, 1234).as_deref(),
            Some("showing 50 of 1,234 matching rows")
        );
        assert_eq!(showing(3, 3), None);
    }
}
