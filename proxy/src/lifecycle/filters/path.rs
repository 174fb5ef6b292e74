//! Path prefix replacement (`ReplacePrefixMatch`), shared by redirects and rewrites.

/// Replaces the segment-wise `prefix` of `path` with `replacement`.
///
/// Trailing slashes of the prefix and replacement are ignored, so the result never has a
/// doubled slash at the seam: with prefix `/foo`, `/foo/x` becomes `/bar/x` for `/bar` or
/// `/bar/`, and `/x` for `/`; `/foo` becomes `/bar`, or `/` for `/`. What follows the prefix
/// (including a trailing slash) is kept as sent. A path the prefix does not match is
/// returned unchanged.
pub fn replace_prefix(path: &str, prefix: &str, replacement: &str) -> String {
    let prefix = prefix.trim_end_matches('/');
    let rest = if prefix.is_empty() {
        // The root prefix matches everything; all of the path follows it.
        path
    } else {
        match path.strip_prefix(prefix) {
            Some(rest) if rest.is_empty() || rest.starts_with('/') => rest,
            _ => return path.to_owned(),
        }
    };
    let replacement = replacement.trim_end_matches('/');
    if replacement.is_empty() {
        // Replaced by the root: the rest is the path, or `/` when nothing follows.
        return if rest.is_empty() {
            "/".to_owned()
        } else {
            rest.to_owned()
        };
    }
    let mut out = String::with_capacity(replacement.len() + rest.len() + 1);
    if !replacement.starts_with('/') {
        out.push('/');
    }
    out.push_str(replacement);
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::replace_prefix;

    #[test]
    fn replace_prefix_keeps_the_rest() {
        assert_eq!(replace_prefix("/foo/x", "/foo", "/bar"), "/bar/x");
        assert_eq!(
            replace_prefix("/foo/x/y", "/foo", "/bar/baz"),
            "/bar/baz/x/y"
        );
        assert_eq!(replace_prefix("/foo", "/foo", "/bar"), "/bar");
        assert_eq!(replace_prefix("/foo/", "/foo", "/bar"), "/bar/");
    }

    #[test]
    fn replace_prefix_with_root() {
        assert_eq!(replace_prefix("/foo/x", "/foo", "/"), "/x");
        assert_eq!(replace_prefix("/foo", "/foo", "/"), "/");
        assert_eq!(replace_prefix("/foo/", "/foo", "/"), "/");
    }

    #[test]
    fn replace_prefix_avoids_double_slashes() {
        assert_eq!(replace_prefix("/foo/x", "/foo/", "/bar/"), "/bar/x");
        assert_eq!(replace_prefix("/foo/x", "/foo", "/bar/"), "/bar/x");
    }

    #[test]
    fn replace_root_prefix() {
        assert_eq!(replace_prefix("/x", "/", "/bar"), "/bar/x");
        assert_eq!(replace_prefix("/x", "/", "/"), "/x");
    }

    #[test]
    fn replace_prefix_is_segment_wise() {
        assert_eq!(replace_prefix("/foox", "/foo", "/bar"), "/foox");
        assert_eq!(replace_prefix("/other", "/foo", "/bar"), "/other");
    }
}
