//! `engine::functions::list` in pages: a registry grows with every worker, and an answer must
//! still fit one WebSocket message of the deployed API (128 KiB) and a caller's memory.
//! Functions come sorted by id; a page holds at most `limit` of them and about
//! [`PAGE_BYTES`] of JSON, and names the id to continue `after` when more remain.

use crate::fields::{opt_bool, opt_str, opt_u64};
use crate::protocol::ErrorBody;
use serde_json::{Value, json};

/// A page's JSON stays under this (with room for the envelope under 128 KiB).
pub const PAGE_BYTES: usize = 96 * 1024;
pub const MAX_LIMIT: u64 = 1000;

/// What a page asks for: `prefix?`, `after?` (the previous page's `next`), `limit?` (1-1000),
/// `formats?` (default true: the request and response schemas).
#[derive(Debug, Clone, PartialEq)]
pub struct PageRequest {
    pub prefix: Option<String>,
    pub after: Option<String>,
    pub limit: u64,
    pub formats: bool,
}

impl PageRequest {
    pub fn parse(data: &Value) -> Result<Self, ErrorBody> {
        let limit = match opt_u64(data, "limit")? {
            None => MAX_LIMIT,
            Some(n) if (1..=MAX_LIMIT).contains(&n) => n,
            Some(n) => {
                return Err(ErrorBody::invalid(format!(
                    "`limit` must be 1 to {MAX_LIMIT}, not {n}"
                )));
            }
        };
        let formats = opt_bool(data, "formats")?.unwrap_or(true);
        Ok(Self {
            prefix: opt_str(data, "prefix")?,
            after: opt_str(data, "after")?,
            limit,
            formats,
        })
    }
}

/// `functions`: every registered function, sorted by `function_id`; `data`: the request
/// ([`PageRequest`]).
pub fn functions_page(functions: Vec<Value>, data: &Value) -> Result<Value, ErrorBody> {
    Ok(page(functions, &PageRequest::parse(data)?))
}

/// One page of `functions` (sorted by `function_id`; those before `after` or outside `prefix`
/// are skipped, so a caller may pass only the ones that can be on it, plus one to know
/// whether a next page exists).
pub fn page(functions: Vec<Value>, req: &PageRequest) -> Value {
    let mut page = Vec::new();
    let mut bytes = 0;
    let mut next = None;
    let eligible = functions.into_iter().filter(|f| {
        let id = f["function_id"].as_str().unwrap_or("");
        req.prefix.as_deref().is_none_or(|p| id.starts_with(p))
            && req.after.as_deref().is_none_or(|a| id > a)
    });
    for mut f in eligible {
        if !req.formats
            && let Some(o) = f.as_object_mut()
        {
            o.remove("request_format");
            o.remove("response_format");
        }
        let size = f.to_string().len() + 1;
        // At least one per page, so paging always moves on.
        if !page.is_empty() && (page.len() as u64 >= req.limit || bytes + size > PAGE_BYTES) {
            next = page
                .last()
                .and_then(|l: &Value| l["function_id"].as_str())
                .map(str::to_owned);
            break;
        }
        bytes += size;
        page.push(f);
    }
    let mut out = json!({ "functions": page });
    if let Some(n) = next {
        out["next"] = json!(n);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn functions(n: usize, schema_bytes: usize) -> Vec<Value> {
        (0..n)
            .map(|i| json!({"function_id": format!("ns::f{i:04}"), "request_format": {"x": "y".repeat(schema_bytes)}}))
            .collect()
    }

    #[test]
    fn pages_stay_under_the_budget_and_cover_everything_once() {
        let all = functions(300, 1000);
        let mut seen = Vec::new();
        let mut after: Option<String> = None;
        for _ in 0..10 {
            let page = functions_page(all.clone(), &json!({"after": after})).unwrap();
            assert!(page.to_string().len() < PAGE_BYTES + 1024, "a page fits");
            for f in page["functions"].as_array().unwrap() {
                seen.push(f["function_id"].as_str().unwrap().to_string());
            }
            match page["next"].as_str() {
                Some(n) => after = Some(n.to_string()),
                None => break,
            }
        }
        let want: Vec<String> = all
            .iter()
            .map(|f| f["function_id"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(seen, want);
    }

    #[test]
    fn prefix_limit_formats_and_bad_fields() {
        let all = functions(20, 10);
        let p = functions_page(all.clone(), &json!({"limit": 5, "formats": false})).unwrap();
        assert_eq!(p["functions"].as_array().unwrap().len(), 5);
        assert_eq!(p["next"], "ns::f0004");
        assert!(p["functions"][0].get("request_format").is_none());
        let p = functions_page(all.clone(), &json!({"prefix": "ns::f001"})).unwrap();
        assert_eq!(p["functions"].as_array().unwrap().len(), 10);
        assert!(p.get("next").is_none());
        for bad in [
            json!({"limit": 0}),
            json!({"limit": 5000}),
            json!({"formats": "yes"}),
            json!({"after": 3}),
        ] {
            assert!(functions_page(all.clone(), &bad).is_err(), "{bad}");
        }
    }
}
