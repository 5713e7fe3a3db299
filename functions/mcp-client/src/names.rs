//! Tool names to function IDs, one reversible rule: a byte of `A-Z a-z 0-9 _ . -` stays as
//! it is, every other byte of the name's UTF-8 (`%` included) becomes `%XX` (upper-case hex).
//! `get-sum` stays `get-sum`; `search/files now` becomes `search%2Ffiles%20now`. Two distinct
//! names never map to one; a server listing the same name twice has the second refused.

pub const PREFIX: &str = "mcp::";
/// The engine's limit on a function ID.
pub const MAX_FUNCTION_ID: usize = 256;

fn kept(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-')
}

pub fn encode(tool: &str) -> String {
    let mut out = String::with_capacity(tool.len());
    for b in tool.bytes() {
        if kept(b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The inverse of [`encode`]; `None` for a string `encode` cannot have made.
pub fn decode(encoded: &str) -> Option<String> {
    let bytes = encoded.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = encoded.get(i + 1..i + 3)?;
                if hex.bytes().any(|c| c.is_ascii_lowercase()) {
                    return None;
                }
                let b = u8::from_str_radix(hex, 16).ok()?;
                if kept(b) {
                    return None;
                }
                out.push(b);
                i += 3;
            }
            b if kept(b) => {
                out.push(b);
                i += 1;
            }
            _ => return None,
        }
    }
    String::from_utf8(out).ok()
}

/// `mcp::<server>::<encoded tool>`, or why it cannot be one.
pub fn function_id(server: &str, tool: &str) -> Result<String, String> {
    if tool.is_empty() {
        return Err("a tool without a name".into());
    }
    let id = format!("{PREFIX}{server}::{}", encode(tool));
    if id.len() > MAX_FUNCTION_ID {
        return Err(format!(
            "its function ID would be {} characters (the engine's limit is {MAX_FUNCTION_ID})",
            id.len()
        ));
    }
    Ok(id)
}

/// `(server, tool)` of an MCP function ID.
pub fn split(function_id: &str) -> Option<(&str, String)> {
    let rest = function_id.strip_prefix(PREFIX)?;
    let (server, tool) = rest.split_once("::")?;
    Some((server, decode(tool)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_keeps_plain_names_and_round_trips_every_other() {
        assert_eq!(encode("get-sum"), "get-sum");
        assert_eq!(encode("a.b_c-9"), "a.b_c-9");
        assert_eq!(encode("search/files now"), "search%2Ffiles%20now");
        assert_eq!(encode("50%"), "50%25");
        assert_eq!(encode("a::b"), "a%3A%3Ab");
        for name in [
            "get-sum",
            "search/files now",
            "50%",
            "a%2Fb",
            "ünï",
            "a::b",
            "x\ny",
        ] {
            assert_eq!(decode(&encode(name)).as_deref(), Some(name));
        }
        // Distinct names stay distinct: `a/b` and the literal `a%2Fb`.
        assert_ne!(encode("a/b"), encode("a%2Fb"));
        assert_eq!(decode("a%2fb"), None);
        assert_eq!(decode("a%41"), None, "a kept byte is never encoded");
        assert_eq!(decode("a b"), None);
        assert_eq!(
            split("mcp::everything::get%20it"),
            Some(("everything", "get it".to_string()))
        );
        assert!(
            function_id("s", &"x".repeat(300))
                .unwrap_err()
                .contains("256")
        );
        assert!(function_id("s", "").is_err());
    }
}
