//! The naming rules shared by definitions and parameters.

/// The longest block id, switch label, entity, column or variable name.
pub const MAX_NAME_LEN: usize = 64;

/// A block id or an output label: 1 to [`MAX_NAME_LEN`] ASCII letters,
/// digits, `_` or `-`. No dots, so `blocks.<id>.output` paths stay
/// unambiguous.
#[must_use]
pub fn is_block_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME_LEN
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// An entity, column or variable name: an ASCII letter or `_`, then
/// letters, digits or `_`; at most [`MAX_NAME_LEN`] characters.
#[must_use]
pub fn is_identifier(s: &str) -> bool {
    let mut bytes = s.bytes();
    s.len() <= MAX_NAME_LEN
        && bytes
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules() {
        assert!(is_block_id("send-mail_2"));
        assert!(!is_block_id(""));
        assert!(!is_block_id("a.b"));
        assert!(!is_block_id(&"a".repeat(MAX_NAME_LEN + 1)));
        assert!(is_identifier("_total2"));
        assert!(is_identifier("customerEmail"));
        assert!(!is_identifier("2x"));
        assert!(!is_identifier("a-b"));
        assert!(!is_identifier(""));
    }
}
