//! Lambda event filtering, as an event-source mapping applies its `FilterCriteria` before it
//! invokes the function (<https://docs.aws.amazon.com/lambda/latest/dg/invocation-eventfiltering.html>).
//! The emulated mappings ([`crate::mappings`]) drop what the template's patterns do not pass,
//! so the functions see, and the benches count, what they would see on AWS.
//!
//! A pattern is a JSON object shaped like the record: nested objects name fields, a list at a
//! leaf holds the rules, any of which may match (OR), every field must match (AND), and `$or`
//! takes alternatives. The rules are the ones the Lambda guide documents: a literal (string,
//! number, `true`/`false`, `null`; `""` is the empty string), `equals-ignore-case`, `prefix`,
//! `suffix` (each also `{"equals-ignore-case": …}`), `anything-but` (a literal or a list of
//! them, or `{"prefix" | "suffix" | "equals-ignore-case": …}`), `numeric` (`=`, or one or two
//! bounds of `<`, `<=`, `>`, `>=`) and `exists`. Where the event holds a list, a rule matches
//! if it matches one of its elements. A rule other than `exists: false` needs the field to be
//! there, `anything-but` included; `anything-but` passes a value of another type (a number
//! or `null` is anything but the string named).
//!
//! Anything else is refused when the mapping is read, with the filter, the field and the rule
//! named: a template our emulation would read differently from AWS fails here, not quietly.
//! Bounds are AWS's: at most 10 filters (5 by default, 10 by quota), 4 096 bytes each.

use bus::protocol::kind_of;
use serde_json::{Map, Value};
use thiserror::Error;

/// AWS's ceiling on filters per mapping (the default quota is 5; 10 on request).
pub const MAX_FILTERS: usize = 10;
/// AWS's ceiling on one pattern's length.
pub const MAX_PATTERN_BYTES: usize = 4096;
/// How deep a pattern may nest (our bound: it keeps matching's recursion shallow).
const MAX_DEPTH: usize = 32;

#[derive(Debug, Error, PartialEq)]
pub enum FilterError {
    #[error("{count} filters: a mapping takes at most {MAX_FILTERS}")]
    TooMany { count: usize },
    #[error("filter {index}: {bytes} bytes; a pattern takes at most {MAX_PATTERN_BYTES}")]
    TooLong { index: usize, bytes: usize },
    #[error("filter {index}: not JSON: {reason}")]
    NotJson { index: usize, reason: String },
    #[error("filter {index}: at {at}: {what}")]
    Invalid {
        index: usize,
        at: String,
        what: String,
    },
}

/// The filters of one mapping. None at all passes every record, as on AWS.
#[derive(Debug, Clone, Default)]
pub struct FilterCriteria {
    patterns: Vec<Object>,
}

impl FilterCriteria {
    /// Reads a mapping's `Filters[].Pattern` strings.
    pub fn parse<S: AsRef<str>>(patterns: &[S]) -> Result<Self, FilterError> {
        if patterns.len() > MAX_FILTERS {
            return Err(FilterError::TooMany {
                count: patterns.len(),
            });
        }
        let mut parsed = Vec::with_capacity(patterns.len());
        for (index, p) in patterns.iter().enumerate() {
            let p = p.as_ref();
            if p.len() > MAX_PATTERN_BYTES {
                return Err(FilterError::TooLong {
                    index,
                    bytes: p.len(),
                });
            }
            let v: Value = serde_json::from_str(p).map_err(|e| FilterError::NotJson {
                index,
                reason: e.to_string(),
            })?;
            let fail = |at: &str, what: String| FilterError::Invalid {
                index,
                at: if at.is_empty() {
                    "the top".into()
                } else {
                    at.into()
                },
                what,
            };
            let Value::Object(o) = &v else {
                return Err(fail("", "a pattern is a JSON object".into()));
            };
            parsed.push(Object::parse(o, "", 0).map_err(|(at, what)| fail(&at, what))?);
        }
        Ok(Self { patterns: parsed })
    }

    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// Whether `record` reaches the function: no filters, or any one of them matches.
    pub fn passes(&self, record: &Value) -> bool {
        self.patterns.is_empty() || self.patterns.iter().any(|p| p.matches(Some(record)))
    }
}

type ParseError = (String, String);

#[derive(Debug, Clone)]
struct Object {
    fields: Vec<(String, Field)>,
    /// `$or` groups: each needs one of its alternatives to match.
    ors: Vec<Vec<Object>>,
}

#[derive(Debug, Clone)]
enum Field {
    Nested(Object),
    Rules(Vec<Rule>),
}

#[derive(Debug, Clone)]
enum Rule {
    Literal(Value),
    EqualsIgnoreCase(String),
    Prefix(String, bool),
    Suffix(String, bool),
    AnythingBut(Vec<Value>),
    AnythingButPrefix(Vec<String>),
    AnythingButSuffix(Vec<String>),
    AnythingButIgnoreCase(Vec<String>),
    Numeric(Vec<(Cmp, f64)>),
    Exists(bool),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Cmp {
    Eq,
    Lt,
    Le,
    Gt,
    Ge,
}

fn join(at: &str, key: &str) -> String {
    if at.is_empty() {
        key.to_string()
    } else {
        format!("{at}.{key}")
    }
}

impl Object {
    fn parse(o: &Map<String, Value>, at: &str, depth: usize) -> Result<Self, ParseError> {
        if depth > MAX_DEPTH {
            return Err((at.into(), format!("nested more than {MAX_DEPTH} levels")));
        }
        if o.is_empty() {
            return Err((
                at.into(),
                "an empty object matches nothing to filter on".into(),
            ));
        }
        let mut out = Object {
            fields: vec![],
            ors: vec![],
        };
        for (key, v) in o {
            let here = join(at, key);
            if key == "$or" {
                let Value::Array(alts) = v else {
                    return Err((
                        here,
                        format!("`$or` takes a list of patterns, got {}", kind_of(v)),
                    ));
                };
                if alts.len() < 2 {
                    return Err((here, "`$or` takes at least two patterns".into()));
                }
                let mut group = vec![];
                for (i, alt) in alts.iter().enumerate() {
                    let Value::Object(a) = alt else {
                        return Err((
                            format!("{here}[{i}]"),
                            format!("an alternative is a pattern object, got {}", kind_of(alt)),
                        ));
                    };
                    group.push(Object::parse(a, at, depth + 1)?);
                }
                out.ors.push(group);
                continue;
            }
            let field = match v {
                Value::Object(child) => Field::Nested(Object::parse(child, &here, depth + 1)?),
                Value::Array(rules) if rules.is_empty() => {
                    return Err((here, "a field's rule list is empty".into()));
                }
                Value::Array(rules) => Field::Rules(
                    rules
                        .iter()
                        .map(|r| Rule::parse(r, &here))
                        .collect::<Result<_, _>>()?,
                ),
                other => {
                    return Err((
                        here,
                        format!(
                            "a field's rules are a list (`[{other}]` to match the value), got {}",
                            kind_of(other)
                        ),
                    ));
                }
            };
            out.fields.push((key.clone(), field));
        }
        Ok(out)
    }

    /// `event` is the value at this object's place in the record (None: not there).
    fn matches(&self, event: Option<&Value>) -> bool {
        self.fields.iter().all(|(key, field)| {
            let child = match event {
                Some(Value::Object(m)) => m.get(key),
                _ => None,
            };
            match field {
                Field::Nested(o) => match child {
                    Some(Value::Array(items)) => items.iter().any(|i| o.matches(Some(i))),
                    other => o.matches(other),
                },
                Field::Rules(rules) => {
                    let mut values = vec![];
                    leaves(child, &mut values);
                    rules.iter().any(|r| r.matches(child.is_some(), &values))
                }
            }
        }) && self
            .ors
            .iter()
            .all(|group| group.iter().any(|alt| alt.matches(event)))
    }
}

/// The values a rule is tried on: the field's value, or each element of a list at it.
fn leaves<'a>(v: Option<&'a Value>, out: &mut Vec<&'a Value>) {
    match v {
        None => {}
        Some(Value::Array(items)) => items.iter().for_each(|i| leaves(Some(i), out)),
        Some(v) => out.push(v),
    }
}

fn string_or_strings(v: &Value, at: &str, op: &str) -> Result<Vec<String>, ParseError> {
    match v {
        Value::String(s) => Ok(vec![s.clone()]),
        Value::Array(items) if !items.is_empty() => items
            .iter()
            .map(|i| match i {
                Value::String(s) => Ok(s.clone()),
                other => Err((
                    at.to_string(),
                    format!("`{op}` takes strings, got {}", kind_of(other)),
                )),
            })
            .collect(),
        other => Err((
            at.to_string(),
            format!(
                "`{op}` takes a string or a list of strings, got {}",
                kind_of(other)
            ),
        )),
    }
}

/// `"x"` or `{"equals-ignore-case": "x"}` (prefix and suffix) → (text, ignore case).
fn affix(v: &Value, at: &str, op: &str) -> Result<(String, bool), ParseError> {
    match v {
        Value::String(s) => Ok((s.clone(), false)),
        Value::Object(m) if m.len() == 1 => match m.get("equals-ignore-case") {
            Some(Value::String(s)) => Ok((s.to_lowercase(), true)),
            _ => Err((
                at.to_string(),
                format!("`{op}` takes a string or {{\"equals-ignore-case\": string}}"),
            )),
        },
        other => Err((
            at.to_string(),
            format!("`{op}` takes a string, got {}", kind_of(other)),
        )),
    }
}

impl Rule {
    fn parse(r: &Value, at: &str) -> Result<Self, ParseError> {
        let at = at.to_string();
        let m = match r {
            Value::Object(m) => m,
            Value::Array(_) => {
                return Err((
                    at,
                    "a rule list holds values and rule objects, not lists".into(),
                ));
            }
            literal => return Ok(Rule::Literal(literal.clone())),
        };
        if m.len() != 1 {
            return Err((
                at,
                format!(
                    "a rule object has exactly one operator, got {} ({})",
                    m.len(),
                    m.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            ));
        }
        let (op, v) = m.iter().next().expect("one entry");
        Ok(match op.as_str() {
            "exists" => match v {
                Value::Bool(b) => Rule::Exists(*b),
                other => {
                    return Err((
                        at,
                        format!("`exists` takes true or false, got {}", kind_of(other)),
                    ));
                }
            },
            "prefix" => {
                let (s, ic) = affix(v, &at, op)?;
                Rule::Prefix(s, ic)
            }
            "suffix" => {
                let (s, ic) = affix(v, &at, op)?;
                Rule::Suffix(s, ic)
            }
            "equals-ignore-case" => match v {
                Value::String(s) => Rule::EqualsIgnoreCase(s.to_lowercase()),
                other => {
                    return Err((
                        at,
                        format!(
                            "`equals-ignore-case` takes a string, got {}",
                            kind_of(other)
                        ),
                    ));
                }
            },
            "anything-but" => match v {
                Value::Object(inner) if inner.len() == 1 => {
                    let (iop, iv) = inner.iter().next().expect("one entry");
                    let list = string_or_strings(iv, &at, &format!("anything-but {iop}"))?;
                    match iop.as_str() {
                        "prefix" => Rule::AnythingButPrefix(list),
                        "suffix" => Rule::AnythingButSuffix(list),
                        "equals-ignore-case" => Rule::AnythingButIgnoreCase(
                            list.into_iter().map(|s| s.to_lowercase()).collect(),
                        ),
                        other => {
                            return Err((
                                at,
                                format!(
                                    "`anything-but` takes a value, a list, or one of prefix, suffix, equals-ignore-case; not `{other}`"
                                ),
                            ));
                        }
                    }
                }
                Value::Object(_) => {
                    return Err((at, "`anything-but` takes one operator in its object".into()));
                }
                Value::Array(items) if !items.is_empty() => {
                    if let Some(bad) = items
                        .iter()
                        .find(|i| !matches!(i, Value::String(_) | Value::Number(_)))
                    {
                        return Err((
                            at,
                            format!(
                                "`anything-but` lists strings or numbers, got {}",
                                kind_of(bad)
                            ),
                        ));
                    }
                    Rule::AnythingBut(items.clone())
                }
                Value::String(_) | Value::Number(_) => Rule::AnythingBut(vec![v.clone()]),
                other => {
                    return Err((
                        at,
                        format!(
                            "`anything-but` takes a string, a number or a list of them, got {}",
                            kind_of(other)
                        ),
                    ));
                }
            },
            "numeric" => Rule::Numeric(numeric(v, &at)?),
            other => {
                return Err((
                    at,
                    format!(
                        "unknown or unsupported operator `{other}` (Lambda filters take exists, prefix, suffix, equals-ignore-case, anything-but, numeric)"
                    ),
                ));
            }
        })
    }

    /// `present`: whether the field is in the record; `values`: its value(s) to try.
    fn matches(&self, present: bool, values: &[&Value]) -> bool {
        let any = |f: &dyn Fn(&Value) -> bool| values.iter().any(|v| f(v));
        let any_str = |f: &dyn Fn(&str) -> bool| any(&|v| v.as_str().is_some_and(f));
        match self {
            Rule::Exists(want) => present == *want,
            Rule::Literal(l) => any(&|v| literal_eq(l, v)),
            Rule::EqualsIgnoreCase(s) => any_str(&|v| v.to_lowercase() == *s),
            Rule::Prefix(p, false) => any_str(&|v| v.starts_with(p.as_str())),
            Rule::Prefix(p, true) => any_str(&|v| v.to_lowercase().starts_with(p.as_str())),
            Rule::Suffix(p, false) => any_str(&|v| v.ends_with(p.as_str())),
            Rule::Suffix(p, true) => any_str(&|v| v.to_lowercase().ends_with(p.as_str())),
            // A value of another type (a number, `null`) is "anything but" a string.
            Rule::AnythingBut(not) => any(&|v| !not.iter().any(|n| literal_eq(n, v))),
            Rule::AnythingButPrefix(ps) => any(&|v| {
                v.as_str()
                    .is_none_or(|v| !ps.iter().any(|p| v.starts_with(p.as_str())))
            }),
            Rule::AnythingButSuffix(ps) => any(&|v| {
                v.as_str()
                    .is_none_or(|v| !ps.iter().any(|p| v.ends_with(p.as_str())))
            }),
            Rule::AnythingButIgnoreCase(ss) => any(&|v| {
                v.as_str()
                    .is_none_or(|v| !ss.iter().any(|s| v.to_lowercase() == *s))
            }),
            Rule::Numeric(bounds) => any(&|v| {
                v.as_f64().is_some_and(|x| {
                    bounds.iter().all(|(c, n)| match c {
                        Cmp::Eq => x == *n,
                        Cmp::Lt => x < *n,
                        Cmp::Le => x <= *n,
                        Cmp::Gt => x > *n,
                        Cmp::Ge => x >= *n,
                    })
                })
            }),
        }
    }
}

/// A literal rule against a value: strings and booleans exactly, numbers by value (`5` is
/// `5.0`), `null` only a JSON null.
fn literal_eq(rule: &Value, v: &Value) -> bool {
    match (rule, v) {
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (a, b) => a == b,
    }
}

fn numeric(v: &Value, at: &str) -> Result<Vec<(Cmp, f64)>, ParseError> {
    let bad = |what: &str| Err((at.to_string(), format!("`numeric` {what}")));
    let Value::Array(items) = v else {
        return bad("takes a list like [\">\", 0, \"<=\", 5]");
    };
    if items.is_empty() || items.len() % 2 != 0 || items.len() > 4 {
        return bad("takes one or two (operator, number) pairs");
    }
    let mut out = vec![];
    for pair in items.chunks(2) {
        let cmp = match pair[0].as_str() {
            Some("=") => Cmp::Eq,
            Some("<") => Cmp::Lt,
            Some("<=") => Cmp::Le,
            Some(">") => Cmp::Gt,
            Some(">=") => Cmp::Ge,
            _ => return bad(&format!("operators are =, <, <=, >, >=; got {}", pair[0])),
        };
        let Some(n) = pair[1].as_f64() else {
            return bad(&format!("compares with numbers, got {}", kind_of(&pair[1])));
        };
        out.push((cmp, n));
    }
    if out.len() == 2 {
        let lower = |c: Cmp| matches!(c, Cmp::Gt | Cmp::Ge);
        let upper = |c: Cmp| matches!(c, Cmp::Lt | Cmp::Le);
        if !(lower(out[0].0) && upper(out[1].0) || upper(out[0].0) && lower(out[1].0)) {
            return bad("with two pairs is a range: one lower bound (>, >=) and one upper (<, <=)");
        }
    }
    Ok(out)
}

#[cfg(test)]
#[path = "filter_tests.rs"]
mod tests;
