//! Which state triggers a change fires: scope/key globs and the `changed` path filter.

use super::*;

/// A state trigger's `changed` filter (a path, dotted or a JSON pointer): the trigger fires
/// only for writes that change the value there (absent and `null` are the same). Without a
/// filter every write passes. The engine and the deployed stream router both decide with it.
pub fn state_change_passes(
    changed: Option<&str>,
    old: Option<&Value>,
    new: Option<&Value>,
) -> bool {
    let Some(path) = changed else {
        return true;
    };
    fn at<'a>(v: Option<&'a Value>, path: &str) -> Option<&'a Value> {
        v.and_then(|v| crate::state::value_at(v, path))
            .filter(|v| !v.is_null())
    }
    at(old, path) != at(new, path)
}

/// Whether a state trigger (its `scope`/`key` globs and `changed` path) takes this change.
/// The engine's own triggers, its Lambda triggers and the deployed stream router all decide
/// with it.
pub fn state_trigger_takes(
    scope_glob: Option<&str>,
    key_glob: Option<&str>,
    changed: Option<&str>,
    (scope, key): (&str, &str),
    old: Option<&Value>,
    new: Option<&Value>,
) -> bool {
    scope_glob.is_none_or(|s| glob_match(s, scope))
        && key_glob.is_none_or(|k| glob_match(k, key))
        && state_change_passes(changed, old, new)
}

/// Glob with `*` as the only wildcard, anchored at both ends.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let mut rest = text;
    for (i, part) in parts.iter().enumerate() {
        if i == 0 {
            match rest.strip_prefix(part) {
                Some(r) => rest = r,
                None => return false,
            }
        } else if i == parts.len() - 1 {
            return rest.ends_with(part);
        } else if let Some(pos) = rest.find(part) {
            rest = &rest[pos + part.len()..];
        } else {
            return false;
        }
    }
    true
}
