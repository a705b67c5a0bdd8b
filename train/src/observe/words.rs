//! Counts in words for log lines and messages: `1 rank`, `2 ranks`, `1 batch`, `3 batches`.

/// `n` and `noun`, the noun in the plural unless `n` is 1 (English: `-es` after `ch`, `sh`,
/// `s`, `x`; else `-s`).
pub fn count<N: std::fmt::Display + PartialEq + From<u8>>(n: N, noun: &str) -> String {
    if n == N::from(1) {
        return format!("1 {noun}");
    }
    let suffix = if ["ch", "sh", "s", "x"].iter().any(|end| noun.ends_with(end)) { "es" } else { "s" };
    format!("{n} {noun}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::count;

    #[test]
    fn singular_for_one_plural_otherwise() {
        assert_eq!(count(1usize, "rank"), "1 rank");
        assert_eq!(count(0usize, "rank"), "0 ranks");
        assert_eq!(count(2usize, "accumulation step"), "2 accumulation steps");
        assert_eq!(count(1usize, "batch"), "1 batch");
        assert_eq!(count(3usize, "batch"), "3 batches");
        assert_eq!(count(5usize, "micro-batch"), "5 micro-batches");
        assert_eq!(count(7usize, "sequence"), "7 sequences");
    }
}
