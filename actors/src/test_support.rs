//! Helpers the crate's unit tests share.

/// A source of variables (as `std::env::var` gives them) holding exactly `pairs`.
pub(crate) fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let v: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| v.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
}
