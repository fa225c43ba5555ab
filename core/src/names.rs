//! Kubernetes name and key syntax (RFC 1123 labels and subdomains, qualified
//! names), checked where configuration names a label, taint key or namespace.

/// RFC 1123 label: lowercase alphanumerics and '-', 1..=63, alphanumeric at both ends.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// RFC 1123 subdomain: dot-separated labels, at most 253 characters.
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// Label-value-style name part: 1..=63 of `[A-Za-z0-9._-]`, alphanumeric at both ends.
pub fn is_qualified_name_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// Checks a label/taint key: optional RFC 1123 subdomain prefix, '/', qualified name.
pub fn check_label_key(key: &str) -> Result<(), &'static str> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && !is_dns_subdomain(p)
    {
        return Err("has a prefix that is not an RFC 1123 subdomain");
    }
    if !is_qualified_name_part(name) {
        return Err(
            "is not a valid key (name part: 1-63 of [A-Za-z0-9._-], alphanumeric at both ends)",
        );
    }
    Ok(())
}
