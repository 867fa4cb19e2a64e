//! Small pieces of text output shared by the commands.

/// An instant in tables: UTC, with its zone (`2026-11-30 05:36:40Z`); JSON
/// output carries RFC 3339 with the offset.
#[must_use]
pub fn utc(at: chrono::DateTime<chrono::Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%SZ").to_string()
}

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
    showing_of(shown, matching, "rows")
}

/// [`showing`] of other things than rows (`showing 50 of 1,234 matching
/// executions`).
#[must_use]
pub fn showing_of(shown: u64, matching: u64, things: &str) -> Option<String> {
    (shown < matching).then(|| {
        format!(
            "showing {} of {} matching {things}",
            thousands(shown),
            thousands(matching)
        )
    })
}

/// A length of time for people: `850 ms`, `12.3 s`, then its two largest
/// units (`15m`, `2m 5s`, `1h 5m`, `3d 4h`).
#[must_use]
pub fn span(duration: std::time::Duration) -> String {
    let ms = duration.as_millis();
    if ms < 1000 {
        return format!("{ms} ms");
    }
    if ms < 60_000 {
        return format!("{:.1} s", duration.as_secs_f64());
    }
    let secs = duration.as_secs();
    let parts = [
        (secs / 86_400, "d"),
        (secs / 3600 % 24, "h"),
        (secs / 60 % 60, "m"),
        (secs % 60, "s"),
    ];
    let first = parts.iter().position(|(n, _)| *n > 0).unwrap_or(3);
    let mut text = format!("{}{}", parts[first].0, parts[first].1);
    if let Some((n, unit)) = parts.get(first + 1).filter(|(n, _)| *n > 0) {
        text.push_str(&format!(" {n}{unit}"));
    }
    text
}

/// The first line of `text` (an error message in a one-line table cell).
#[must_use]
pub fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default()
}

/// `text` cut to at most `max` characters, `…` marking the cut.
#[must_use]
pub fn truncated(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_owned(),
        Some(_) => {
            let kept: String = text.chars().take(max.saturating_sub(1)).collect();
            format!("{kept}…")
        }
    }
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

    #[test]
    fn spans_read_as_their_largest_units() {
        use std::time::Duration;
        let cases = [
            (Duration::from_millis(0), "0 ms"),
            (Duration::from_millis(850), "850 ms"),
            (Duration::from_millis(999), "999 ms"),
            (Duration::from_millis(1000), "1.0 s"),
            (Duration::from_millis(59_900), "59.9 s"),
            (Duration::from_millis(60_000), "1m"),
            (Duration::from_millis(12_345), "12.3 s"),
            (Duration::from_secs(900), "15m"),
            (Duration::from_secs(125), "2m 5s"),
            (Duration::from_secs(3900), "1h 5m"),
            (Duration::from_secs(3600 + 7), "1h"),
            (Duration::from_secs(3 * 86_400 + 4 * 3600 + 59), "3d 4h"),
            (Duration::MAX, "213503982334601d 7h"),
        ];
        for (duration, text) in cases {
            assert_eq!(span(duration), text, "{duration:?}");
        }
    }

    #[test]
    fn cells_keep_one_line_and_a_bounded_width() {
        assert_eq!(
            first_line("block call: refused\nmore"),
            "block call: refused"
        );
        assert_eq!(first_line(""), "");
        assert_eq!(truncated("short", 10), "short");
        assert_eq!(truncated("exactly10!", 10), "exactly10!");
        assert_eq!(truncated("ééééééééééé", 5), "éééé…");
    }
}
