//! `${secret:<name>}` in an entry's `env` and `headers`: the value comes from the credentials
//! vault (`auth::get_token {provider: <name>}`), never from the file in clear.

use futures_util::future::BoxFuture;
use std::sync::Arc;

/// Reads one credential by name → its value.
pub type SecretSource =
    Arc<dyn Fn(String) -> BoxFuture<'static, Result<String, String>> + Send + Sync>;

const OPEN: &str = "${secret:";

/// The secret names `value` refers to; an unterminated or empty reference is an error.
pub fn references(value: &str) -> Result<Vec<&str>, String> {
    let mut out = Vec::new();
    let mut rest = value;
    while let Some(i) = rest.find(OPEN) {
        let after = &rest[i + OPEN.len()..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("`{value}`: a ${{secret:…}} reference is not closed"))?;
        let name = &after[..end];
        if !valid_name(name) {
            return Err(format!(
                "`${{secret:{name}}}`: a secret name is 1-64 characters of a-z 0-9 _ - /"
            ));
        }
        out.push(name);
        rest = &after[end + 1..];
    }
    Ok(out)
}

/// The names `auth::get_token` accepts.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('/')
        && !name.ends_with('/')
        && !name.contains("//")
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-/".contains(&b))
}

/// `value` with every reference replaced by its secret.
pub async fn resolve(value: &str, source: &SecretSource) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = value;
    while let Some(i) = rest.find(OPEN) {
        out.push_str(&rest[..i]);
        let after = &rest[i + OPEN.len()..];
        let end = after.find('}').ok_or("unterminated ${secret:…}")?;
        let name = &after[..end];
        let secret = source(name.to_string())
            .await
            .map_err(|e| format!("secret `{name}`: {e}"))?;
        out.push_str(&secret);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// A source that reads through `auth::get_token` with `ctx`.
pub fn from_vault(ctx: harness_sdk::Ctx) -> SecretSource {
    Arc::new(move |name: String| {
        let ctx = ctx.clone();
        Box::pin(async move {
            let token = ctx
                .trigger("auth::get_token", serde_json::json!({"provider": name}))
                .await
                .map_err(|e| format!("auth::get_token failed: {e}"))?;
            token["key"]
                .as_str()
                .or_else(|| token["access_token"].as_str())
                .map(str::to_owned)
                .ok_or_else(|| {
                    "not in the credentials vault (store it with auth::set_token)".to_string()
                })
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn references_resolve_from_the_source_only() {
        assert_eq!(
            references("Bearer ${secret:mcp/issues}").unwrap(),
            vec!["mcp/issues"]
        );
        assert!(references("${secret:mcp").is_err());
        assert!(references("${secret:UPPER}").is_err());
        assert!(references("plain").unwrap().is_empty());
        let source: SecretSource = Arc::new(|n: String| {
            Box::pin(async move {
                match n.as_str() {
                    "a" => Ok("1".to_string()),
                    _ => Err("missing".to_string()),
                }
            })
        });
        assert_eq!(
            resolve("x ${secret:a} y ${secret:a}", &source)
                .await
                .unwrap(),
            "x 1 y 1"
        );
        let e = resolve("${secret:b}", &source).await.unwrap_err();
        assert!(e.contains("secret `b`: missing"), "{e}");
    }
}
